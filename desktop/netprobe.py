"""The link to the marketplace, measured with the agent's own requests.

The agent API has no speed-test endpoint, so the probe measures what the agent does anyway:
RTT from small requests (the median of a few, so one slow answer does not count), download
rate from the model and shard transfers, upload rate from update uploads. Packet loss is the
machine's TCP retransmission rate (retransmitted over sent segments, from /proc/net/snmp on
Linux; elsewhere it is not reported): TCP hides a lossy link from the requests, but not from
these counters, and the adaptation policy caps a link's rate by it (Mathis) and weighs it in
the node's health. Heartbeats carry the latest figures.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from pathlib import Path

# Smaller transfers measure latency, not bandwidth. With the request's RTT taken out, 16 KiB
# still times a slow link well (0.26 s at 0.5 Mbit/s), and a small model's update (39 kB for
# the digits MLP) is what tells the policy that a lossy wan link needs a compressed codec.
MIN_BYTES_FOR_RATE = 16 * 1024
SNMP = Path("/proc/net/snmp")
# Fewer segments sent than this say nothing of a link's loss; past LOSS_WINDOW_SEGMENTS the
# count starts again, so that the figure follows the link as it is now.
MIN_SEGMENTS_FOR_LOSS = 500
LOSS_WINDOW_SEGMENTS = 50_000


def tcp_counters(path: Path = SNMP) -> tuple[int, int] | None:
    """(segments sent, segments retransmitted) since boot, or None where unreadable."""
    try:
        lines = [line.split() for line in path.read_text().splitlines() if line.startswith("Tcp:")]
        header, values = lines[0], lines[1]
        row = dict(zip(header[1:], values[1:], strict=True))
        return int(row["OutSegs"]), int(row["RetransSegs"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class NetworkFigures:
    rtt_ms: float | None
    up_mbps: float | None
    down_mbps: float | None
    loss: float | None = None  # the share of TCP segments retransmitted

    def to_dict(self) -> dict[str, float | None]:
        def r(v: float | None, digits: int = 2) -> float | None:
            return None if v is None else round(v, digits)

        return {
            "rtt_ms": r(self.rtt_ms),
            "up_mbps": r(self.up_mbps),
            "down_mbps": r(self.down_mbps),
            "loss": r(self.loss, 5),
        }


class NetProbe:
    def __init__(self, window: int = 8, snmp: Path = SNMP) -> None:
        self._lock = threading.Lock()
        self._snmp = snmp
        self._tcp_base = tcp_counters(snmp)
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

    def loss(self) -> float | None:
        """TCP segments retransmitted over those sent since the window's start (None until
        enough were sent, or where the counters cannot be read)."""
        now = tcp_counters(self._snmp)
        with self._lock:
            base = self._tcp_base
            if now is None or base is None:
                self._tcp_base = base or now
                return None
            sent, resent = now[0] - base[0], now[1] - base[1]
            if sent < MIN_SEGMENTS_FOR_LOSS or resent < 0:
                return None
            if sent > LOSS_WINDOW_SEGMENTS:
                self._tcp_base = now
            return min(1.0, resent / sent)

    def figures(self) -> NetworkFigures:
        loss = self.loss()
        with self._lock:
            med = statistics.median
            return NetworkFigures(
                rtt_ms=med(self._rtt) if self._rtt else None,
                up_mbps=med(self._up) if self._up else None,
                down_mbps=med(self._down) if self._down else None,
                loss=loss,
            )
