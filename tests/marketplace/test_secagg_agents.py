"""Secure aggregation through the real marketplace and real contributor agents: five silos
train a federated job whose updates the server may only sum; one of the five (20 %) drops off
the network right after sending its key shares, mid-round. The job completes, its model moved
by the survivors' mean (within quantization), and neither the server's log nor its stored files
hold any node's update."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from django.conf import settings

import desktop.secagg_client as secagg_client
from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.jobs.models_io import load_model_file
from marketplace.nodes.models import Node
from marketplace.rounds.models import Round, SecAggRound, TaskResult
from tests.live_agents import live_agent
from tests.marketplace.test_federated import FEDERATED_SPEC
from tests.marketplace.test_federated_agents import _wait, write_silos
from trainer.secagg import field as gf
from trainer.secagg.vectors import decode_masked, flatten
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

SILOS = 5
SECAGG_SPEC = FEDERATED_SPEC | {
    "rounds": {"max_rounds": 1, "quorum": 0.8},
    "privacy": {"secure_aggregation": {"enabled": True, "setup_s": 60}},
}


class DropsAfterSharing(httpx.HTTPTransport):
    """A node that vanishes from the network once its shares are in: every later request
    fails to connect, as for a machine that lost power mid-round."""

    def __init__(self) -> None:
        super().__init__()
        self.gone = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.gone.is_set():
            raise httpx.ConnectError("this node dropped out", request=request)
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/secagg/shares"):
            self.gone.set()
        return response


def _server_side(record: logging.LogRecord) -> bool:
    return not record.name.startswith(("gpuflex.agent", "desktop", "httpx", "httpcore"))


def _snippets(vector: np.ndarray) -> list[str]:
    """Ways a run of an update's values could be written into a log line."""
    run = vector[100:106]
    return [", ".join(f"{v:.{p}f}" for v in run) for p in (3, 4, 6)] + [
        " ".join(f"{v:.4f}" for v in run), repr(run.astype(np.float32).tolist())[1:40]
    ]  # fmt: skip


def test_secure_aggregation_survives_a_dropout_and_the_server_sees_only_the_sum(
    live_server, make_user, submit, tmp_path, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    _, provider_key = make_user("provider")
    write_silos(tmp_path, SILOS)
    plain: dict[str, np.ndarray] = {}  # task id -> the update as the node trained it
    original = secagg_client.SecAggSession.masked_update

    def recording(self, data: bytes) -> bytes:
        plain[self.task_id] = flatten(decode_state(data)[0])
        return original(self, data)

    monkeypatch.setattr(secagg_client.SecAggSession, "masked_update", recording)
    dropper = DropsAfterSharing()
    agents = [
        live_agent(tmp_path, f"silo-{i}", live_server.url, provider_key, monkeypatch,
                   kind="volunteer", transport=dropper if i == SILOS - 1 else None)
        for i in range(SILOS)
    ]  # fmt: skip
    for i, agent in enumerate(agents):
        agent.add_dataset("clinic", str(tmp_path / f"silo{i}.csv"))
    for agent in agents:
        agent.start()
    try:
        _wait(lambda: Node.objects.filter(local_datasets=["clinic"]).count() == SILOS, 120,
              "every silo to advertise its dataset")  # fmt: skip
        job = submit(spec=SECAGG_SPEC, tier="volunteer", federated_dataset="clinic")
        _wait(lambda: Job.objects.get(pk=job["id"]).status in ("completed", "failed"), 240,
              "the job")  # fmt: skip
    finally:
        for agent in agents:
            agent.stop(timeout=10)
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed", done.error
    assert dropper.gone.is_set()  # the fifth node did drop, after sharing its keys
    sa = SecAggRound.objects.get(round__job=done, round__number=1)
    assert len(sa.shared) == SILOS and len(sa.survivors) == SILOS - 1 and len(sa.dropped) == 1
    results = list(TaskResult.objects.filter(task__round__job=done).select_related("task"))
    assert len(results) == SILOS - 1 and all(r.aggregated and r.credited for r in results)

    # the model moved by the survivors' mean, within the field's quantization error
    rnd = Round.objects.get(job=done, number=1)
    before = flatten(load_model_file(rnd.input_model_file))
    after = flatten(load_model_file(done.model_file))
    # each coordinate clipped to the clipping range first, as the protocol defines (the
    # silos' raw pixel values, 0 to 16, give the first layer's weights updates beyond it)
    clip = 8.0  # privacy.secure_aggregation.clipping_range's default
    mean = np.mean([np.clip(plain[str(r.task_id)], -clip, clip) for r in results], axis=0)
    bound = SILOS * gf.quantization_error(SILOS, clip) + 1e-5  # and float32 rounding
    assert np.abs((after - before) - mean).max() <= bound
    assert np.abs(mean).max() > 100 * bound  # a real update, not a no-op the bound hides

    # what the server holds of each node: its masked input, which tells nothing of the update
    for r in results:
        masked = decode_masked(files.get(r.update_file), len(mean))
        signed = np.where(masked > gf.HALF, masked - gf.PRIME, masked).astype(np.float64)
        # ~2,400 weights: independent values correlate within +-0.02 (one standard error)
        assert abs(np.corrcoef(signed, plain[str(r.task_id)])[0, 1]) < 0.15
    job_files = Path(settings.MEDIA_ROOT) / files.job_dir(done.id)
    stored = [p for p in job_files.rglob("*") if p.is_file()]
    assert any(p.name == f"{r.update_hash}.safetensors" for p in stored for r in results)
    for vector in plain.values():
        needle = vector[100:116].astype(np.float32).tobytes()
        assert not any(needle in p.read_bytes() for p in stored)
    # and no server-side log line carries one
    server_lines = [r.getMessage() for r in caplog.records if _server_side(r)]
    assert server_lines  # the server did log (the capture works)
    for vector in plain.values():
        for snippet in _snippets(vector):
            assert not any(snippet in line for line in server_lines)
    logs = [e.message for a in agents[:-1] for e in a.logs(500)]
    assert sum("1 dropped node(s) recovered" in m for m in logs) == SILOS - 1
