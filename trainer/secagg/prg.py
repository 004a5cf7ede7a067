"""Expanding a 32-byte seed into a mask of field elements: ChaCha20's keystream (the
`cryptography` package), never numpy's generator, whose state can be recovered from its output.

Each element is a 64-bit little-endian keystream word reduced mod p (field.expand on numpy
arrays, packed.expand on packed integers): its bias from uniform is below 2**-32 (2**64 mod p
over 2**64), which leaves the masked value statistically indistinguishable from uniform for
any practical number of coordinates.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

# a fixed nonce is safe: each seed is used for one expansion only (one mask, one round)
_NONCE = b"\x00" * 16


def keystream(seed: bytes, length: int) -> bytes:
    """The 8 * `length` keystream bytes whose 64-bit words become `length` mask elements."""
    if len(seed) != 32:
        raise ValueError("a mask seed is 32 bytes")
    stream = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    return stream.update(bytes(8 * length))
