"""The `gpuflex` command's buyer side, through the SDK against the real app."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from django.core.wsgi import get_wsgi_application
from django.db import connection

from marketplace import cli
from marketplace.client import Client
from marketplace.jobs.models import Job
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wired(make_user, monkeypatch):
    _, key = make_user("buyer")
    transport = httpx.WSGITransport(app=get_wsgi_application())
    monkeypatch.setattr(
        cli, "build_client", lambda args: Client("http://testserver", key, transport=transport)
    )


def work_in_background(agents) -> threading.Thread:
    """Nodes that pick up the job once it exists, while the CLI follows it."""

    def run() -> None:
        try:
            for agent in agents:
                task = None
                for _ in range(200):
                    if (task := agent.claim(wait=0.1)) is not None:
                        break
                assert task is not None and agent.work(task).status_code == 201
        except BaseException:
            Job.objects.update(status="cancelled")  # ends the CLI's follow; the test fails
            raise
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_submit_follow_jobs_download(wired, make_agent, tmp_path, capsys) -> None:
    import yaml

    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC | {"rounds": {"max_rounds": 1}}))
    thread = work_in_background(agents)
    assert (
        cli.main(
            [
                "submit",
                str(spec),
                "--budget",
                "10",
                "--tier",
                "platform",
                "--follow",
                "--interval",
                "0.2",
            ]
        )
        == 0
    )
    thread.join(timeout=60)
    out = capsys.readouterr()
    job_id = out.out.split()[1]
    assert f"{job_id}: completed after 1 round(s)" in out.out
    assert "round" in out.err  # the tqdm progress bar
    assert cli.main(["jobs"]) == 0
    listing = capsys.readouterr().out
    assert job_id in listing and "completed" in listing and "1/1" in listing
    assert cli.main(["download", job_id, "-o", str(tmp_path)]) == 0
    assert (tmp_path / f"{job_id}.safetensors").stat().st_size > 0
    assert json.loads((tmp_path / f"{job_id}.provenance.json").read_text())["records"]


def test_errors_are_one_readable_line(wired, tmp_path, capsys) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\noptimizer: {lr: -1}\n")
    assert cli.main(["submit", str(spec), "--budget", "10"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.lr" in err and "invalid_spec" in err


def test_submit_an_inference_job_with_a_checkpoint_and_download_its_predictions(
    wired, make_agent, tmp_path, capsys
) -> None:
    import pyarrow.parquet as pq
    import safetensors.torch
    import yaml

    from trainer.models import build_model
    from trainer.spec import ModelSpec

    weights = tmp_path / "mine.safetensors"
    weights.write_bytes(safetensors.torch.save(
        build_model(ModelSpec(hidden=[16]), (64,), 10, seed=7).state_dict()
    ))  # fmt: skip
    spec = tmp_path / "predict.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "predict", "kind": "inference", "dataset": {"kind": "digits"},
        "model": {"arch": "mlp", "hidden": [16], "checkpoint": "mine.safetensors"},
        "sharding": {"num_shards": 3},
    }))  # fmt: skip
    thread = work_in_background([make_agent(kind="platform") for _ in range(3)])
    argv = ["submit", str(spec), "--checkpoint", str(weights), "--budget", "10", "--tier",
            "platform", "--follow", "--interval", "0.2"]  # fmt: skip
    assert cli.main(argv) == 0
    thread.join(timeout=60)
    out = capsys.readouterr().out
    job_id = out.split()[1]
    assert "(predict, inference)" in out and '"rows": 1797' in out
    target = tmp_path / "p.parquet"
    assert cli.main(["predictions", job_id, "-o", str(target)]) == 0
    assert pq.read_table(target).column("row").to_pylist() == list(range(1797))
    assert cli.main(["jobs"]) == 0
    assert "inference" in capsys.readouterr().out
