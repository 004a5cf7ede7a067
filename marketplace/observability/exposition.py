"""The /metrics body: this host's event metrics (merged across processes when the launchers
set up multiprocess mode, else this process's own) followed by the database's state gauges."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from marketplace.observability import multiproc
from marketplace.observability.state import StateCollector


class _MergedFiles(Collector):
    """prometheus_client's MultiProcessCollector reads one folder; this merges the files of
    all the launchers' folders (web, worker, beat) into one set of series."""

    def collect(self) -> Iterator[Metric]:
        return iter(MultiProcessCollector.merge(multiproc.files(), accumulate=True))


_state = CollectorRegistry(auto_describe=False)
_state.register(StateCollector())
_merged = CollectorRegistry(auto_describe=False)
_merged.register(_MergedFiles())


def events() -> CollectorRegistry:
    """This host's event metrics: every launcher's files, or this process's own."""
    return _merged if multiproc.enabled() else REGISTRY


def render() -> bytes:
    return generate_latest(events()) + generate_latest(_state)
