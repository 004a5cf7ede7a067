"""Regional aggregation in the simulator: flat uploads against zone pre-aggregation.

Flat: every node uploads its update to the coordinator over its own link. Zones: the nodes
are split into `zones` contiguous groups; each member uploads over a regional link
(`ZONE_LINK`: a few ms, 1 Gbit/s) to its zone's aggregator, a platform server, which checks
the updates (trainer.zones.decode_partial on the way in at the coordinator) and sends one
partial sum over its own uplink (`AGGREGATOR_MBPS`, at the zone's median RTT). The math is
the marketplace's: trainer.zones.PartialSum and decode_partial, so the coordinator's model
equals the flat one up to float rounding.

`coordinator_in_mbps` caps the coordinator's own ingress link (None: unlimited, as the rest
of the simulator assumes): all uploads share it, so a round's last byte arrives no sooner
than the first upload's start plus the round's bytes over that rate (a fluid model).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from torch import Tensor

from trainer.aggregation import ClientUpdate
from trainer.hashing import bytes_hash
from trainer.sim.network import NodeProfile
from trainer.zones import Member, PartialSum, decode_partial, encode_partial

ZONE_LINK = NodeProfile(node=-1, rtt_s=0.004, loss=0.0, up_bps=1e9, down_bps=1e9, speed=1.0,
                        disconnect_p=0.0)  # fmt: skip
AGGREGATOR_MBPS = 1000.0


@dataclass
class Upload:
    """One node's finished local work, as the round sees it."""

    node: int
    start_s: float  # when its upload begins (task cost + download + compute)
    payload: bytes
    delta: dict[str, Tensor]
    samples: int
    shard_hash: str
    metrics: dict[str, float]


@dataclass
class Delivery:
    updates: list[tuple[ClientUpdate, str]]
    arrivals: list[float]  # per upload: when the coordinator had it (flat) or its zone's sum
    bytes_in: int  # what the coordinator received


def zone_of(node: int, nodes: int, zones: int) -> int:
    return node * zones // nodes


def _ingress_end(starts: list[float], bytes_in: int, coordinator_in_mbps: float | None) -> float:
    if coordinator_in_mbps is None or not starts:
        return 0.0
    return min(starts) + 8 * bytes_in / (coordinator_in_mbps * 1e6)


def deliver_flat(
    uploads: list[Upload], profiles: list[NodeProfile], coordinator_in_mbps: float | None
) -> Delivery:
    arrivals = [u.start_s + profiles[u.node].transfer_s(len(u.payload), upload=True)
                for u in uploads]  # fmt: skip
    bytes_in = sum(len(u.payload) for u in uploads)
    floor = _ingress_end([u.start_s for u in uploads], bytes_in, coordinator_in_mbps)
    updates = [(ClientUpdate(f"node-{u.node}", u.delta, u.samples, u.metrics), u.shard_hash)
               for u in uploads]  # fmt: skip
    return Delivery(updates, [max(a, floor) for a in arrivals], bytes_in)


def deliver_zones(
    uploads: list[Upload], profiles: list[NodeProfile], zones: int, *, round_: int,
    reference: dict[str, Tensor], max_norm: float | None,
    coordinator_in_mbps: float | None,
) -> Delivery:  # fmt: skip
    nodes = len(profiles)
    by_zone: dict[int, list[Upload]] = {}
    for u in uploads:
        by_zone.setdefault(zone_of(u.node, nodes, zones), []).append(u)
    updates: list[tuple[ClientUpdate, str]] = []
    sent: list[tuple[float, float, int]] = []  # (start, done, bytes) per zone
    for z, members in sorted(by_zone.items()):
        partial = PartialSum()
        ready = 0.0
        for u in members:
            ready = max(ready, u.start_s + ZONE_LINK.transfer_s(len(u.payload), upload=True))
            partial.add(u.delta, Member(str(u.node), str(u.node), bytes_hash(u.payload),
                                        u.samples, u.metrics))  # fmt: skip
        data = encode_partial(partial, job_id="sim", round_id=str(round_), zone=f"z{z}")
        zone_rtt = statistics.median(profiles[u.node].rtt_s for u in members)
        uplink = NodeProfile(-1, zone_rtt, 0.0, AGGREGATOR_MBPS * 1e6, AGGREGATOR_MBPS * 1e6,
                             1.0, 0.0)  # fmt: skip
        sent.append((ready, ready + uplink.transfer_s(len(data), upload=True), len(data)))
        decoded = decode_partial(data, reference, max_norm)
        label = bytes_hash("\n".join(sorted(u.shard_hash for u in members)).encode())
        members_info = tuple(m.to_dict() for m in decoded.members)
        updates.append((ClientUpdate(f"zone-{z}", decoded.mean, decoded.samples, {},
                                     members_info), label))  # fmt: skip
    bytes_in = sum(b for _, _, b in sent)
    floor = _ingress_end([s for s, _, _ in sent], bytes_in, coordinator_in_mbps)
    done = {z: max(d, floor) for z, (_, d, _) in zip(sorted(by_zone), sent, strict=True)}
    arrivals = [done[zone_of(u.node, nodes, zones)] for u in uploads]
    return Delivery(updates, arrivals, bytes_in)
