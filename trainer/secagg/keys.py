"""Key agreement and share encryption: X25519, HKDF-SHA256 and AES-256-GCM (`cryptography`).

Every node makes two fresh X25519 key pairs per round: `c` to encrypt the shares it sends
(each pair of nodes derives an AES key), `s` to derive the pairwise mask seeds. Only `s`'s
private key is Shamir-shared: a dropped node's pairwise masks are rebuilt from it, while its
share-encryption key never leaves it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)


@dataclass(frozen=True)
class KeyPair:
    private: bytes  # 32 raw bytes
    public: bytes  # 32 raw bytes

    @classmethod
    def generate(cls) -> KeyPair:
        key = X25519PrivateKey.generate()
        private = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return cls(private, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def agree(private: bytes, public: bytes, context: bytes, purpose: bytes) -> bytes:
    """A 32-byte key both ends derive alike: HKDF over the X25519 shared secret, bound to
    the round (`context`) and to what it is for (`purpose`: masks or share encryption)."""
    if len(public) != 32:
        raise ValueError("an X25519 public key is 32 bytes")
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(public)
    )
    return HKDF(hashes.SHA256(), 32, salt=None, info=purpose + b"|" + context).derive(shared)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext, or ValueError when the ciphertext was not made with this key for this
    sender, recipient and round (AES-GCM's tag covers `aad`)."""
    try:
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], aad)
    except (InvalidTag, ValueError):
        raise ValueError("a share does not decrypt: wrong key, or tampered with") from None
