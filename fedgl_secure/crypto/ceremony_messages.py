"""The key ceremony's public messages and the encodings they share: the :class:`Roster`, the signed
:class:`Announcement` and its verification.

Every party of the ceremony (``key_ceremony.py``: the key authority and n banks over an untrusted relay) holds the
same :class:`Roster` (federation, banks in consortium order, threshold, policy digest); its digest is bound into
every message, so no message of one roster can be replayed into another. Each bank signs an :class:`Announcement`
of its public key share ``p_b`` and a fresh X25519 key; :func:`verify_announcements` accepts them only if every
bank of the roster signed its own. Here too: the canonical framing every signed or authenticated byte string uses
(``_frame``), a ring element's wire form (:func:`residue_bytes`, :func:`parse_residues`), and ``_Message``, the
base of every ceremony message (compact JSON, field types checked and named) — shared with the share envelopes
(``share_envelopes.py``) and the held share (``held_share.py``), which sit above this module.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedgl_secure.crypto import shamir, threshold
from fedgl_secure.errors import CryptoError

DOMAIN = b"fedgl-secure/key-ceremony/v1"
EXCHANGE_KEY_BYTES = 32  # raw X25519 public key
SIGNATURE_BYTES = 64  # Ed25519
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # what b64decode(validate) takes


# --- canonical encodings -----------------------------------------------------------------------------


def _frame(*parts: bytes | int) -> bytes:
    """Length-prefixed fields (integers as 8 little-endian bytes): no two field lists encode alike."""
    out = []
    for part in parts:
        data = struct.pack("<Q", part) if isinstance(part, int) else bytes(part)
        out.append(struct.pack("<Q", len(data)) + data)
    return b"".join(out)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def residue_bytes(residues: np.ndarray) -> bytes:
    """A ring element as its wire form: little-endian uint64, C order."""
    return np.ascontiguousarray(residues, dtype="<u8").tobytes()


def parse_residues(data: bytes, shape: tuple[int, int], what: str) -> np.ndarray:
    """Wire bytes back to a (k, N) uint64 array, refusing a wrong length before reshaping."""
    expected = shape[0] * shape[1] * 8
    if len(data) != expected:
        raise CryptoError(
            f"{what}: {len(data)} bytes, expected {expected} ({shape[0]} primes x N = {shape[1]} x 8 bytes)"
        )
    return np.frombuffer(data, dtype="<u8").reshape(shape).astype(np.uint64, copy=True)


def _exchange_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# --- the roster ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roster:
    """Who takes part and under what: federation id, the banks in consortium order (bank i is party i+1),
    threshold t, and the SHA-256 of the policy every node runs (``Policy.digest``).

    Every party must hold the same roster: its digest is bound into every message and seeds the common random
    polynomial, so a message made for another federation, bank list, threshold or policy is refused, and the
    collective key — hence the context and its fingerprint — is the policy's own (one policy for all)."""

    federation: str
    banks: tuple[str, ...]
    threshold: int
    policy_sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.federation, str) or not self.federation:
            raise CryptoError(f"the roster needs a non-empty federation id, got {self.federation!r}")
        if isinstance(self.banks, str) or not isinstance(self.banks, Sequence):
            raise CryptoError(f"the roster's banks must be a sequence of names, got {type(self.banks).__name__}")
        object.__setattr__(self, "banks", tuple(self.banks))
        for name in self.banks:
            if not isinstance(name, str) or not name:
                raise CryptoError(f"bank names must be non-empty strings, got {name!r}")
        repeated = sorted({name for name in self.banks if self.banks.count(name) > 1})
        if repeated:
            raise CryptoError(f"the roster names banks {repeated} more than once")
        shamir.check_access_structure(self.threshold, len(self.banks))
        if not isinstance(self.policy_sha256, str) or not _HEX64.fullmatch(self.policy_sha256):
            raise CryptoError(f"the roster's policy digest must be 64 lowercase hex digits, got {self.policy_sha256!r}")

    def party(self, bank: str) -> int:
        """The party index of ``bank`` (its Shamir evaluation point)."""
        try:
            return self.banks.index(bank) + 1
        except ValueError:
            raise CryptoError(
                f"bank {bank!r} is not in the roster of federation {self.federation!r} (banks {list(self.banks)})"
            ) from None

    def bank(self, party: int) -> str:
        """The name of bank ``party`` (1..n); party 0 is the key authority, which is not a bank."""
        if isinstance(party, bool) or not isinstance(party, int | np.integer):
            raise CryptoError(f"party index {party!r} is not an integer")
        if party == threshold.AUTHORITY:
            raise CryptoError("party 0 is the key authority, not a bank")
        if not 1 <= party <= len(self.banks):
            raise CryptoError(f"party {party} is not a bank of the roster: banks are 1..{len(self.banks)}")
        return self.banks[int(party) - 1]

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical encoding (domain, federation, banks in order, threshold, policy digest)."""
        names = [name.encode("utf-8") for name in self.banks]
        fields = (self.federation.encode("utf-8"), len(names), *names, self.threshold, self.policy_sha256.encode())
        encoded = DOMAIN + b"roster/v2" + _frame(*fields)
        return hashlib.sha256(encoded).hexdigest()

    def _describe(self, party: int) -> str:
        return f"bank {self.banks[party - 1]!r} (party {party})" if 1 <= party <= len(self.banks) else f"party {party}"


# --- JSON helpers --------------------------------------------------------------------------------------


def _checked_object(data: object, what: str, kind: str, expected: set[str]) -> dict:
    """A parsed JSON object of message type ``kind`` (checked first: the most telling error) with exactly
    ``expected``."""
    if not isinstance(data, dict):
        raise CryptoError(f"{what}: expected a JSON object, got {type(data).__name__}")
    if data.get("type") != kind:
        raise CryptoError(f"{what}: field 'type' is {data.get('type')!r}, expected {kind!r}")
    expected = expected | {"type"}
    missing, unknown = sorted(expected - set(data)), sorted(set(data) - expected)
    if missing or unknown:
        raise CryptoError(f"{what}: missing fields {missing}, unknown fields {unknown}")
    return data


def _json_bytes(data: dict, key: str, what: str) -> bytes:
    value = data[key]
    if not isinstance(value, str):
        raise CryptoError(f"{what}: field {key!r} must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise CryptoError(f"{what}: field {key!r} is not valid base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _check_fields(message: object, what: str) -> None:
    """Types of a message's fields, named: the checks that need no rings or roster (``spec.type`` is the
    annotation's text, annotations being postponed)."""
    for spec in fields(message):  # type: ignore[arg-type]
        value = getattr(message, spec.name)
        if spec.name == "roster_sha256":
            if not isinstance(value, str) or not _HEX64.fullmatch(value):
                raise CryptoError(f"{what}: field 'roster_sha256' must be 64 lowercase hex digits")
        elif spec.type == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CryptoError(f"{what}: field {spec.name!r} must be a non-negative integer, got {value!r}")
        elif spec.type == "bytes":
            if not isinstance(value, bytes):
                raise CryptoError(f"{what}: field {spec.name!r} must be bytes, got {type(value).__name__}")
        elif spec.type == "str" and (not isinstance(value, str) or not value):
            raise CryptoError(f"{what}: field {spec.name!r} must be a non-empty string, got {value!r}")


class _Message:
    """A ceremony message (a frozen dataclass of str, int and bytes fields) and its compact JSON: bytes as base64,
    with a ``type`` so that one kind of message is never read as another. The field types are checked on
    construction, naming the field; nothing is verified here (signatures, rosters: the functions below)."""

    _TYPE: ClassVar[str]
    _WHAT: ClassVar[str]

    def __post_init__(self) -> None:
        _check_fields(self, self._WHAT)

    def to_data(self) -> dict:
        """The message as a JSON-ready object."""
        data: dict = {"type": self._TYPE}
        for spec in fields(self):  # type: ignore[arg-type]
            value = getattr(self, spec.name)
            data[spec.name] = _b64(value) if spec.type == "bytes" else value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_data(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes):
        """Parse :meth:`to_json`'s output; anything malformed is a :class:`CryptoError` naming the field."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as error:
            raise CryptoError(f"{cls._WHAT}: not JSON ({error})") from None
        return cls.from_data(data)

    @classmethod
    def json_schema(cls) -> dict:
        """The JSON Schema of :meth:`to_data`'s object, as strict as the parser (for the services' OpenAPI: a body
        that matches it parses, and what is refused after that is the ceremony's refusal, not a malformed body)."""
        properties: dict = {"type": {"type": "string", "enum": [cls._TYPE]}}
        for spec in fields(cls):  # type: ignore[arg-type]
            if spec.name == "roster_sha256":
                properties[spec.name] = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
            elif spec.type == "int":
                properties[spec.name] = {"type": "integer", "minimum": 0, "maximum": 2**31}
            elif spec.type == "bytes":
                properties[spec.name] = {"type": "string", "format": "byte", "pattern": _BASE64_PATTERN}
            else:
                properties[spec.name] = {"type": "string", "minLength": 1}
        return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}

    @classmethod
    def from_data(cls, data: object):
        """:meth:`to_data`'s object (parsed JSON) back to a message, every field checked and named."""
        specs = fields(cls)  # type: ignore[arg-type]
        data = _checked_object(data, cls._WHAT, cls._TYPE, {spec.name for spec in specs})
        values = {}
        for spec in specs:
            value = data[spec.name]
            if spec.type == "bytes":
                value = _json_bytes(data, spec.name, cls._WHAT)
            elif spec.type == "int" and isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
                value = int(value)  # JSON has numbers: 3.0 is the integer 3 (as JSON Schema's "integer" says)
            values[spec.name] = value
        return cls(**values)


# --- announcements -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Announcement(_Message):
    """A bank's public message: its public key share p_i and a fresh X25519 key for receiving Shamir shares,
    signed with its Ed25519 receipt-signing key.

    The signature is what stops the relay from announcing its own exchange key in a bank's name (and so
    receiving the shares dealt to that bank); the roster digest stops replays into another ceremony."""

    roster_sha256: str
    party: int
    bank: str
    public_share: bytes  # the (K, N) uint64 key-level residues, little-endian bytes ('<u8'), C order
    exchange_key: bytes  # raw 32-byte X25519 public key
    signature: bytes  # Ed25519 over signed_bytes()

    _TYPE: ClassVar[str] = "announcement"
    _WHAT: ClassVar[str] = "announcement"

    def signed_bytes(self) -> bytes:
        """What the bank signs: the domain, then every field but the signature, length-prefixed (the public
        share by its SHA-256)."""
        return (
            DOMAIN
            + b"announcement"
            + _frame(
                self.roster_sha256.encode("ascii"),
                self.party,
                self.bank.encode("utf-8"),
                _sha256(self.public_share),
                self.exchange_key,
            )
        )


def announce(
    rings: threshold.Rings,
    roster: Roster,
    bank: str,
    key_share: threshold.KeyShare,
    exchange_key: X25519PrivateKey,
    signing_key: Ed25519PrivateKey,
) -> Announcement:
    """Bank ``bank``'s signed announcement of its public share ``p_b`` and the public half of ``exchange_key``."""
    party = roster.party(bank)
    if key_share.party != party:
        raise CryptoError(f"the key share is party {key_share.party}'s, but {bank!r} is party {party}")
    public = shamir.check_element(rings.key, key_share.public, f"public share of {bank!r}")
    unsigned = Announcement(roster.digest(), party, bank, residue_bytes(public), _exchange_public(exchange_key), b"")
    return dataclasses.replace(unsigned, signature=signing_key.sign(unsigned.signed_bytes()))


def verify_announcement(
    rings: threshold.Rings,
    roster: Roster,
    message: Announcement,
    verify_keys: Mapping[str, Ed25519PublicKey],
) -> np.ndarray:
    """Check one bank's announcement on its own (what the relay checks as each arrives) and return its public share:
    a bank of the roster, this roster, its own party index, a valid signature under ``verify_keys[bank]``, a 32-byte
    exchange key, a key-level public share. Refused with :class:`CryptoError` naming the bank and the problem."""
    if not isinstance(message, Announcement):
        raise CryptoError(f"expected an announcement, got {type(message).__name__}")
    bank = message.bank
    if bank not in roster.banks:
        raise CryptoError(f"announcement from unknown bank {bank!r}: not in the roster {list(roster.banks)}")
    digest, party = roster.digest(), roster.party(bank)
    who = f"announcement of bank {bank!r}"
    if message.roster_sha256 != digest:
        raise CryptoError(
            f"{who} is for another roster (digest {message.roster_sha256[:16]}..., ours {digest[:16]}...)"
        )
    if message.party != party:
        raise CryptoError(f"{who} claims party {message.party}, but the roster makes it party {party}")
    if bank not in verify_keys:
        raise CryptoError(f"{who}: no verify key registered for bank {bank!r}")
    if len(message.signature) != SIGNATURE_BYTES:
        raise CryptoError(f"{who}: bad signature ({len(message.signature)} bytes, expected {SIGNATURE_BYTES})")
    try:
        verify_keys[bank].verify(message.signature, message.signed_bytes())
    except InvalidSignature:
        raise CryptoError(
            f"{who}: bad signature (forged, altered, or signed by another key than bank {bank!r}'s)"
        ) from None
    if len(message.exchange_key) != EXCHANGE_KEY_BYTES:
        raise CryptoError(
            f"{who}: exchange key of {len(message.exchange_key)} bytes, expected {EXCHANGE_KEY_BYTES} (X25519)"
        )
    public = parse_residues(message.public_share, rings.key.shape, f"{who}: public_share")
    return shamir.check_element(rings.key, public, f"{who}: public_share")


def verify_announcements(
    rings: threshold.Rings,
    roster: Roster,
    announcements: Sequence[Announcement],
    verify_keys: Mapping[str, Ed25519PublicKey],
) -> dict[int, np.ndarray]:
    """Check one announcement from every bank of the roster and return party -> public share residues.

    Refused, naming the bank and the problem: a missing, repeated or unknown bank; another roster; a party
    index that is not the bank's; a bad signature under ``verify_keys[bank]`` (forged, altered, or signed by
    someone else — a relay's substitute); an exchange key that is not 32 bytes or repeats another bank's; a
    public share that is not a key-level ring element."""
    by_bank: dict[str, Announcement] = {}
    for message in announcements:
        if not isinstance(message, Announcement):
            raise CryptoError(f"expected announcements, got {type(message).__name__}")
        if message.bank not in roster.banks:
            raise CryptoError(
                f"announcement from unknown bank {message.bank!r}: not in the roster {list(roster.banks)}"
            )
        if message.bank in by_bank:
            raise CryptoError(f"bank {message.bank!r} announced more than once (duplicate announcement)")
        by_bank[message.bank] = message
    missing = [bank for bank in roster.banks if bank not in by_bank]
    if missing:
        raise CryptoError(f"no announcement from banks {missing} (missing announcement)")

    shares: dict[int, np.ndarray] = {}
    exchange_keys: dict[bytes, str] = {}
    for bank in roster.banks:
        message = by_bank[bank]
        if message.exchange_key in exchange_keys:
            raise CryptoError(
                f"announcement of bank {bank!r}: the same exchange key as bank {exchange_keys[message.exchange_key]!r}"
            )
        exchange_keys[message.exchange_key] = bank
        shares[roster.party(bank)] = verify_announcement(rings, roster, message, verify_keys)
    return shares


def _by_party(
    roster: Roster, announcements: Mapping[int, Announcement] | Sequence[Announcement]
) -> dict[int, Announcement]:
    """Announcements keyed by party (they must already have passed :func:`verify_announcements`)."""
    items = list(announcements.items()) if isinstance(announcements, Mapping) else [(a.party, a) for a in announcements]
    out: dict[int, Announcement] = {}
    digest = roster.digest()
    for party, message in items:
        if not isinstance(message, Announcement) or message.party != party:
            raise CryptoError(f"announcements: the entry for party {party!r} is not that party's announcement")
        if message.roster_sha256 != digest:
            raise CryptoError(f"announcements: the one of party {party} is for another roster")
        if party in out:
            raise CryptoError(f"announcements: party {party} appears more than once")
        out[party] = message
    expected = set(range(1, len(roster.banks) + 1))
    missing, unknown = sorted(expected - set(out)), sorted(set(out) - expected, key=repr)
    if missing or unknown:
        raise CryptoError(
            f"announcements: missing parties {missing}, unknown parties {unknown} (every bank's verified "
            "announcement is needed, and no other)"
        )
    return out
