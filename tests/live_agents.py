"""Real contributor agents (sandboxed task processes) in this test process, for tests that run
them against a live server: a fixed quick benchmark instead of measuring this machine."""

from __future__ import annotations

from pathlib import Path

from desktop.agent import Agent
from desktop.bench_result import BenchmarkResult
from desktop.client import Backoff
from desktop.config import Credentials, Paths, Settings
from desktop.hardware import detect
from marketplace.nodes.enrollment import create_enrollment_token


def live_agent(
    tmp: Path, name: str, url: str, key: str, monkeypatch, *, kind: str = "platform",
    price: str = "0.40", fp32_tflops: float = 0.1, transport=None, **settings_extra: object,
) -> Agent:  # fmt: skip
    monkeypatch.setenv("GPUFLEX_KEYRING", "file")
    for folder in ("CONFIG", "DATA", "CACHE"):
        monkeypatch.setenv(f"GPUFLEX_NODE_{folder}_DIR", str(tmp / name / folder.lower()))
    paths = Paths.default()
    Credentials(paths).set_provider_key(key)
    # a platform node is enrolled as an operator enrolls one: with a one-use token
    token = create_enrollment_token(operator=None)[1] if kind == "platform" else ""
    settings = Settings(server_url=url, node_name=name, kind=kind, task_wall_s=300,
                        task_memory_mb=4096, first_run_done=True,
                        price_per_gpu_hour=price, enrollment_token=token,
                        **settings_extra)  # type: ignore[arg-type]  # fmt: skip
    hw = detect()
    bench = BenchmarkResult(
        fingerprint=hw.fingerprint(), device="cpu", device_name=hw.cpu_name, quick=True,
        matmul_tflops={"fp32": fp32_tflops}, memory_gbps=5.0, h2d_gbps=None, d2h_gbps=None,
        train_samples_per_s={"mlp": 20000.0},
    )  # fmt: skip
    backoff = Backoff(base_s=0.1, cap_s=1.0, attempts=8)
    return Agent(settings, paths, bench=bench, backoff=backoff, claim_wait_s=1,
                 idle_sleep_s=0.2, transport=transport)  # type: ignore[arg-type]  # fmt: skip
