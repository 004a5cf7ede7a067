"""Shared fixtures: every test gets its own config/data/cache folders and a file keyring."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["GPUFLEX_KEYRING"] = "file"  # never touch the developer's real keyring
sys.path.insert(0, str(Path(__file__).parent))  # fake_marketplace

import pytest
from fake_marketplace import PROVIDER_KEY, FakeMarketplace

from desktop.bench_result import BenchmarkResult
from desktop.config import Credentials, Paths, Settings
from desktop.hardware import HardwareReport, detect
from tests.desktop.sandboxed import task_start  # noqa: F401  (a fixture, cold and warm)


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    monkeypatch.setenv("GPUFLEX_NODE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("GPUFLEX_NODE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GPUFLEX_NODE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return Paths.default()


@pytest.fixture(scope="session")
def hardware() -> HardwareReport:
    return detect()


@pytest.fixture
def fake_bench(hardware: HardwareReport) -> BenchmarkResult:
    """Stands in for a real benchmark where a test is about something else."""
    return BenchmarkResult(
        fingerprint=hardware.fingerprint(), device="cpu", device_name=hardware.cpu_name,
        quick=True, matmul_tflops={"fp32": 0.1, "fp16": 0.01, "bf16": 0.05},
        memory_gbps=5.0, h2d_gbps=None, d2h_gbps=None, train_samples_per_s={"mlp": 1000.0},
    )  # fmt: skip


@pytest.fixture
def market() -> Iterator[FakeMarketplace]:
    with FakeMarketplace() as m:
        yield m


@pytest.fixture
def logged_in(market: FakeMarketplace, isolated_dirs: Paths) -> Settings:
    """Settings pointing at the fake marketplace, with the provider key stored."""
    Credentials(isolated_dirs).set_provider_key(PROVIDER_KEY)
    return Settings(server_url=market.url, node_name="test-node", task_wall_s=120,
                    task_memory_mb=4096, first_run_done=True)  # fmt: skip
