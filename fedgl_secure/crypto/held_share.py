"""What a party keeps after the key ceremony, and its sealed form at rest: :class:`HeldShare`,
:func:`seal_held_share`, :func:`unseal_held_share`.

The key authority keeps its own secret ``s_0``, a bank its Shamir share ``S_j``; both with the roster and the
collective public context (``key_ceremony.py`` computes them). The held share is stored sealed under the
operator's secret (``sealing.seal_secret_context``: scrypt + AES-GCM), in a versioned, self-describing payload
checked against the CKKS rings when it is opened. It needs only the roster and the residues' wire form
(``ceremony_messages.py``), so the key authority, the bank's key store and the decryptors read it without the
ceremony's messages.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from fedgl_secure.crypto import ckks, sealing, shamir, threshold
from fedgl_secure.crypto.ceremony_messages import Roster, parse_residues, residue_bytes
from fedgl_secure.errors import CryptoError

HELD_SHARE_MAGIC = b"fedgl-secure/held-share/v1\n"  # the sealed payload's first line: format and version
HELD_SHARE_VERSION = 1

# --- what a party keeps --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HeldShare:
    """What a party keeps after the ceremony: the key authority its own secret s_0 (key level), a bank its Shamir
    share S_j (data level); plus the roster and the collective public context. repr shows party and roster
    digest only, so a logged HeldShare leaks nothing."""

    party: int
    roster: Roster
    secret: np.ndarray = field(repr=False)  # party 0: (K, N) key-level s_0 ; bank: (k, N) data-level S_j
    public_context: bytes = field(repr=False)  # empty while the ceremony is pending (the key authority's s_0 only)

    def __post_init__(self) -> None:
        if not isinstance(self.roster, Roster):
            raise CryptoError(f"a held share needs a Roster, got {type(self.roster).__name__}")
        if (
            isinstance(self.party, bool)
            or not isinstance(self.party, int)
            or not 0 <= self.party <= len(self.roster.banks)
        ):
            raise CryptoError(f"party {self.party!r}: 0 is the key authority, banks are 1..{len(self.roster.banks)}")
        if not isinstance(self.secret, np.ndarray) or self.secret.dtype != np.uint64 or self.secret.ndim != 2:
            raise CryptoError("a held share's secret must be a 2-D uint64 array of residues")
        if not isinstance(self.public_context, bytes):
            raise CryptoError("a held share's public context must be bytes (empty while the ceremony is pending)")

    def __repr__(self) -> str:
        return f"HeldShare(party={self.party}, roster_sha256={self.roster.digest()!r})"

    def key_share(self, rings: threshold.Rings) -> threshold.KeyShare:
        """The key authority's ``KeyShare`` for ``threshold.authority_partial``. Its ``public`` part is an empty
        (0, N) array: ``p_0`` contains the key error ``e_0``, which is not kept, and decryption never needs it."""
        if self.party != threshold.AUTHORITY:
            raise CryptoError(f"party {self.party} is a bank: it holds a Shamir share (threshold_share), not s_0")
        secret = shamir.check_element(rings.key, self.secret, "the key authority's held secret")
        return threshold.KeyShare(threshold.AUTHORITY, np.zeros((0, rings.key.degree), dtype=np.uint64), secret)

    def threshold_share(self, rings: threshold.Rings) -> threshold.ThresholdShare:
        """A bank's ``ThresholdShare`` for ``threshold.bank_partial``."""
        if self.party == threshold.AUTHORITY:
            raise CryptoError("party 0 is the key authority: it holds s_0 (key_share), not a Shamir share")
        secret = shamir.check_element(rings.data, self.secret, f"the held Shamir share of party {self.party}")
        return threshold.ThresholdShare(self.party, self.roster.threshold, len(self.roster.banks), secret)


def seal_held_share(held: HeldShare, operator_secret: bytes | str) -> bytes:
    """``held`` sealed for storage (``sealing.seal_secret_context``: scrypt + AES-GCM).

    Payload: :data:`HELD_SHARE_MAGIC`, an 8-byte little-endian header length, a JSON header (version, party,
    roster, roster digest, secret shape, byte counts, context SHA-256), the secret's residues ('<u8', C
    order), then the public context."""
    if not isinstance(held, HeldShare):
        raise CryptoError(f"expected a HeldShare, got {type(held).__name__}")
    secret = residue_bytes(held.secret)
    header = {
        "version": HELD_SHARE_VERSION,
        "party": held.party,
        "roster": {
            "federation": held.roster.federation,
            "banks": list(held.roster.banks),
            "threshold": held.roster.threshold,
            "policy_sha256": held.roster.policy_sha256,
        },
        "roster_sha256": held.roster.digest(),
        "secret_shape": list(held.secret.shape),
        "secret_bytes": len(secret),
        "public_context_bytes": len(held.public_context),
        "public_context_sha256": hashlib.sha256(held.public_context).hexdigest(),
    }
    encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    payload = HELD_SHARE_MAGIC + struct.pack("<Q", len(encoded)) + encoded + secret + held.public_context
    return sealing.seal_secret_context(payload, operator_secret)


def unseal_held_share(sealed: bytes, operator_secret: bytes | str, rings: threshold.Rings) -> HeldShare:
    """Open :func:`seal_held_share`'s output. A wrong secret or an altered byte is a ``SealError``; a payload
    that is not a held share, or one whose secret or context does not fit ``rings``, a ``CryptoError``."""
    payload = sealing.unseal_secret_context(sealed, operator_secret)
    what = "sealed held share"
    start = len(HELD_SHARE_MAGIC) + 8
    if not payload.startswith(HELD_SHARE_MAGIC) or len(payload) < start:
        raise CryptoError(f"{what}: not a held share of format {HELD_SHARE_MAGIC.strip().decode()}")
    (length,) = struct.unpack("<Q", payload[len(HELD_SHARE_MAGIC) : start])
    try:
        header = json.loads(payload[start : start + length])
        if not isinstance(header, dict) or header.get("version") != HELD_SHARE_VERSION:
            raise CryptoError(f"{what}: unsupported header version (expected {HELD_SHARE_VERSION})")
        kept = header["roster"]
        roster = Roster(kept["federation"], tuple(kept["banks"]), kept["threshold"], kept["policy_sha256"])
        party, shape = header["party"], tuple(header["secret_shape"])
        secret_size, context_size = header["secret_bytes"], header["public_context_bytes"]
        context_sha256 = header["public_context_sha256"]
    except (ValueError, KeyError, TypeError) as error:
        raise CryptoError(f"{what}: malformed header ({error!r})") from None
    if roster.digest() != header.get("roster_sha256"):
        raise CryptoError(f"{what}: the roster does not match its digest")
    body = payload[start + length :]
    if not isinstance(secret_size, int) or not isinstance(context_size, int) or len(body) != secret_size + context_size:
        raise CryptoError(
            f"{what}: {len(body)} bytes of residues and context, the header says {secret_size} + {context_size}"
        )
    level = rings.key if party == threshold.AUTHORITY else rings.data
    if shape != level.shape:
        raise CryptoError(f"{what}: secret of shape {shape}, these parameters need {level.shape} for party {party}")
    secret = shamir.check_element(
        level, parse_residues(body[:secret_size], level.shape, f"{what}: secret"), f"{what}: secret"
    )
    context = body[secret_size:]
    if hashlib.sha256(context).hexdigest() != context_sha256:
        raise CryptoError(f"{what}: the public context does not match its digest")
    if context:
        loaded = ckks.load_public_context(context)
        if tuple(int(word) for word in loaded.seal_context().data.key_parms_id()) != rings.key.parms_id:
            raise CryptoError(f"{what}: its public context is for other CKKS parameters than these rings")
    return HeldShare(party, roster, secret, context)
