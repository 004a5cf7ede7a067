"""What this node can do, measured: the figures it advertises on the marketplace.

Matmul TFLOP/s at fp32/fp16/bf16, device memory bandwidth, host<->device copies and training
throughput on the trainer's reference models. Results are cached under the hardware
fingerprint (GPUs, drivers, torch, this app), so a driver update or a new GPU re-runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from desktop.bench_result import BenchmarkResult, load_cached, save_cached
from desktop.hardware import HardwareReport
from trainer.datasets import Dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.spec import parse_spec

# Published dense peaks (vendor datasheets, no sparsity): fp32 and fp16/bf16 TFLOP/s with
# tensor/matrix cores, memory GB/s. Matched against the GPU's name, longest key first.
PEAKS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0, "mem_gbps": 4800.0},
    "H100 PCIe": {"fp32": 51.0, "fp16": 756.0, "bf16": 756.0, "mem_gbps": 2000.0},
    "H100": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0, "mem_gbps": 3350.0},
    "A100-PCIE-40GB": {"fp32": 19.5, "fp16": 312.0, "bf16": 312.0, "mem_gbps": 1555.0},
    "A100": {"fp32": 19.5, "fp16": 312.0, "bf16": 312.0, "mem_gbps": 2039.0},
    "L40S": {"fp32": 91.6, "fp16": 362.0, "bf16": 362.0, "mem_gbps": 864.0},
    "L4": {"fp32": 30.3, "fp16": 121.0, "bf16": 121.0, "mem_gbps": 300.0},
    "A10": {"fp32": 31.2, "fp16": 125.0, "bf16": 125.0, "mem_gbps": 600.0},
    "V100": {"fp32": 15.7, "fp16": 125.0, "mem_gbps": 900.0},
    "T4": {"fp32": 8.1, "fp16": 65.0, "mem_gbps": 320.0},
    # GeForce: fp16/bf16 tensor rate with fp32 accumulation (what torch uses)
    "RTX 4090": {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "mem_gbps": 1008.0},
    "RTX 4080": {"fp32": 48.7, "fp16": 97.5, "bf16": 97.5, "mem_gbps": 717.0},
    "RTX 4070": {"fp32": 29.1, "fp16": 58.3, "bf16": 58.3, "mem_gbps": 504.0},
    "RTX 3090": {"fp32": 35.6, "fp16": 71.0, "bf16": 71.0, "mem_gbps": 936.0},
    "RTX 3080": {"fp32": 29.8, "fp16": 59.5, "bf16": 59.5, "mem_gbps": 760.0},
    "RTX 3060": {"fp32": 12.7, "fp16": 25.4, "bf16": 25.4, "mem_gbps": 360.0},
    "MI300X": {"fp32": 163.4, "fp16": 1307.0, "bf16": 1307.0, "mem_gbps": 5300.0},
    "MI250X": {"fp32": 95.7, "fp16": 383.0, "bf16": 383.0, "mem_gbps": 3277.0},
    "RX 7900 XTX": {"fp32": 61.4, "fp16": 122.8, "bf16": 122.8, "mem_gbps": 960.0},
}


def published_peak(gpu_name: str) -> tuple[str, dict[str, float]] | None:
    for key in sorted(PEAKS, key=len, reverse=True):
        if key.lower() in gpu_name.lower():
            return key, PEAKS[key]
    return None


# ------------------------------------------------------------------------------ timing


class _Timer:
    """Wall time of a callable: CUDA events on a GPU (host time would miss queued kernels),
    a synchronised perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def seconds(self, fn: Callable[[], Any], reps: int) -> float:
        fn()  # warm-up: kernel selection, allocator, lazy init
        self.sync()
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000 / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / reps


# ----------------------------------------------------------------------------- measures


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float | None:
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        s = _Timer(device).seconds(lambda: torch.mm(a, b), reps)
    except (RuntimeError, TypeError):  # dtype not supported on this device
        return None
    return 2 * n**3 / s / 1e12


MATMUL_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def matmul_sizes(device: torch.device) -> tuple[dict[str, int], int]:
    """(matrix side per dtype, repetitions): one setting per kind of device, whatever the
    mode, so that the quick run (the tray's first-run wizard, the agent) and the full one
    (`gpuflex-node bench`) advertise the same figures for the same machine. They differed
    4.5x on one CPU when the quick run timed 256x256 matrices three times and the full one
    1024x1024 ten times: small matrices leave a CPU's vector units and caches half idle."""
    if device.type == "cpu":
        # big enough for a CPU's BLAS to run at its rate (256 measured a quarter of it), small
        # enough for about a second; CPUs emulate fp16 matmul about 100x slower than fp32: a
        # smaller size tells as much
        return {"fp32": 1024, "fp16": 256, "bf16": 1024}, 3
    return {name: 8192 for name in MATMUL_DTYPES}, 10


def matmul_figures(device: torch.device) -> dict[str, float | None]:
    """Matmul TFLOP/s at fp32/fp16/bf16 (None where the device lacks the dtype): the figures
    buyers compare nodes by and billing takes its speed from. The one measurement of them,
    for every caller and mode (see matmul_sizes)."""
    sizes, reps = matmul_sizes(device)
    return {
        name: matmul_tflops(device, dt, sizes[name], reps) for name, dt in MATMUL_DTYPES.items()
    }


def memory_gbps(device: torch.device, nbytes: int, reps: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    s = _Timer(device).seconds(lambda: dst.copy_(src), reps)
    return 2 * nbytes / s / 1e9  # a copy reads and writes every byte


def transfer_gbps(device: torch.device, nbytes: int, reps: int) -> tuple[float, float] | None:
    if device.type == "cpu":
        return None
    pin = device.type == "cuda"
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=pin).fill_(1.0)
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    timer = _Timer(device)
    h2d = timer.seconds(lambda: dev.copy_(host, non_blocking=pin), reps)
    d2h = timer.seconds(lambda: host.copy_(dev, non_blocking=pin), reps)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


# The trainer's reference models: the digits examples' MLP and CNN, and a small byte
# transformer, on synthetic data of the same shapes (no dataset download in a benchmark).
REFERENCE_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": {"arch": "mlp", "hidden": [128]}, "input": (64,), "classes": 10},
    "cnn": {"model": {"arch": "cnn", "channels": [16, 32]}, "input": (64,), "classes": 10},
    "transformer": {
        "model": {"arch": "transformer", "d_model": 64, "n_layers": 2, "n_heads": 4},
        "input": (64,),
        "classes": 256,
        "tokens": True,
    },
}


def train_throughput(device: torch.device, name: str, steps: int, batch: int) -> float:
    ref = REFERENCE_MODELS[name]
    spec = parse_spec({"name": f"bench-{name}", "model": ref["model"], "local": {"steps": steps}})
    n = batch * 4
    gen = torch.Generator().manual_seed(0)
    if ref.get("tokens"):
        x = torch.randint(0, 256, (n, *ref["input"]), generator=gen)
        y = torch.randint(0, 256, (n, *ref["input"]), generator=gen)
        task = "language_model"
    else:
        x = torch.randn((n, *ref["input"]), generator=gen)
        y = torch.randint(0, ref["classes"], (n,), generator=gen)
        task = "classification"
    data = Dataset(
        name="bench", task=task, x_train=x, y_train=y, x_test=x[:1], y_test=y[:1],
        num_classes=ref["classes"], input_shape=ref["input"],
    )  # fmt: skip
    model = build_model(spec.model, ref["input"], ref["classes"]).to(device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_local(model, state, data, spec, seed=0, steps=2, batch_size=batch)  # warm-up
    result = train_local(model, state, data, spec, seed=0, steps=steps, batch_size=batch)
    return steps * batch / max(result.compute_s, 1e-9)


def run_benchmark(
    hw: HardwareReport, quick: bool = False, device: str | None = None
) -> BenchmarkResult:
    from trainer.device import best_device

    dev = best_device(device)
    on_cpu = dev.type == "cpu"
    started = time.perf_counter()
    # the advertised matmul figures: the same measurement in both modes (matmul_figures);
    # --quick saves its time on the memory copies and the training models only
    flops = matmul_figures(dev)
    reps = 3 if quick else 10
    mem_bytes = (16 if quick else 256) * 2**20 if on_cpu else (256 if quick else 2048) * 2**20
    bw = memory_gbps(dev, mem_bytes, reps)
    xfer = transfer_gbps(dev, mem_bytes, reps)
    models = ["mlp"] if quick else list(REFERENCE_MODELS)
    steps = 5 if quick else 50
    train = {m: train_throughput(dev, m, steps, 32 if quick else 128) for m in models}

    gpu = hw.primary_gpu
    name = gpu.name if gpu and not on_cpu else hw.cpu_name
    ratio: dict[str, float] = {}
    source = ""
    peak = published_peak(name) if not on_cpu else None
    if peak:
        source, figures = peak
        ratio = {dt: v / figures[dt] for dt, v in flops.items() if v is not None and dt in figures}
        if "mem_gbps" in figures:
            ratio["memory"] = bw / figures["mem_gbps"]
    return BenchmarkResult(
        fingerprint=hw.fingerprint(),
        device=str(dev) if dev.type != "cuda" else f"cuda:{dev.index or 0}",
        device_name=name,
        quick=quick,
        matmul_tflops=flops,
        memory_gbps=bw,
        h2d_gbps=None if xfer is None else xfer[0],
        d2h_gbps=None if xfer is None else xfer[1],
        train_samples_per_s=train,
        peak_ratio=ratio,
        peak_source=source,
        duration_s=time.perf_counter() - started,
    )


def benchmark(
    hw: HardwareReport, cache_dir: Path, quick: bool = False, force: bool = False
) -> tuple[BenchmarkResult, bool]:
    """(result, from_cache): the cached figures when the fingerprint still matches.

    Measuring makes a CUDA context that lives as long as the process; long-lived processes
    (the agent, the tray app, the demo) measure through desktop.probe's child instead."""
    if not force:
        cached = load_cached(cache_dir, hw, quick)
        if cached is not None:
            return cached, True
    result = run_benchmark(hw, quick=quick)
    save_cached(cache_dir, result)
    return result, False
