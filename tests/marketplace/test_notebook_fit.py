"""Client.fit (marketplace/notebook.py): a buyer's module, loss, example batch and tensors
in, exported, uploaded, submitted, trained by real agents, and the module trained back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from marketplace.client import Client
from marketplace.jobs.models import Job
from marketplace.notebook import FitResult, RoundResult, dataset_section, fit_spec
from tests.live_agents import live_agent
from trainer.datasets import load_dataset
from trainer.spec import DatasetSpec, parse_spec


def test_dataset_and_spec_sections(tmp_path: Path) -> None:
    x, y = torch.randn(10, 4), torch.arange(10) % 2
    assert dataset_section((x, y), tmp_path) == {"kind": "npz", "path": "dataset.npz"}
    assert (tmp_path / "dataset.npz").is_file()
    assert dataset_section("digits", tmp_path) == {"kind": "digits"}
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    assert dataset_section(tmp_path / "imgs", tmp_path)["kind"] == "image_folder"
    with pytest.raises(ValueError, match="10 inputs but 3 targets"):
        dataset_section((x, y[:3]), tmp_path)
    spec = fit_spec("n", {"kind": "digits"}, {"local": {"steps": 3}, "rounds": {"max_rounds": 2},
                                             "model": {"arch": "mlp"}})  # fmt: skip
    parsed = parse_spec(spec)  # one parse of the spec, as the server's
    assert parsed.model.arch == "exported" and parsed.local.steps == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("own_media")
def test_fit_trains_a_module_on_real_agents(live_server, make_user, tmp_path, monkeypatch) -> None:
    data = load_dataset(DatasetSpec(), seed=0)
    x, y = data.x_train[:600], data.y_train[:600]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    _, buyer_key = make_user("buyer")
    _, provider_key = make_user("provider")
    agents = [live_agent(tmp_path, f"agent-{i}", live_server.url, provider_key, monkeypatch)
              for i in range(2)]  # fmt: skip
    for agent in agents:
        agent.start()
    out: dict[str, FitResult] = {}
    try:
        with Client(live_server.url, buyer_key) as client:
            spec = {
                "local": {"steps": 10, "batch_size": 32},
                "rounds": {"max_rounds": 2},
                "sharding": {"num_shards": 2},
                "optimizer": {"name": "adam", "lr": 0.01},
            }
            worker = threading.Thread(target=lambda: out.update(result=client.fit(
                net, F.cross_entropy, (x[:8], y[:8]), (x, y), budget="20", tier="platform",
                spec=spec, progress=False, interval=0.2)))  # fmt: skip
            worker.start()
            end = time.monotonic() + 300  # guards against hanging only
            while worker.is_alive() and time.monotonic() < end:
                worker.join(0.2)
    finally:
        for agent in agents:
            agent.stop()
    result = out["result"]
    assert isinstance(result, FitResult) and result.status == "completed"
    assert result.model is net and all(isinstance(r, RoundResult) for r in result.rounds)
    assert [r.number for r in result.rounds] == [1, 2] and result.accuracy is not None
    assert not torch.equal(net.state_dict()["0.weight"], before["0.weight"])  # trained weights
    job = Job.objects.get(pk=result.job_id)
    assert job.spec["model"] == {**job.spec["model"], "arch": "exported", "program": "program.pt2"}
    assert job.spec["dataset"]["kind"] == "npz"
