"""How off-chain identifiers become the contracts' ``bytes32`` keys."""

from __future__ import annotations

from uuid import UUID

from eth_utils import keccak

Bytes32Like = bytes | str | int | UUID


def to_bytes32(value: Bytes32Like) -> bytes:
    """Map a job, batch or record id to the 32-byte key the contracts use.

    - 32 ``bytes``: used as they are (a record hash, say);
    - ``UUID``: its 128-bit integer, big-endian, left-padded (reversible);
    - ``int`` (0 .. 2**256-1): big-endian, left-padded (reversible);
    - ``str``: ``0x`` + 64 hex digits is parsed as bytes; any other text is ``keccak256(utf-8)``
      (one-way: keep the original id off-chain).

    Pick one form per kind of id and stick to it: ``to_bytes32(7)`` and ``to_bytes32("7")``
    are different keys.
    """
    if isinstance(value, bytes):
        if len(value) != 32:
            raise ValueError(f"expected 32 bytes, got {len(value)}")
        return value
    if isinstance(value, UUID):
        return value.int.to_bytes(32, "big")
    if isinstance(value, bool):  # bool is an int; an id of True is always a bug
        raise TypeError("a bool is not an id")
    if isinstance(value, int):
        if not 0 <= value < 2**256:
            raise ValueError(f"id out of range: {value}")
        return value.to_bytes(32, "big")
    if isinstance(value, str):
        if value.startswith("0x") and len(value) == 66:
            return bytes.fromhex(value[2:])
        return keccak(text=value)
    raise TypeError(f"cannot make a bytes32 id from {type(value).__name__}")
