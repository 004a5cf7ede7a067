"""The link to the marketplace, measured with the agent's own requests.

The agent API has no speed-test endpoint, so the probe measures what the agent does anyway:
RTT from small requests (the median of a few, so one slow answer does not count), download
rate from the model and shard transfers, upload rate from update uploads. Heartbeats carry
the latest figures.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

# Smaller transfers measure latency, not bandwidth. With the request's RTT taken out, 16 KiB
# still times a slow link well (0.26 s at 0.5 Mbit/s), and a small model's update (39 kB for
# the digits MLP) is what tells the policy that a lossy wan link needs a compressed codec.
MIN_BYTES_FOR_RATE = 16 * 1024


@dataclass(frozen=True)
class NetworkFigures:
    rtt_ms: float | None
    up_mbps: float | None
    down_mbps: float | None

    def to_dict(self) -> dict[str, float | None]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 2)

        return {
            "rtt_ms": r(self.rtt_ms),
            "up_mbps": r(self.up_mbps),
            "down_mbps": r(self.down_mbps),
        }


class NetProbe:
    def __init__(self, window: int = 8) -> None:
        self._lock = threading.Lock()
        self._rtt: list[float] = []
        self._up: list[float] = []
        self._down: list[float] = []
        self.window = window

    def _push(self, series: list[float], value: float) -> None:
        with self._lock:
            series.append(value)
            del series[: -self.window]

    def rtt(self, seconds: float) -> None:
        self._push(self._rtt, seconds * 1000)

    def transfer(
        self, nbytes: int, seconds: float, upload: bool, rtt_s: float | None = None
    ) -> None:
        """Record a transfer; the request's own latency is taken out when known."""
        if nbytes < MIN_BYTES_FOR_RATE or seconds <= 0:
            return
        wire = max(seconds - (rtt_s or 0.0), seconds * 0.1)
        self._push(self._up if upload else self._down, 8 * nbytes / wire / 1e6)

    def latest_rtt_s(self) -> float | None:
        with self._lock:
            return statistics.median(self._rtt) / 1000 if self._rtt else None

    def figures(self) -> NetworkFigures:
        with self._lock:
            med = statistics.median
            return NetworkFigures(
                rtt_ms=med(self._rtt) if self._rtt else None,
                up_mbps=med(self._up) if self._up else None,
                down_mbps=med(self._down) if self._down else None,
            )
