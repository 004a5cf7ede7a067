"""A task runs with the runtime pack's packages, cold and from the warm worker, and can
change nothing of the pack: it is bound read-only (and its files are read-only on disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_world import tiny_site

from desktop.runtime import pack
from desktop.runtime.store import Store
from desktop.sandbox import Limits, Sandbox, bwrap_usable
from tests.desktop.sandboxed import PY

pytestmark = [
    pytest.mark.usefixtures("task_start"),  # cold and warm
    pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable"),
]


def test_a_task_imports_the_packs_module_and_cannot_change_the_pack(tmp_path: Path) -> None:
    # the pack's torch/ is a namespace portion: the real torch of this environment still
    # imports (the warm worker loads it), while packmark comes only from the pack
    site = tiny_site(tmp_path / "build", importable_torch=False)
    manifest = pack.build(site, "cpu", tmp_path / "out")
    installed = Store(tmp_path / "data").install(tmp_path / "out" / manifest.archive, manifest)
    code = (
        "import json, pathlib, sys, packmark\n"
        "p = pathlib.Path(packmark.__file__)\n"
        "tried = []\n"
        "for attempt in (lambda: p.write_text('x = 1'), lambda: (p.parent / 'new.py').write_text('')):\n"  # noqa: E501
        "    try:\n"
        "        attempt(); tried.append('written')\n"
        "    except OSError as exc:\n"
        "        tried.append(type(exc).__name__)\n"
        "pathlib.Path('out.json').write_text(json.dumps([packmark.WHERE, str(p), tried]))\n"
    )
    with Sandbox(Limits(wall_s=60, memory_mb=1024)) as sandbox:
        sandbox.use_runtime(installed.site_packages)
        result = sandbox.run(tmp_path / "tasks" / "t", [PY, "-c", code])
        assert result.status == "ok", (result.detail, result.stderr_tail)
        where, path, tried = json.loads((tmp_path / "tasks" / "t" / "out.json").read_text())
        assert where == "pack 2.13.0"
        assert path == str(installed.site_packages / "packmark.py")
        assert "written" not in tried and len(tried) == 2
        # without the pack, the module is not there: the runtime is the environment again
        sandbox.use_runtime(None)
        result = sandbox.run(tmp_path / "tasks" / "u", [PY, "-c", "import packmark"])
        assert result.status == "crashed" and "No module named 'packmark'" in result.stderr_tail
    assert Store(tmp_path / "data").verify("cpu") == []


def test_a_frozen_bundles_hidden_commands_put_the_pack_first_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PyInstaller bundle ignores PYTHONPATH: `_task`, `_zygote` and `_probe` read the pack
    from GPUFLEX_RUNTIME_PACKAGES (which use_runtime and the probe set) and put it first."""
    import sys

    from desktop.runtime.active import PACKAGES_ENV, put_first_on_path

    site = tiny_site(tmp_path / "build", importable_torch=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(PACKAGES_ENV, str(site))
    put_first_on_path()
    assert sys.path[0] == str(site)
    with Sandbox(Limits()) as sandbox:
        sandbox.use_runtime(site)
        assert sandbox.env[PACKAGES_ENV] == str(site)
        sandbox.use_runtime(None)
        assert PACKAGES_ENV not in sandbox.env and "PYTHONPATH" not in sandbox.env
