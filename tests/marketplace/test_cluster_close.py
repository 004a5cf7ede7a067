"""The demo's cluster stops every process it started when it closes: agents first, then the
server side, each told at once and each waited for."""

from __future__ import annotations

import sys
from pathlib import Path

from marketplace.demo.cluster import Cluster

_SLEEPER = "import time\nwhile True: time.sleep(1)\n"


def test_close_stops_every_process(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    for name in ("agent-a", "web", "worker"):
        cluster._start(name, [sys.executable, "-c", _SLEEPER])
    procs = dict(cluster.procs)
    cluster.close()
    assert all(p.poll() is not None for p in procs.values())
    assert cluster.procs == {}


def test_the_enrollment_token_comes_from_the_cluster_s_hook(tmp_path: Path) -> None:
    """The demo, Django set up in its own process, makes the token through the service
    instead of starting `gpuflex manage create_enrollment_token`."""
    cluster = Cluster(tmp_path, enroll=lambda: "gfx_e_made_here")
    assert cluster.enrollment_token() == "gfx_e_made_here"


def test_stopping_the_agents_with_the_worker_leaves_the_web_server(tmp_path: Path) -> None:
    """The demo, its job ended, stops the agents and the worker together; the web server
    stays until the cluster closes (the agents may talk to it as they stop)."""
    cluster = Cluster(tmp_path)
    for name in ("agent-a", "agent-b", "web", "worker"):
        cluster._start(name, [sys.executable, "-c", _SLEEPER])
    procs = dict(cluster.procs)
    cluster.stop_agents(with_worker=True)
    assert list(cluster.procs) == ["web"] and cluster.alive("web")
    assert all(procs[n].poll() is not None for n in ("agent-a", "agent-b", "worker"))
    cluster.close()
    assert procs["web"].poll() is not None
