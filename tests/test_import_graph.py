"""The code's layering, read from its imports (module and function level alike): no import
circles inside a package, and trainer/ stays free of the web and GUI frameworks."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("marketplace", "trainer", "desktop")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue  # Django's generated history, imported by nothing
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(path: Path, module: str) -> Iterator[str]:
    """Every name an import in the file could load: `a.b` for `import a.b`, and both `a` and
    `a.c` for `from a import c` (c may be a module or a name in a)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)
    return {m: {t for t in _imported(p, m) if t in mods and t != m} for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package: str) -> None:
    graph = _graph(package)
    assert len(graph) > 10, "the package's modules were not found"
    assert _cycles(graph) == []


def test_trainer_imports_neither_django_nor_qt_nor_the_apps() -> None:
    banned = ("django", "rest_framework", "celery", "PySide6", "marketplace", "desktop")
    offending = {
        module: sorted(t for t in _imported(path, module) if t.split(".")[0] in banned)
        for module, path in _modules("trainer").items()
    }
    assert {m: t for m, t in offending.items() if t} == {}


def test_the_marketplace_parses_a_jobs_spec_in_one_place() -> None:
    """Submission parses what a buyer sends; everything after reads `Job.parsed_spec`. No
    module parses stored JSON again or reads spec fields from the raw dict."""
    parsers, raw_reads = set(), set()
    for module, path in _modules("marketplace").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "parse_spec":
                parsers.add(module)
            target = getattr(node, "value", None) if isinstance(node, ast.Subscript) else None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value if node.func.attr == "get" else None
            if isinstance(target, ast.Attribute) and target.attr == "spec":
                raw_reads.add(f"{module}:{node.lineno}")
    assert parsers == {"marketplace.jobs.submission", "marketplace.jobs.models"}
    assert raw_reads == set()


# What the web process (and `gpuflex manage`) may not load: models are built, checked and
# aggregated by the Celery worker (issue 36: 417 MB and 7.9 s of imports in every web process).
HEAVY = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "scipy", "PIL", "optuna")
_WEB_PROCESS = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.server.settings.base")
import marketplace.server.wsgi
from django.urls import get_resolver

def views(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            yield from views(pattern.url_patterns)
        else:
            yield pattern.callback

modules = {view.__module__ for view in views(get_resolver().url_patterns)}
assert len(modules) > 10, modules
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))))
"""


def _fresh(args: list[str]) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_web_process_imports_no_torch() -> None:
    """A fresh interpreter imports the WSGI app and every view module behind its URL conf."""
    assert _fresh(["-c", _WEB_PROCESS, *HEAVY]).split() == []


def test_manage_check_imports_no_torch() -> None:
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules}"
        f" & {set(HEAVY)!r})))\n"
        "from marketplace.cli import main\n"
        "main(['manage', 'check'])\n"
    )
    out = _fresh(["-c", probe])
    assert "LOADED []" in out, out[-2000:]
