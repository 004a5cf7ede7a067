"""A fresh install of the lean `.deb`, for tests/desktop/test_deb*.py and the footprint bench
(`install_to_first_task_s`): a root with an empty dpkg database, the package installed into it,
the `cpu` runtime pack published in a TUF repository served over loopback http, the installed
`gpuflex-node runtime fetch` getting it, and the installed `gpuflex-node run` training one task
of the agent API's test double (tests/desktop/fake_marketplace.py) with the pack's torch.

Uses what `make package` leaves in dist/: `gpuflex_*.deb` and `runtime/cpu-*.tar.gz`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests" / "desktop") not in sys.path:  # the bench imports this module too
    sys.path.insert(0, str(ROOT / "tests" / "desktop"))
DIST = ROOT / "dist"
DOWNLOAD_BYTES_PER_S = 100e6  # issue 32's goal: 60 s plus the pack's download at 100 MB/s
GOAL_BASE_S = 60.0


def _newest(pattern: str) -> Path | None:
    found = sorted(DIST.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def built_deb() -> Path | None:
    return _newest("gpuflex_*.deb")


def built_cpu_pack() -> Path | None:
    """The cpu pack's archive (scripts/build-runtime-pack.sh cpu, run by `make package`)."""
    return _newest("runtime/cpu-*.tar.gz")


def fresh_root(tmp_path: Path) -> Path:
    """A root with an empty dpkg database: what a fresh container has before the install."""
    root = tmp_path / "root"
    admin = root / "var" / "lib" / "dpkg"
    for sub in ("info", "updates", "triggers"):
        (admin / sub).mkdir(parents=True)
    (admin / "status").touch()
    (admin / "available").touch()
    return root


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --force-depends: the empty root has none of the Depends (libc6, the X libraries);
    # --force-not-root lets a non-root CI runner use its own root folder
    cmd = ["dpkg", f"--root={root}", "--force-depends", "--force-not-root", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@dataclass
class FreshNode:
    """The installed package, its node folders, and the served repository. With `chroot`,
    `root` is a Debian root (debootstrap) the programs run in (`chroot ROOT ...`); else an
    empty dpkg root whose /usr/bin programs run on this host."""

    root: Path
    home: Path  # the node's config/data/cache folders, as the programs see them
    pub: Path  # the publisher folder (keys, repository)
    url: str  # the repository, served on loopback
    trusted_root: Path  # the root.json a first fetch trusts, as the programs see it
    chroot: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def host_home(self) -> Path:
        return self.root / self.home.relative_to("/") if self.chroot else self.home

    def argv(self, *args: str) -> list[str]:
        if self.chroot:
            return ["chroot", str(self.root), "/usr/bin/gpuflex-node", *args]
        return [str(self.root / "usr" / "bin" / "gpuflex-node"), *args]

    def env(self) -> dict[str, str]:
        if self.chroot:
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        else:  # the installed bundle, not this checkout: no PYTHON* from the test's environment
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            env["PATH"] = str(self.root / "usr" / "bin") + os.pathsep + env.get("PATH", "")
        env.update({f"GPUFLEX_NODE_{n.upper()}_DIR": str(self.home / n)
                    for n in ("config", "data", "cache")})  # fmt: skip
        env["GPUFLEX_KEYRING"] = "file"
        return env

    def runtime(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """`gpuflex-node runtime ARGS` as installed, against the served repository."""
        extra = ["--url", self.url, "--root", str(self.trusted_root)] if args[0] == "fetch" else []
        return subprocess.run(self.argv("runtime", *args, *extra), capture_output=True,
                              text=True, env=self.env(), timeout=timeout)  # fmt: skip


def publish_pack(pub: Path, archive: Path) -> Path:
    """A publisher folder whose TUF repository holds `archive`; returns its root.json."""
    from runtime_world import repo_tool

    tool = repo_tool()
    here = Path.cwd()  # the repo tool changes directory
    try:
        root_json = tool.init(pub)
        tool.add_runtime(pub, archive)
        return root_json
    finally:
        os.chdir(here)


def train_first_task(node: FreshNode, timeout_s: float = 900) -> str:
    """The installed `gpuflex-node run` registers with the test double, and trains and uploads
    one small digits task; returns the agent's log. Raises when it does not."""
    from fake_marketplace import PROVIDER_KEY, FakeMarketplace, digits_task

    from desktop.config import Credentials, Paths, Settings, save_settings

    home = node.host_home
    paths = Paths(config=home / "config", data=home / "data", cache=home / "cache")
    log_path = home / "agent.log"
    with FakeMarketplace() as market:
        market.add(digits_task("t-first"))
        # what `gpuflex-node login` and the first-run wizard would have stored
        Credentials(paths, use_keyring=False).set_provider_key(PROVIDER_KEY)
        save_settings(Settings(server_url=market.url, node_name="fresh", task_wall_s=600,
                               task_memory_mb=4096, first_run_done=True), paths)  # fmt: skip
        with open(log_path, "wb") as log:  # a pipe nobody reads could fill
            agent = subprocess.Popen(node.argv("run", "--claim-wait", "1"),
                                     env=node.env(), stdout=subprocess.DEVNULL, stderr=log,
                                     start_new_session=True)  # fmt: skip
        try:
            end = time.monotonic() + timeout_s
            while "t-first" not in market.accepted():
                if agent.poll() is not None or time.monotonic() > end:
                    failed = [t.failed for t in market.tasks.values() if t.failed]
                    raise RuntimeError(
                        f"no task trained (agent exit {agent.returncode}, failures {failed}): "
                        + log_path.read_text(errors="replace")[-3000:]
                    )
                time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, 15)
            agent.wait(timeout=60)
    return log_path.read_text(errors="replace")


def in_chroot(root: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "HOME": "/root"}  # fmt: skip
    return subprocess.run(["chroot", str(root), *cmd], capture_output=True, text=True, env=env,
                          timeout=900)  # fmt: skip


@contextlib.contextmanager
def _mounted(root: Path) -> Iterator[None]:
    """/proc and /sys in a debootstrap root: the agent reads its machine there, bwrap too."""
    done = []
    try:
        for kind in ("proc", "sys"):
            target = root / kind
            if not os.path.ismount(target):
                fs = "sysfs" if kind == "sys" else "proc"
                subprocess.run(["mount", "-t", fs, fs, str(target)], check=True)
                done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


def _install(node: FreshNode, deb: Path) -> None:
    if not node.chroot:
        done = dpkg(node.root, "--install", str(deb))
        if done.returncode != 0:
            raise RuntimeError(f"dpkg --install {deb.name}: {done.stderr}")
        return
    in_chroot(node.root, "apt-get", "purge", "-y", "-qq", "gpuflex")  # an earlier run's
    shutil.copyfile(deb, node.root / "tmp" / deb.name)
    try:  # apt fetches the Depends; bubblewrap (Recommends) isolates the tasks
        done = in_chroot(node.root, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                         f"/tmp/{deb.name}", "bubblewrap")  # fmt: skip
    finally:
        (node.root / "tmp" / deb.name).unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"apt-get install {deb.name}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def _purge(node: FreshNode) -> None:
    if node.chroot:
        in_chroot(node.root, "apt-get", "purge", "-y", "-qq", "gpuflex")
    else:
        dpkg(node.root, "--purge", "gpuflex")


@contextlib.contextmanager
def fresh_node(
    deb: Path, archive: Path, work: Path, chroot: Path | None = None
) -> Iterator[FreshNode]:
    """Publish the pack and serve it; install the .deb into a fresh root (or, with `chroot`,
    with apt into that debootstrap root), fetch the pack with the installed CLI, train a first
    task. Timings (s) in `timings`: install, fetch, first_task (agent start to the task's
    update accepted) and install_to_first_task (the three, from the install's start). The
    package is purged afterwards."""
    from runtime_world import served

    pub = work / "pub"
    trusted = publish_pack(pub, archive)
    with (
        served(pub / "repository") as url,
        _mounted(chroot) if chroot else contextlib.nullcontext(),
    ):
        if chroot:  # the programs see the chroot's files: the trusted root is copied in
            shutil.copyfile(trusted, chroot / "tmp" / "gpuflex-trusted-root.json")
            node = FreshNode(root=chroot, home=Path("/var/tmp/gpuflex-fresh-node"), pub=pub,
                             url=url, trusted_root=Path("/tmp/gpuflex-trusted-root.json"),
                             chroot=True)  # fmt: skip
        else:
            node = FreshNode(root=fresh_root(work), home=work / "home", pub=pub, url=url,
                             trusted_root=trusted)  # fmt: skip
        try:
            started = time.monotonic()
            _install(node, deb)
            installed = time.monotonic()
            got = node.runtime("fetch", "--plan", "cpu")
            if got.returncode != 0:
                raise RuntimeError(f"gpuflex-node runtime fetch: {got.stderr[-3000:]}")
            fetched = time.monotonic()
            train_first_task(node)
            trained = time.monotonic()
            node.timings = {
                "install_s": installed - started,
                "fetch_s": fetched - installed,
                "first_task_s": trained - fetched,
                "install_to_first_task_s": trained - started,
            }
            yield node
        finally:
            _purge(node)
            shutil.rmtree(node.host_home, ignore_errors=True)
            if chroot:
                (chroot / "tmp" / "gpuflex-trusted-root.json").unlink(missing_ok=True)


def goal_s(archive: Path) -> float:
    """Issue 32's goal for `install_to_first_task_s`: 60 s plus the pack at 100 MB/s."""
    return GOAL_BASE_S + archive.stat().st_size / DOWNLOAD_BYTES_PER_S
