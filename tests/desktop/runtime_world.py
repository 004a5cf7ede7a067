"""Tiny runtime packs and a TUF repository served on loopback, for the runtime-pack tests:
a fake `torch` (a version.py and one module) stands in for the gigabytes of the real one."""

from __future__ import annotations

import importlib.util
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

from desktop.runtime import pack

ROOT = Path(__file__).resolve().parents[2]


def repo_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "update_repo", ROOT / "installers" / "update_repo.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_site(folder: Path, torch_version: str = "2.13.0", cuda: str | None = None,
              importable_torch: bool = True) -> Path:  # fmt: skip
    """A site-packages folder with a fake torch and a module a task can import. Without
    `importable_torch` its torch/ has no __init__.py: a namespace portion, which the real
    torch of the environment (a regular package, later on sys.path) wins over (PEP 420)."""
    site = folder / "site-packages"
    (site / "torch").mkdir(parents=True)
    cuda_text = repr(cuda) if cuda else "None"
    (site / "torch" / "version.py").write_text(
        f"__version__ = '{torch_version}'\ncuda: Optional[str] = {cuda_text}\nhip = None\n"
    )
    if importable_torch:
        (site / "torch" / "__init__.py").write_text("from torch.version import __version__\n")
    (site / "packmark.py").write_text(f"WHERE = 'pack {torch_version}'\n")
    return site


def tiny_pack(folder: Path, plan: str = "cpu", torch_version: str = "2.13.0",
              cuda: str | None = None) -> pack.Manifest:  # fmt: skip
    site = tiny_site(folder / f"build-{plan}-{torch_version}", torch_version, cuda)
    return pack.build(site, plan, folder / "out")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def served(folder: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def copy_metadata(pub: Path, to: Path) -> Path:
    shutil.copytree(pub / "repository" / "metadata", to)
    return to
