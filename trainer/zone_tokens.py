"""Zone member tokens (trainer.zones, regional aggregation): HMACs only, no torch, so the
marketplace's web process can route a claim through a zone (it imports no torch, issue 36)."""

from __future__ import annotations

import hashlib
import hmac

TOKEN_HEADER = "X-GPUFlex-Zone-Token"


def round_key(secret: str | bytes, round_id: object, aggregator_id: object) -> str:
    """The key one aggregator checks one round's member tokens with (hex). Derived, so the
    coordinator stores nothing; per round and aggregator, so a leaked key is worth one round
    of one zone."""
    raw = secret.encode() if isinstance(secret, str) else secret
    msg = f"gpuflex-zone-round:{round_id}:{aggregator_id}".encode()
    return hmac.new(raw, msg, hashlib.sha256).hexdigest()


def member_token(key: str, task_id: object, node_id: object, samples: int) -> str:
    """What the coordinator gives a member with its task: HMAC over task, node and weight."""
    msg = f"gpuflex-zone-member:{task_id}:{node_id}:{int(samples)}".encode()
    return hmac.new(bytes.fromhex(key), msg, hashlib.sha256).hexdigest()


def token_ok(key: str, token: str, task_id: object, node_id: object, samples: int) -> bool:
    """Constant-time check of a member's token."""
    if not isinstance(token, str) or not token:
        return False
    return hmac.compare_digest(member_token(key, task_id, node_id, samples), token)
