"""Shamir secret sharing of 32-byte secrets over GF(2**521 - 1), a Mersenne prime far above
any 256-bit secret. Shares are evaluated at x = 1..n (a node's index in the round's roster);
any `threshold` of them give the secret back, fewer tell nothing about it."""

from __future__ import annotations

import secrets

SHAMIR_PRIME = 2**521 - 1
SHARE_BYTES = 66  # 521 bits


def split(secret: bytes, xs: list[int], threshold: int) -> dict[int, int]:
    """Shares of `secret` at the points `xs` (distinct, 1 or more); `threshold` of them
    reconstruct it."""
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must be between 1 and {len(xs)} shares")
    if len(set(xs)) != len(xs) or min(xs) < 1:
        raise ValueError("share points must be distinct and positive")
    coefficients = [int.from_bytes(secret, "big")]
    coefficients += [secrets.randbelow(SHAMIR_PRIME) for _ in range(threshold - 1)]
    shares = {}
    for x in xs:
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % SHAMIR_PRIME
        shares[x] = y
    return shares


def combine(shares: dict[int, int], length: int = 32) -> bytes:
    """The secret from shares {x: y} (at least the threshold's worth: with fewer the result
    is a random value, which the caller's use of it exposes)."""
    if not shares:
        raise ValueError("no shares to combine")
    secret = 0
    points = list(shares.items())
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % SHAMIR_PRIME
                den = den * (xi - xj) % SHAMIR_PRIME
        secret = (secret + yi * num * pow(den, -1, SHAMIR_PRIME)) % SHAMIR_PRIME
    if secret >= 1 << (8 * length):
        raise ValueError("the shares do not combine into a secret (too few, or corrupt)")
    return secret.to_bytes(length, "big")


def to_bytes(y: int) -> bytes:
    return y.to_bytes(SHARE_BYTES, "big")


def from_bytes(data: bytes) -> int:
    if len(data) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes")
    return int.from_bytes(data, "big")
