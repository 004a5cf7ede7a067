"""Expanding a 32-byte seed into a mask of field elements: ChaCha20's keystream (the
`cryptography` package), never numpy's generator, whose state can be recovered from its output.

Each element is a 64-bit keystream word reduced mod p: its bias from uniform is below 2**-32
(2**64 mod p over 2**64), which leaves the masked value statistically indistinguishable from
uniform for any practical number of coordinates.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from trainer.secagg.field import PRIME

# a fixed nonce is safe: each seed is used for one expansion only (one mask, one round)
_NONCE = b"\x00" * 16


def expand(seed: bytes, length: int) -> np.ndarray:
    """`length` field elements (int64 in [0, p)) from a 32-byte seed."""
    if len(seed) != 32:
        raise ValueError("a mask seed is 32 bytes")
    stream = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    words = np.frombuffer(stream.update(bytes(8 * length)), dtype="<u8")
    return (words % np.uint64(PRIME)).astype(np.int64)
