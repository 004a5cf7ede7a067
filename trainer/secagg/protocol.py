"""One round of secure aggregation: what a node does (`Participant`) and what the server does
with what the nodes send (`unmask_sum`). The server is trusted to follow the protocol but not
to look away (honest-but-curious): it sees every message and must learn only the sum.

The rounds of messages (Bonawitz et al., "Practical Secure Aggregation", §4):

0. advertise: each node sends its two X25519 public keys; the server fixes the roster
   (indices 1..n) and the threshold t.
1. share keys: each node Shamir-shares its self-mask seed b and its mask key s_sk among the
   roster, each share sealed for its recipient; the nodes that sent theirs form U1.
2. masked input: y_u = x_u + PRG(b_u) + sum over v in U1 of +-PRG(s_uv) in GF(p); the nodes
   whose y arrives form U2 (the survivors), the rest of U1 dropped.
3. unmask: each survivor reveals, per node of U1, the b share (the node survived) or the
   s_sk share (it dropped): never both for one node, so no node's x is exposed. With t
   replies the server removes every mask and keeps sum over U2 of x_u.

The full graph: every pair of nodes masks, so n - 1 key agreements and mask expansions per
node. SecAgg+ (Bell et al. CCS 2020) masks only with O(log n) neighbours; at our cohort sizes
(tens to a hundred nodes) the full graph's cost is measured in bench/secagg_bench.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainer.secagg import shamir
from trainer.secagg.keys import KeyPair, agree, open_sealed, seal

if TYPE_CHECKING:
    import numpy as np

MASK = b"gpuflex-secagg-mask"
SHARE = b"gpuflex-secagg-share"
MIN_NODES = 3  # fewer, and the sum of the others tells each node (and the server) too much


class ProtocolError(ValueError):
    """A message breaks the protocol: the node refuses to go on rather than leak."""


def threshold_for(n: int, fraction: float) -> int:
    """Shares needed to reconstruct: above half the roster (two disjoint halves could
    otherwise each rebuild a different secret of one node) and at least `fraction` of it."""
    return min(n, max(n // 2 + 1, math.ceil(fraction * n - 1e-9)))


@dataclass(frozen=True)
class Roster:
    """The round's members as the server fixed them: index -> public keys."""

    context: bytes  # binds every key and share to one round (job and round number)
    threshold: int
    c_keys: dict[int, bytes]  # share-encryption public keys
    s_keys: dict[int, bytes]  # mask-agreement public keys

    @property
    def indices(self) -> list[int]:
        return sorted(self.s_keys)


def _aad(context: bytes, sender: int, recipient: int) -> bytes:
    return context + b"|" + sender.to_bytes(4, "big") + recipient.to_bytes(4, "big")


def _sign(u: int, v: int) -> int:
    return 1 if u < v else -1


def pair_seed(private: bytes, public: bytes, context: bytes) -> bytes:
    """The seed of the mask two nodes share: each derives it from its own private key and
    the other's public one."""
    return agree(private, public, context, MASK)


@dataclass
class Participant:
    """A node's side of one round. Its secrets live here only, never on disk: a node that
    restarts mid-round has dropped, and the others recover its part as for any dropout."""

    c: KeyPair = field(default_factory=KeyPair.generate)
    s: KeyPair = field(default_factory=KeyPair.generate)
    seed: bytes = field(default_factory=lambda: os.urandom(32))
    index: int = 0
    roster: Roster | None = None
    # sender -> (share of its seed b, share of its s_sk), this node's own included
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    answered: bool = False

    def shares(self, roster: Roster, index: int) -> dict[int, bytes]:
        """Round 1: recipient -> the sealed pair of shares meant for it."""
        if index not in roster.s_keys or roster.s_keys[index] != self.s.public:
            raise ProtocolError("the roster does not hold this node's keys at its index")
        if len(roster.indices) < MIN_NODES:
            raise ProtocolError(f"a roster of fewer than {MIN_NODES} nodes exposes its members")
        if roster.threshold <= len(roster.indices) // 2:
            raise ProtocolError("the threshold must exceed half the roster")
        self.index, self.roster = index, roster
        xs = roster.indices
        b_shares = shamir.split(self.seed, xs, roster.threshold)
        s_shares = shamir.split(self.s.private, xs, roster.threshold)
        self.held[index] = (b_shares[index], s_shares[index])
        sealed = {}
        for v in xs:
            if v == index:
                continue
            key = agree(self.c.private, roster.c_keys[v], roster.context, SHARE)
            plain = shamir.to_bytes(b_shares[v]) + shamir.to_bytes(s_shares[v])
            sealed[v] = seal(key, plain, _aad(roster.context, index, v))
        return sealed

    def receive(self, incoming: dict[int, bytes]) -> None:
        """Round 1's answer: the shares the others sealed for this node (U1, but itself)."""
        roster = self._roster()
        for u, sealed in incoming.items():
            if u == self.index or u not in roster.c_keys:
                raise ProtocolError(f"a share from {u}, who is not another member")
            key = agree(self.c.private, roster.c_keys[u], roster.context, SHARE)
            plain = open_sealed(key, sealed, _aad(roster.context, u, self.index))
            n = shamir.SHARE_BYTES
            self.held[u] = (shamir.from_bytes(plain[:n]), shamir.from_bytes(plain[n:]))

    @property
    def u1(self) -> list[int]:
        return sorted(self.held)

    def mask_terms(self) -> list[tuple[bytes, int]]:
        """Round 2's masks, as (seed, sign): the self mask's seed, added, then each pairwise
        mask's, added or taken away (sign(u, v)). Either arithmetic applies them: numpy's
        (`mask`) or the agent's packed integers (packed.mask)."""
        roster = self._roster()
        if len(self.u1) < roster.threshold:
            raise ProtocolError("fewer nodes shared their keys than the threshold")
        terms = [(self.seed, 1)]
        for v in self.u1:
            if v != self.index:
                seed = pair_seed(self.s.private, roster.s_keys[v], roster.context)
                terms.append((seed, _sign(self.index, v)))
        return terms

    def mask(self, quantized: np.ndarray) -> np.ndarray:
        """Round 2: the masked input, from a numpy vector of field elements."""
        # numpy is the server's, the simulator's and the bench's: the agent masks packed
        # integers (packed.mask) and never loads it (#32), so it is imported here
        import numpy as np

        from trainer.secagg import field as gf

        y = quantized.astype(np.int64)
        for seed, sign in self.mask_terms():
            m = gf.expand(seed, len(quantized))
            y = gf.add(y, m) if sign > 0 else gf.sub(y, m)
        return y

    def unmask(self, survivors: list[int], dropped: list[int]) -> dict[int, tuple[str, int]]:
        """Round 3: per node of U1, the share the server may have. Refused (ProtocolError)
        when the request would expose an input: a node named both survivor and dropped, one
        outside U1, too few survivors, or a second request."""
        roster = self._roster()
        alive, gone = set(survivors), set(dropped)
        if self.answered:
            raise ProtocolError("this node already answered the round's unmask request")
        if alive & gone or (alive | gone) != set(self.u1):
            raise ProtocolError("survivors and dropped must split the nodes that shared keys")
        if self.index not in alive:
            raise ProtocolError("this node is not among the survivors")
        if len(alive) < roster.threshold:
            raise ProtocolError("fewer survivors than the threshold: the sum would expose them")
        self.answered = True
        return {u: ("b", b) if u in alive else ("s", s) for u, (b, s) in self.held.items()}

    def _roster(self) -> Roster:
        if self.roster is None:
            raise ProtocolError("the roster is not fixed yet")
        return self.roster


def unmask_sum(
    roster: Roster,
    masked: dict[int, np.ndarray],
    dropped: list[int],
    replies: dict[int, dict[int, tuple[str, int]]],
) -> np.ndarray:
    """The server's round 3: sum over the survivors (the keys of `masked`) of their inputs,
    in GF(p), from their masked inputs and at least t replies (replier -> node -> share)."""
    import numpy as np  # the server's side (see Participant.mask)

    from trainer.secagg import field as gf

    if len(replies) < roster.threshold:
        raise ProtocolError(f"{len(replies)} replies; {roster.threshold} are needed")
    survivors = sorted(masked)
    length = len(next(iter(masked.values())))
    total = np.zeros(length, dtype=np.int64)
    for y in masked.values():
        total = gf.add(total, y)

    def secret(u: int, kind: str) -> bytes:
        points = {x: r[u][1] for x, r in replies.items() if u in r and r[u][0] == kind}
        if len(points) < roster.threshold:
            raise ProtocolError(f"too few shares of node {u}'s {kind}")
        return shamir.combine(dict(list(points.items())[: roster.threshold]))

    for u in survivors:
        total = gf.sub(total, gf.expand(secret(u, "b"), length))
    for v in dropped:
        s_private = secret(v, "s")
        for u in survivors:
            m = gf.expand(pair_seed(s_private, roster.s_keys[u], roster.context), length)
            # u added sign(u, v) * PRG(s_uv): take it away
            total = gf.sub(total, m) if _sign(u, v) > 0 else gf.add(total, m)
    return total
