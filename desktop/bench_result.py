"""A node's measured figures (`BenchmarkResult`) and their cache, without torch.

The agent, the tray app and the marketplace's tests read and advertise these figures; only
measuring them (desktop.benchmark, in a child process: desktop.probe) needs torch.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from desktop.hardware import HardwareReport

BENCH_VERSION = 1


@dataclass
class BenchmarkResult:
    fingerprint: str
    device: str  # "cuda:0", "mps", "cpu"
    device_name: str
    quick: bool
    matmul_tflops: dict[str, float | None]  # fp32/fp16/bf16; None when the dtype is unsupported
    memory_gbps: float
    h2d_gbps: float | None  # None on the CPU, where there is no separate device memory
    d2h_gbps: float | None
    train_samples_per_s: dict[str, float]  # reference model -> training samples per second
    peak_ratio: dict[str, float] = field(default_factory=dict)  # measured / published peak
    peak_source: str = ""
    duration_s: float = 0.0
    version: int = BENCH_VERSION
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkResult:
        return cls(**data)

    def scaled(self, factor: float) -> BenchmarkResult:
        """The figures of a device `factor` times as fast (a simulated GPU for demos)."""

        def f(v: float | None) -> float | None:
            return None if v is None else v * factor

        return replace(
            self,
            matmul_tflops={k: f(v) for k, v in self.matmul_tflops.items()},
            memory_gbps=self.memory_gbps * factor,
            h2d_gbps=f(self.h2d_gbps),
            d2h_gbps=f(self.d2h_gbps),
            train_samples_per_s={k: v * factor for k, v in self.train_samples_per_s.items()},
            device_name=f"{self.device_name} (simulated x{factor:.2g})",
        )

    def advertised(self) -> dict[str, Any]:
        """The figures a node registers with (the API's `benchmark` object)."""
        return {
            "device": self.device_name,
            "fp32_tflops": self.matmul_tflops.get("fp32"),
            "fp16_tflops": self.matmul_tflops.get("fp16"),
            "bf16_tflops": self.matmul_tflops.get("bf16"),
            "memory_gbps": self.memory_gbps,
            "h2d_gbps": self.h2d_gbps,
            "d2h_gbps": self.d2h_gbps,
            "train_samples_per_s": self.train_samples_per_s,
            "peak_ratio": self.peak_ratio,
        }

    def summary(self) -> str:
        def fmt(v: float | None, unit: str) -> str:
            return "n/a" if v is None else f"{v:,.4g} {unit}"

        lines = [f"device      {self.device_name} ({self.device}{', quick' if self.quick else ''})"]
        for dt, v in self.matmul_tflops.items():
            ratio = self.peak_ratio.get(dt)
            tail = f"  ({ratio:.0%} of published peak)" if ratio is not None else ""
            lines.append(f"matmul {dt:<5}{fmt(v, 'TFLOP/s')}{tail}")
        lines.append(f"memory      {fmt(self.memory_gbps, 'GB/s')}")
        lines.append(f"host→dev    {fmt(self.h2d_gbps, 'GB/s')}")
        lines.append(f"dev→host    {fmt(self.d2h_gbps, 'GB/s')}")
        for model, sps in self.train_samples_per_s.items():
            lines.append(f"train {model:<12}{sps:,.0f} samples/s")
        return "\n".join(lines)


def _cache_file(cache_dir: Path) -> Path:
    return cache_dir / "benchmark.json"


def load_cached(
    cache_dir: Path, hw: HardwareReport, quick: bool | None = None
) -> BenchmarkResult | None:
    """The cached result for this exact hardware; a full run also satisfies a quick request."""
    try:
        data = json.loads(_cache_file(cache_dir).read_text(encoding="utf-8"))
        result = BenchmarkResult.from_dict(data)
    except (OSError, ValueError, TypeError):
        return None
    if result.version != BENCH_VERSION or result.fingerprint != hw.fingerprint():
        return None
    if quick is False and result.quick:
        return None
    if not all(math.isfinite(v) for v in result.train_samples_per_s.values()):
        return None
    return result


def save_cached(cache_dir: Path, result: BenchmarkResult) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = _cache_file(cache_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
    tmp.replace(_cache_file(cache_dir))
