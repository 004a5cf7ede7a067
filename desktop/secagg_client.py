"""The node's side of secure aggregation (trainer/secagg, docs/privacy.md) over the agent API:
advertise keys, share them, mask the trained update, and reveal shares for unmasking.

The update never leaves the node in the clear: what is uploaded is its masked field vector.
The round's secrets (key pairs, self-mask seed, the shares others sent) live in this object
only; an agent that restarts mid-round has dropped, and the others recover for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from desktop.client import MarketplaceClient
from trainer.secagg import packed
from trainer.secagg.protocol import Participant, ProtocolError, Roster
from trainer.secagg.shamir import to_bytes

MASKING = ("mask", "unmask", "ready")
# what a masked upload's metadata may carry over from the plain update's (the server records
# the precision and device a node claims, as for any update)
KEPT_METADATA = ("precision", "device")


class SecAggDropped(Exception):
    """The round went on without this node (too late, or the wait ran out)."""


def uses_secagg(task: dict[str, Any]) -> bool:
    privacy = (task.get("spec") or {}).get("privacy") or {}
    return bool((privacy.get("secure_aggregation") or {}).get("enabled"))


class SecAggSession:
    def __init__(
        self, client: MarketplaceClient, task: dict[str, Any], stop: threading.Event | None = None,
        poll_s: float = 0.25, log: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        self.client, self.task_id = client, str(task["id"])
        self.options = task["spec"]["privacy"]["secure_aggregation"]
        self.stop = stop or threading.Event()
        self.poll_s = poll_s
        # generous: the others train before they share, and each phase waits for setup_s
        self.wait_s = 4 * float(self.options.get("setup_s", 60.0)) + 600.0
        self.log = log or (lambda _m: None)
        self.participant = Participant()

    def _until(self, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        end = time.monotonic() + self.wait_s
        while True:
            view = self.client.secagg_status(self.task_id)
            if done(view):
                return view
            if time.monotonic() > end or self.stop.wait(self.poll_s):
                raise SecAggDropped(f"gave up waiting for {what}")

    def masked_update(self, plain: bytes) -> bytes:
        """Rounds 0-2: the masked update to upload in place of `plain` (safetensors)."""
        values, meta = packed.flatten_update(plain)  # before any message: bad bytes stop here
        p = self.participant
        self.client.secagg_keys(self.task_id, p.c.public.hex(), p.s.public.hex())
        view = self._until(lambda v: v["phase"] != "advertise", "the round's roster")
        if view.get("index") is None:
            raise SecAggDropped("the roster was fixed without this node")
        members = view["members"]
        roster = Roster(
            bytes.fromhex(view["context"]), int(view["threshold"]),
            {int(m["index"]): bytes.fromhex(m["c_key"]) for m in members},
            {int(m["index"]): bytes.fromhex(m["s_key"]) for m in members},
        )  # fmt: skip
        sealed = p.shares(roster, int(view["index"]))
        self.client.secagg_post_shares(self.task_id, {str(k): v.hex() for k, v in sealed.items()})
        self.log(f"secure aggregation: node {view['index']} of {len(members)}, shares sent")
        view = self._until(lambda v: v["phase"] in MASKING, "the round's sharing set")
        if int(view["index"]) not in view.get("shared", []):
            raise SecAggDropped("the round went on without this node's shares")
        p.receive(
            {int(k): bytes.fromhex(v) for k, v in self.client.secagg_shares(self.task_id).items()}
        )
        clip = float(self.options["clipping_range"])
        # packed integers, not numpy: the agent process loads neither numpy nor torch (#32);
        # the values and bytes are those of trainer/secagg/vectors.py's numpy path
        quantized = packed.quantize(values, len(roster.indices), clip)
        masked = packed.mask(quantized, p.mask_terms())
        kept = {k: meta[k] for k in KEPT_METADATA if k in meta}
        return packed.encode_masked(masked, kept | {"secagg": "masked"})

    def unmask(self) -> None:
        """Round 3: once the survivors are fixed, the shares that unmask their sum."""
        view = self._until(lambda v: v["phase"] in ("unmask", "ready"), "the unmask request")
        try:
            replies = self.participant.unmask(view["survivors"], view["dropped"])
        except ProtocolError as exc:
            self.log(f"secure aggregation: unmask request refused ({exc})")
            raise
        shares = {str(u): [kind, to_bytes(y).hex()] for u, (kind, y) in replies.items()}
        self.client.secagg_unmask(self.task_id, shares)
        self.log(f"secure aggregation: {len(view['dropped'])} dropped node(s) recovered")
