"""Secrets at rest: the CKKS secret context sealed with AEAD under an operator secret.

Format (all binary): ``MAGIC | salt (16) | nonce (12) | AES-256-GCM(ciphertext + tag)``. The key
is derived from the operator secret with scrypt (memory-hard, so a stolen sealed file cannot be
brute-forced cheaply) and a random salt stored alongside; the header is authenticated as
associated data, so any altered byte — or a wrong operator secret — fails the tag check.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from fedgl_secure.errors import SealError

MAGIC = b"FEDGL-SEALED-v1\n"
SALT_BYTES = 16
NONCE_BYTES = 12
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1  # ≈ 32 MiB and ~0.1 s per derivation
MIN_SECRET_BYTES = 16


def _secret_bytes(operator_secret: bytes | str) -> bytes:
    secret = operator_secret.encode("utf-8") if isinstance(operator_secret, str) else bytes(operator_secret)
    if len(secret) < MIN_SECRET_BYTES:
        raise SealError(f"the operator secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
    return secret


def derive_key(operator_secret: bytes | str, salt: bytes) -> bytes:
    """The 256-bit AEAD key for ``salt`` (scrypt; deterministic given secret and salt)."""
    kdf = Scrypt(salt=salt, length=32, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return kdf.derive(_secret_bytes(operator_secret))


def seal_secret_context(secret: bytes, operator_secret: bytes | str) -> bytes:
    """Encrypt-and-authenticate ``secret`` (e.g. a serialised secret context) for storage."""
    salt, nonce = os.urandom(SALT_BYTES), os.urandom(NONCE_BYTES)
    header = MAGIC + salt + nonce
    return header + AESGCM(derive_key(operator_secret, salt)).encrypt(nonce, secret, header)


def unseal_secret_context(sealed: bytes, operator_secret: bytes | str) -> bytes:
    """Open what :func:`seal_secret_context` produced; a wrong secret or altered file → :class:`SealError`."""
    header_size = len(MAGIC) + SALT_BYTES + NONCE_BYTES
    if len(sealed) <= header_size or not sealed.startswith(MAGIC):
        raise SealError("not a sealed secret (bad header or truncated file)")
    salt = sealed[len(MAGIC) : len(MAGIC) + SALT_BYTES]
    nonce = sealed[len(MAGIC) + SALT_BYTES : header_size]
    try:
        return AESGCM(derive_key(operator_secret, salt)).decrypt(nonce, sealed[header_size:], sealed[:header_size])
    except InvalidTag:
        raise SealError("cannot unseal: wrong operator secret, or the sealed file was altered") from None
