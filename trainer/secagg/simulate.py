"""Secure aggregation run in one process: the simulator's rounds (trainer/sim) and the bench
(bench/secagg_bench.py) drive every node's side and the server's through the same protocol
code the marketplace and agents run, with the messages encoded as the agent API sends them
(JSON, keys and ciphertexts in hex; masked inputs as safetensors) so that their sizes are
the wire's."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from trainer.aggregation import ClientUpdate
from trainer.secagg import field as gf
from trainer.secagg.protocol import Participant, Roster, threshold_for, unmask_sum
from trainer.secagg.shamir import to_bytes
from trainer.secagg.vectors import encode_masked, flatten, layout, unflatten


@dataclass
class SimRound:
    total: np.ndarray  # the survivors' float sum, as the server decodes it
    survivors: list[int]
    dropped: list[int]
    node_s: list[float] = field(default_factory=list)  # each survivor's protocol time
    server_s: float = 0.0  # unmasking the sum
    up: list[int] = field(default_factory=list)  # bytes each survivor sent
    down: list[int] = field(default_factory=list)  # bytes each survivor received


def _json(body: object) -> int:
    return len(json.dumps(body).encode())


def run_round(
    vectors: list[np.ndarray], clip: float, drop: set[int] = frozenset(),  # type: ignore[assignment]
    fraction: float = 0.66, context: bytes = b"gpuflex-secagg|sim",
) -> SimRound:  # fmt: skip
    """One round among len(vectors) nodes; the indices in `drop` (1-based) stop after
    sharing their keys, as a node that dies mid-round."""
    n = len(vectors)
    nodes = {i: Participant() for i in range(1, n + 1)}
    spent = dict.fromkeys(nodes, 0.0)
    up, down = dict.fromkeys(nodes, 0), dict.fromkeys(nodes, 0)
    roster = Roster(
        context, threshold_for(n, fraction),
        {i: p.c.public for i, p in nodes.items()}, {i: p.s.public for i, p in nodes.items()},
    )  # fmt: skip
    members = [{"index": i, "c_key": roster.c_keys[i].hex(), "s_key": roster.s_keys[i].hex()}
               for i in roster.indices]  # fmt: skip
    mail: dict[int, dict[int, bytes]] = {}
    for i, p in nodes.items():
        t0 = time.perf_counter()
        mail[i] = p.shares(roster, i)
        spent[i] += time.perf_counter() - t0
        up[i] += _json({"c_key": p.c.public.hex(), "s_key": p.s.public.hex()})
        up[i] += _json({"shares": {str(k): v.hex() for k, v in mail[i].items()}})
        down[i] += _json({"members": members, "context": context.hex(), "threshold": 1})
    masked = {}
    for i, p in nodes.items():
        incoming = {u: mail[u][i] for u in nodes if u != i}
        down[i] += _json({"shares": {str(u): v.hex() for u, v in incoming.items()}})
        t0 = time.perf_counter()
        p.receive(incoming)
        if i not in drop:
            masked[i] = p.mask(gf.quantize(vectors[i - 1], n, clip))
        spent[i] += time.perf_counter() - t0
        if i in masked:
            up[i] += len(encode_masked(masked[i], {}))
    survivors, dropped = sorted(masked), sorted(drop)
    replies = {}
    for i in survivors:
        t0 = time.perf_counter()
        replies[i] = nodes[i].unmask(survivors, dropped)
        spent[i] += time.perf_counter() - t0
        up[i] += _json({"shares": {str(u): [k, to_bytes(y).hex()] for u, (k, y) in
                                   replies[i].items()}})  # fmt: skip
    t0 = time.perf_counter()
    total = unmask_sum(roster, masked, dropped, replies)
    server_s = time.perf_counter() - t0
    return SimRound(
        gf.dequantize_sum(total, n, clip), survivors, dropped,
        [spent[i] for i in survivors], server_s,
        [up[i] for i in survivors], [down[i] for i in survivors],
    )  # fmt: skip


def secure_mean(updates: list[ClientUpdate], clip: float, fraction: float = 0.66) -> ClientUpdate:
    """The simulator's round under secure aggregation: the updates' unweighted mean as the
    server unmasks it, as one ClientUpdate (the strategy sees nothing else)."""
    shapes = layout(dict(updates[0].delta))
    sim = run_round([flatten(dict(u.delta)) for u in updates], clip, fraction=fraction)
    mean = sim.total / len(sim.survivors)
    samples = sum(u.num_samples for u in updates)
    return ClientUpdate(f"secagg:{len(updates)}", unflatten(mean, shapes), samples)
