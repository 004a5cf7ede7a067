"""The agent process stays free of torch, numpy and Qt (#32 item 2): importing the agent and
its CLI loads none of them, nor does a real `gpuflex-node run` that registers and polls a
marketplace with no work. Their tasks (the sandboxed runner, the warm worker) and the tray
are other processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_agent_loop import wait_for

from desktop.bench_result import save_cached
from desktop.config import save_settings

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "numpy", "PySide6"}
# the shared libraries each one maps: a C extension counts in the resident size whichever
# module loaded it, so the running agent is checked by its maps too
HEAVY_LIBRARIES = ("libtorch", "_multiarray_umath", "libQt6", "PySide6")

_IMPORT = """
import json, sys
import desktop.agent, desktop.cli, desktop.daemon, desktop.local_api, desktop.secagg_client
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""
# the real CLI, run as `python -m desktop.cli` runs it, recording its modules as it exits
_RUN = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
runpy.run_module("desktop.cli", run_name="__main__", alter_sys=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_importing_the_agent_and_its_cli_loads_no_torch_numpy_or_qt() -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=_env())  # fmt: skip
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "desktop" in loaded and not loaded & HEAVY, sorted(loaded & HEAVY)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text() if sys.platform == "linux" else ""


def test_a_registered_node_with_no_work_loads_no_torch_numpy_or_qt(
    market, logged_in, isolated_dirs, fake_bench, tmp_path: Path
) -> None:
    save_settings(logged_in, isolated_dirs)
    save_cached(isolated_dirs.cache, fake_bench)
    modules = tmp_path / "modules.json"
    env = _env() | {
        "GPUFLEX_NODE_CONFIG_DIR": str(isolated_dirs.config),
        "GPUFLEX_NODE_DATA_DIR": str(isolated_dirs.data),
        "GPUFLEX_NODE_CACHE_DIR": str(isolated_dirs.cache),
    }
    node = subprocess.Popen(
        [sys.executable, "-c", _RUN, str(modules), "run", "--claim-wait", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        # registered, then polling for work several times: past start-up, into the idle loop
        wait_for(lambda: market.registrations, what="the node to register")
        wait_for(lambda: sum(r[1].endswith("/claim?wait=1") for r in market.requests) >= 3,
                 what="the node to poll for work")  # fmt: skip
        mapped = _maps(node.pid)
        assert not [lib for lib in HEAVY_LIBRARIES if lib in mapped]
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        _, err = node.communicate(timeout=60)
    assert node.returncode == 0, err.decode()[-3000:]
    loaded = {m.split(".")[0] for m in json.loads(modules.read_text())}
    assert "desktop" in loaded and not loaded & HEAVY, sorted(loaded & HEAVY)
