"""Signed upload receipts (DESIGN §5.3 step 2): a bank's Ed25519 signature over what it uploaded.

A receipt binds one upload to (federation, round, nonce, kind, sender, SHA-256 of the ciphertext bytes,
context fingerprint), the round's participants as the bank was told them, the number of values it holds, and the
SHA-256 of its ciphertexts' ``c1`` polynomials —
the half that carries only encryption randomness, which the key authority receives for every receipted upload
to check that what it decrypts is exactly their sum (``key_authority.py``). The aggregator checks it before
adding; the key authority checks a quorum of them before decrypting a sum, so a sum can only be decrypted for
a round the banks really took part in, under the context they really used. Every decryptor requires the sum to
hold exactly the participants its receipts name: an honest bank signs one receipt per (round, nonce, kind), so
each of its uploads is in one decryptable sum only, and sums over different bank sets of one round cannot be
formed and differenced (docs/threat-model.md, R13). Signing covers a canonical encoding
(sorted, compact JSON after a domain-separation tag) so both sides hash exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedgl_secure.errors import ReceiptError
from fedgl_secure.tomlio import format_validation_error

DOMAIN = b"fedgl-secure/upload-receipt/v3\n"
C1_DOMAIN = b"fedgl-secure/c1-residues/v1\n"
_HEX64 = r"^[0-9a-f]{64}$"


class ReceiptFields(BaseModel):
    """What a bank vouches for when it uploads one kind in one round."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    federation: str = Field(min_length=1, max_length=128)
    round: int = Field(ge=1)
    nonce: str = Field(pattern=r"^[0-9a-f]{16,128}$")
    kind: str = Field(min_length=1, max_length=64)
    sender: str = Field(min_length=1, max_length=128)
    ciphertext_sha256: str = Field(pattern=_HEX64)
    context_fingerprint: str = Field(pattern=_HEX64)
    values: int = Field(ge=0, le=2**40)  # values in the upload (before packing): fixes its chunk count
    c1_sha256: str = Field(pattern=_HEX64)
    policy_sha256: str = Field(pattern=_HEX64)  # the bank's policy (Policy.digest): one policy for all nodes
    # the banks the round (stage) was opened for, sorted: the one set a sum holding this upload may be over
    participants: tuple[str, ...] = Field(min_length=1, max_length=1024)

    @field_validator("participants")
    @classmethod
    def _sorted_and_distinct(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if any(not 1 <= len(name) <= 128 for name in names):
            raise ValueError("every participant name has 1 to 128 characters")
        if list(names) != sorted(set(names)):
            raise ValueError("participants must be sorted and distinct")
        return names


class Receipt(ReceiptFields):
    """Receipt fields plus the sender's Ed25519 signature (hex) over :func:`canonical_bytes`."""

    signature: str = Field(pattern=r"^[0-9a-f]{128}$")

    def fields(self) -> ReceiptFields:
        return ReceiptFields(**self.model_dump(exclude={"signature"}))


def canonical_bytes(fields: ReceiptFields) -> bytes:
    """The exact bytes signed: domain tag + JSON with sorted keys and no whitespace."""
    body = json.dumps(fields.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return DOMAIN + body.encode("ascii")


def ciphertext_digest(chunks: Sequence[bytes]) -> str:
    """SHA-256 (hex) of an upload's chunks, length-framed so chunk boundaries are bound too."""
    digest = hashlib.sha256()
    digest.update(len(chunks).to_bytes(8, "big"))
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "big"))
        digest.update(chunk)
    return digest.hexdigest()


def c1_digest(c1_residues: np.ndarray) -> str:
    """SHA-256 (hex) of an upload's ``c1`` polynomials, shape (chunks, data primes, N), little-endian uint64,
    with the shape bound in."""
    residues = np.ascontiguousarray(c1_residues, dtype="<u8")
    digest = hashlib.sha256(C1_DOMAIN)
    digest.update(json.dumps(list(residues.shape)).encode("ascii"))
    digest.update(residues.tobytes())
    return digest.hexdigest()


def sign_receipt(private_key: Ed25519PrivateKey, fields: ReceiptFields) -> Receipt:
    """The sender's signed receipt for ``fields``."""
    signature = private_key.sign(canonical_bytes(fields)).hex()
    return Receipt(**fields.model_dump(), signature=signature)


def verify_receipt(public_key: Ed25519PublicKey, receipt: Receipt) -> None:
    """Raise :class:`ReceiptError` unless ``receipt`` was signed, unaltered, by ``public_key``'s owner."""
    try:
        public_key.verify(bytes.fromhex(receipt.signature), canonical_bytes(receipt.fields()))
    except InvalidSignature:
        raise ReceiptError(
            f"receipt of {receipt.sender!r} for {receipt.kind!r}, round {receipt.round}: bad signature "
            "(forged, altered, or signed with another key)"
        ) from None


def parse_receipt(data: bytes | str | dict) -> Receipt:
    """A receipt from JSON (bytes/str) or a dict, with a :class:`ReceiptError` naming the bad field."""
    try:
        if isinstance(data, dict):
            return Receipt.model_validate(data)
        return Receipt.model_validate_json(data)
    except ValidationError as error:
        raise ReceiptError(f"malformed receipt: {format_validation_error(error, whole='receipt')}") from None


def public_key_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key (how the key authority registers banks)."""
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def load_public_key(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 raw bytes."""
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as error:
        raise ReceiptError(f"not an Ed25519 public key ({len(raw)} bytes): {error}") from None
