"""#20 finding 2: what a node says about itself is validated by typed, bounded schemas
(registration, heartbeats, update metrics, federated sample counts); a bad value is a 4xx
naming the field and nothing is stored; a bad value stored before this breaks nobody else."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
import torch
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from desktop.agent import registration_hardware
from desktop.bench_result import BenchmarkResult
from desktop.config import Settings
from desktop.hardware import GpuInfo, HardwareReport
from desktop.netprobe import NetworkFigures
from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import TaskResult
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC, client_for
from tests.marketplace.test_federated import CLINIC, submit_federated
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db(transaction=True)


def _register(provider: APIClient, **extra: Any) -> Any:
    body = {
        "name": "n",
        "kind": "volunteer",
        "hardware": HARDWARE,
        "price_per_gpu_hour": "0.40",
    } | extra
    return provider.post("/api/v1/nodes/", body, format="json")


def _raw(provider: APIClient, text: str) -> Any:
    """A body the test client's encoder could not write (1e400 parses as infinity)."""
    return provider.post("/api/v1/nodes/", text, content_type="application/json")


def _refused(response: Any, field: str) -> None:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid" and field in body["detail"], body


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"benchmark": {"fp32_tflops": "fast"}}, "benchmark.fp32_tflops"),
        ({"benchmark": {"fp32_tflops": "80"}}, "benchmark.fp32_tflops"),  # a string, even so
        ({"benchmark": {"fp32_tflops": True}}, "benchmark.fp32_tflops"),
        ({"benchmark": {"train_samples_per_s": {"mlp": "many"}}}, "train_samples_per_s"),
        ({"benchmark": {"train_samples_per_s": {f"m{i}": 1 for i in range(99)}}}, "train_"),
        ({"network": {"loss": "abc"}}, "network.loss"),
        ({"network": {"loss": 2}}, "network.loss"),
        ({"network": {"rtt_ms": -1}}, "network.rtt_ms"),
        ({"hardware": {"memory_mb": "inf"}}, "hardware.memory_mb"),
        ({"hardware": {"memory_gb": 1e9}}, "hardware.memory_gb"),
        ({"hardware": {"gpu_model": "x" * 101}}, "hardware.gpu_model"),
        ({"hardware": {"gpus": [{"name": "g"}] * 17}}, "hardware.gpus"),
        ({"hardware": []}, "hardware"),
        ({"availability": {"schedule": ["25:00", "08:00"]}}, "availability.schedule"),
        ({"availability": {"idle_minutes": "soon"}}, "availability.idle_minutes"),
        ({"local_datasets": ["clinic"]}, "local_datasets"),
        ({"local_datasets": [{"name": "clinic", "rows": 1e20}]}, "local_datasets"),
        ({"local_datasets": [{"name": "c", "rows": 5}, {"name": "c", "rows": 6}]}, "local_"),
    ],
)
def test_bad_registration_figures_are_refused_by_name(provider, extra, field) -> None:
    """Before: these were stored as sent; a string fp32_tflops then failed a buyer's
    aggregation on every retry, a string network.loss 500ed every other node's claims."""
    _refused(_register(provider, **extra), field)
    assert not Node.objects.exists()


def test_an_infinite_memory_is_refused_and_the_market_pages_stay_up(make_user) -> None:
    """Before: hardware.memory_mb "inf" was stored though the request 500ed, and from then
    on the capacity and operator node lists 500ed."""
    _, provider_key = make_user("provider")
    _, operator_key = make_user("operator")
    provider = client_for(provider_key)
    body = '{"name": "n", "hardware": {"memory_mb": 1e400}, "price_per_gpu_hour": "0.40"}'
    _refused(_raw(provider, body), "hardware.memory_mb")
    assert not Node.objects.exists()
    assert _register(provider).status_code == 201
    # the database holds the line too, for any writer
    node = Node.objects.get()
    for value in (math.inf, math.nan, -1.0):
        with pytest.raises(IntegrityError), transaction.atomic():
            Node.objects.filter(pk=node.pk).update(memory_gb=value)
    assert provider.get("/api/v1/market/capacity").status_code == 200
    assert client_for(operator_key).get("/api/v1/operator/nodes/").status_code == 200


def test_what_the_real_agent_registers_with_is_accepted(provider) -> None:
    """desktop.agent's registration body, built by its own functions, passes the schemas."""
    gpu = GpuInfo(0, "nvidia", "RTX 4090", 24564, "cuda", "550.54", "GPU-1", "8.9", 41.0, 3.0, 512)
    hw = HardwareReport(
        "AMD Ryzen 9", 16, 32, 65536, "Linux-6.8", "3.12.3", "2.13.0", "12.4", "cuda", [gpu],
        ["a note"],
    )  # fmt: skip
    bench = BenchmarkResult(
        "fp", "cuda:0", "RTX 4090", True, {"fp32": 80.0, "fp16": 160.0, "bf16": None}, 900.0,
        25.0, 24.0, {"mlp": 40000.0, "cnn": 9000.0}, {"fp32": 0.97, "fp16": 0.5},
    )  # fmt: skip
    s = Settings()
    body = {
        "name": "gpu-box",
        "kind": s.kind,
        "hardware": registration_hardware(hw, s, isolated=True),
        "benchmark": bench.advertised(),
        "network": NetworkFigures(rtt_ms=12.5, up_mbps=None, down_mbps=None).to_dict(),
        "price_per_gpu_hour": s.price_per_gpu_hour,
        "availability": {"idle_minutes": 5.0, "schedule": ["", ""], "work_on_battery": False},
    }
    response = provider.post("/api/v1/nodes/", body, format="json")
    assert response.status_code == 201, response.content
    node = Node.objects.get()
    assert node.memory_gb == 23.99 and node.gpu_model == "RTX 4090"
    assert node.hardware["isolation"] == "full"
    assert node.benchmark["train_samples_per_s"] == {"mlp": 40000.0, "cnn": 9000.0}
    assert node.hardware["gpus"][0]["memory_total_mb"] == 24564


def test_bad_heartbeats_are_refused_and_nothing_is_stored(make_agent) -> None:
    agent = make_agent()
    assert agent.heartbeat("idle").status_code == 200
    before = Node.objects.values("metrics", "live_network", "state", "last_heartbeat_at").get()
    for extra, field in [
        ({"metrics": {"gpu_util": "busy"}}, "metrics.gpu_util"),
        ({"metrics": {"gpu_temp_c": 1e6}}, "metrics.gpu_temp_c"),
        ({"network": {"loss": "abc"}}, "network.loss"),
        ({"network": {"up_mbps": -5}}, "network.up_mbps"),
        ({"progress": "half"}, "progress"),
        ({"metrics": []}, "metrics"),
    ]:
        _refused(agent.heartbeat("working", **extra), field)
    after = Node.objects.values("metrics", "live_network", "state", "last_heartbeat_at").get()
    assert after == before


def test_a_bad_network_value_stored_before_validation_breaks_no_other_claim(
    make_agent, submit
) -> None:
    """Before: one node's stored network.loss "abc" made every other node's claims on
    adaptive jobs 500. Now it counts as unreported, for that node too."""
    spoiler, other = make_agent(), make_agent()
    Node.objects.filter(pk=spoiler.node_id).update(
        network={"loss": "abc", "rtt_ms": "far"}, live_network={"up_mbps": [1]}
    )
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    submit(spec=spec, tier="volunteer")
    assert other.claim() is not None
    assert spoiler.claim() is not None


def test_a_bad_benchmark_stored_before_validation_does_not_block_payment(
    make_agent, submit
) -> None:
    """Before: a stored non-numeric fp32_tflops failed the job's aggregation (billing) on
    every retry and left honest nodes unpaid. Now it bills as no benchmark."""
    agent = make_agent(kind="platform")
    Node.objects.filter(pk=agent.node_id).update(benchmark={"fp32_tflops": "fast"})
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 1}}
    job = submit(spec=spec | {"rounds": {"max_rounds": 1}}, tier="platform")
    task = agent.claim()
    assert agent.work(task).status_code == 202
    assert Job.objects.get(pk=job["id"]).status == "completed"
    assert TaskResult.objects.get().credited


def _update_files(job_id: object) -> list[str]:
    folder = f"{files.job_dir(job_id)}/updates"
    return default_storage.listdir(folder)[1] if default_storage.exists(folder) else []


@pytest.mark.parametrize(
    ("samples", "field"),
    [
        (1e12, "samples"),  # halved a job's accuracy as a 40x-weighted update
        (1e20, "samples"),  # a 500 that left an orphan file
        (1798, "samples"),  # one more than the rows the silo declared
        (12.5, "samples"),
        (0, "samples"),
    ],
)
def test_a_federated_sample_count_is_bounded_by_the_declared_rows(
    make_agent, buyer, samples, field
) -> None:
    silo = make_agent(local_datasets=CLINIC)  # 1797 rows
    job = submit_federated(buyer)
    task = silo.claim()
    state, _ = decode_state(silo.model(task["id"]).content)
    update = encode_state({k: torch.zeros_like(v) for k, v in state.items()})
    response = silo.upload(task["id"], update, {"loss": 1.0, "samples": samples})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == f"X-GPUFlex-Metrics.{field}" and field in body["detail"]
    assert not TaskResult.objects.exists() and _update_files(job["id"]) == []
    assert silo.upload(task["id"], update, {"loss": 1.0, "samples": 1797}).status_code == 202


def test_a_silo_without_declared_rows_cannot_weight_its_update(make_agent, buyer) -> None:
    silo = make_agent(local_datasets=CLINIC)
    Node.objects.filter(pk=silo.node_id).update(local_dataset_rows={})  # as stored before
    job = submit_federated(buyer)
    task = silo.claim()
    state, _ = decode_state(silo.model(task["id"]).content)
    update = encode_state({k: torch.zeros_like(v) for k, v in state.items()})
    response = silo.upload(task["id"], update, {"samples": 10})
    assert response.status_code == 400 and response.json()["field"] == "local_datasets"
    assert not TaskResult.objects.exists() and _update_files(job["id"]) == []


def test_update_metrics_out_of_bounds_are_refused(make_agent, submit) -> None:
    agent = make_agent()
    submit(tier="volunteer")
    task = agent.claim()
    payload, metrics = agent.train(task)
    response = agent.upload(task["id"], payload, metrics | {"steps": 1e15})
    assert response.status_code == 400 and "steps" in response.json()["detail"]
    header = json.dumps(metrics | {"loss": "low"})
    response = agent.client.put(
        f"/api/v1/agent/tasks/{task['id']}/update", data=payload,
        content_type="application/octet-stream", HTTP_X_GPUFLEX_METRICS=header,
    )  # fmt: skip
    assert response.status_code == 400 and not TaskResult.objects.exists()
    assert agent.upload(task["id"], payload, metrics).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_bad_figures_stored_before_validation_are_cleaned_by_the_migration() -> None:
    """nodes 0004 drops stored figures no schema would take, so that 0005's constraints
    hold; it runs on the suite's own database and leaves it at the latest state."""
    from decimal import Decimal

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    before = [("nodes", "0003_node_traffic")]
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        old = executor.loader.project_state(before).apps
        owner = old.get_model("accounts", "User").objects.create(username="before-validation")
        old.get_model("nodes", "Node").objects.create(
            owner=owner, name="old", price_per_gpu_hour=Decimal("0.5"), memory_gb=math.inf,
            hardware={"memory_mb": "inf", "gpu_model": "RTX"},
            benchmark={"fp32_tflops": "fast", "train_samples_per_s": {"mlp": "x", "cnn": 5}},
            network={"loss": "abc", "rtt_ms": 20}, live_network={"up_mbps": [1], "loss": 3},
        )  # fmt: skip
    finally:
        MigrationExecutor(connection).migrate(latest)
    node = Node.objects.get(name="old")
    assert node.memory_gb == 0.0 and node.hardware == {"gpu_model": "RTX"}
    assert node.benchmark == {"train_samples_per_s": {"cnn": 5.0}}
    assert node.network == {"rtt_ms": 20.0} and node.live_network == {}


def _redeclare(silo, rows: int) -> None:
    body = {"local_datasets": [{"name": "clinic", "rows": rows}]}
    assert silo.client.put("/api/v1/agent/datasets", body, format="json").status_code == 200


def test_re_declaring_a_silo_mid_round_does_not_raise_its_weight(make_agent, buyer) -> None:
    """#38 finding 10: a node re-declared its dataset with 10^9 rows after taking the lease,
    then uploaded `samples: 1000000000` (201), outweighing every other silo in FedAvg."""
    silo = make_agent(local_datasets=CLINIC)  # 1797 rows when it takes the lease
    job = submit_federated(buyer)
    task = silo.claim()
    _redeclare(silo, 10**9)
    state, _ = decode_state(silo.model(task["id"]).content)
    update = encode_state({k: torch.zeros_like(v) for k, v in state.items()})
    response = silo.upload(task["id"], update, {"loss": 1.0, "samples": 10**9})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "X-GPUFlex-Metrics.samples"
    assert "1797 rows" in response.json()["detail"]
    assert not TaskResult.objects.exists() and _update_files(job["id"]) == []
    assert silo.upload(task["id"], update, {"loss": 1.0, "samples": 1797}).status_code == 202
    assert TaskResult.objects.get().num_samples == 1797


def test_a_silo_that_declared_no_rows_at_its_lease_cannot_declare_them_later(
    make_agent, buyer
) -> None:
    silo = make_agent(local_datasets=CLINIC)
    Node.objects.filter(pk=silo.node_id).update(local_dataset_rows={})  # as stored before
    submit_federated(buyer)
    task = silo.claim()
    _redeclare(silo, 10**9)
    state, _ = decode_state(silo.model(task["id"]).content)
    update = encode_state({k: torch.zeros_like(v) for k, v in state.items()})
    response = silo.upload(task["id"], update, {"samples": 10**9})
    assert response.status_code == 400 and response.json()["field"] == "local_datasets"
    assert not TaskResult.objects.exists()
