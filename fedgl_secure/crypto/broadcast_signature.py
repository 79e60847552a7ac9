"""The aggregator's signature over what it broadcasts to one bank (DESIGN §5.3 step 5).

TLS already authenticates the aggregator to a bank; a signature makes what it served *attributable*: a bank keeps
the signature beside the broadcast and can show any third party (an auditor, the other banks) exactly which model,
pseudo labels and pseudo graph the aggregator gave it for a version — so serving different or altered broadcasts to
different banks leaves evidence. The signed bytes bind the federation, the bank, what the broadcast is (a model
version or a round's stage) and the SHA-256 of the body, after a domain-separation tag.
"""

from __future__ import annotations

import hashlib
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.errors import ReceiptError

DOMAIN = b"fedgl-secure/broadcast/v1\n"


def signed_bytes(federation: str, bank: str, label: str, body: bytes) -> bytes:
    """What is signed: the domain tag and compact JSON of (federation, bank, label, SHA-256 of ``body``)."""
    fields = {"federation": federation, "bank": bank, "label": label, "sha256": hashlib.sha256(body).hexdigest()}
    return DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sign_broadcast(key: Ed25519PrivateKey, federation: str, bank: str, label: str, body: bytes) -> str:
    """The aggregator's Ed25519 signature (hex) over ``body`` as served to ``bank`` under ``label``."""
    return key.sign(signed_bytes(federation, bank, label, body)).hex()


def verify_broadcast(
    key: Ed25519PublicKey, federation: str, bank: str, label: str, body: bytes, signature: str | None
) -> None:
    """Raise :class:`ReceiptError` unless ``signature`` is the aggregator's over exactly this body, for this bank
    and label."""
    if not signature:
        raise ReceiptError(f"broadcast {label}: unsigned; the aggregator signs every broadcast")
    try:
        key.verify(bytes.fromhex(signature), signed_bytes(federation, bank, label, body))
    except (InvalidSignature, ValueError):
        raise ReceiptError(
            f"broadcast {label}: bad signature (altered, meant for another bank, or not the aggregator's)"
        ) from None
