"""On a machine with an NVIDIA GPU: the CUDA runtime pack (scripts/build-runtime-pack.sh
cuda13, or cuda12 from a CUDA 12 index) is the plan this machine's driver picks, and a task
in the sandbox trains on the GPU with the pack's torch. scripts/gpu-check.sh builds the pack
and names it in GPUFLEX_CUDA_PACK; without a GPU or a pack this skips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from desktop.runtime import pack
from desktop.runtime.plan import Machine, choose
from desktop.runtime.store import Store
from desktop.sandbox import Limits, Sandbox
from tests.desktop.sandboxed import PY

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.fixture
def cuda_pack() -> tuple[Path, pack.Manifest]:
    archive = os.environ.get("GPUFLEX_CUDA_PACK", "")
    if not archive or not Path(archive).is_file():
        pytest.skip("no CUDA pack: set GPUFLEX_CUDA_PACK (scripts/gpu-check.sh builds one)")
    path = Path(archive)
    manifest_file = path.with_name(path.name.removesuffix(".tar.gz") + ".json")
    return path, pack.Manifest.from_dict(json.loads(manifest_file.read_text()))


def test_the_driver_picks_the_cuda_pack_and_a_task_trains_on_the_gpu_with_it(
    cuda_pack: tuple[Path, pack.Manifest], tmp_path: Path
) -> None:
    archive, manifest = cuda_pack
    machine = Machine.here()
    assert machine.nvidia_driver, "NVML found no driver on a CUDA machine"
    assert choose(machine, {"cpu": {}, manifest.plan: manifest.to_dict()}).plan == manifest.plan
    installed = Store(tmp_path / "data").install(archive, manifest)
    code = (
        "import json, pathlib, torch\n"
        "x = torch.ones(256, 256, device='cuda')\n"
        "y = (x @ x).sum().item()\n"
        "pathlib.Path('out.json').write_text(json.dumps([torch.__file__, torch.version.cuda,"
        " torch.cuda.is_available(), y]))\n"
    )
    with Sandbox(Limits(wall_s=300, memory_mb=16384), gpu=True) as sandbox:
        sandbox.use_runtime(installed.site_packages)
        result = sandbox.run(tmp_path / "tasks" / "t", [PY, "-c", code])
    assert result.status == "ok", (result.detail, result.stderr_tail)
    where, cuda, available, total = json.loads((tmp_path / "tasks" / "t" / "out.json").read_text())
    assert where.startswith(str(installed.site_packages))  # the pack's torch, not the venv's
    assert cuda == manifest.cuda and available and total == 256.0**3
