"""The threshold-CKKS key ceremony as messages: the key authority and n banks over an untrusted relay.

``threshold.py`` has the mathematics of dealer-free key generation (Mouchet et al., PETS 2021, with the banks'
part t-of-n); this module has the messages that carry it between parties who only talk through a relay (the
aggregator) and the sealed form of what each party keeps afterwards. Party 0 is the key authority, bank ``i``
of the :class:`Roster` (consortium order) is party ``i + 1``.

1. **Roster.** Every party holds the same :class:`Roster` (federation, banks, threshold) and the banks' Ed25519
   receipt-signing verify keys. :meth:`Roster.digest` is bound into every message, so no message of one
   roster can be replayed into another.
2. **Announcements.** The key authority draws its key share ``(s_0, p_0)`` (``threshold.generate_key_share``)
   and publishes ``p_0`` over its own authenticated channel (this module does not carry it). Each bank
   (:class:`BankCeremony`) draws ``(s_b, p_b)`` and a fresh X25519 key and signs an :class:`Announcement` of
   ``p_b`` and that key. The relay broadcasts all announcements; :func:`verify_announcements` accepts them
   only if every bank of the roster signed its own, so the relay cannot put its own exchange key in a bank's
   place and receive that bank's shares.
3. **Dealing.** Each bank Shamir-shares ``s_b`` (``threshold.deal_shares``) and seals ``f_b(j)`` for every
   other bank ``j`` in a :class:`ShareEnvelope`: ChaCha20-Poly1305 under HKDF-SHA256 of the X25519 secret of
   the two banks' *announced* keys, bound to the roster, both parties and both announcements. Only bank
   ``j`` (or the dealer) can open it, and only an envelope the dealer sealed for ``j`` opens. The bank then
   drops ``s_b``: from here on it needs only its Shamir share.
4. **Finishing.** Each bank opens the envelopes addressed to it (:func:`open_envelopes`), adds its own share,
   keeps ``S_j = Σ_b f_b(j)`` (``threshold.combine_shares``) and computes the collective public context
   (:func:`collective_context`); the key authority computes the same context from the verified announcements.
   The result is a :class:`HeldShare`, stored sealed under the operator's secret (:func:`seal_held_share`).

The collective secret ``Σ s_i`` is never formed, and no message carries any party's secret in clear. What the
relay can still do is deny service: drop, duplicate or misroute messages — each is refused, naming the bank
and the problem. Parties should compare ``ckks.fingerprint`` of their public contexts before use: a relay
that shows different parties different (validly signed) announcements, e.g. replayed from an earlier
ceremony of the same roster, makes their contexts differ, and that comparison catches it.

Memory hygiene (dropping ``s_b``, zeroing arrays) is best effort: Python gives no guarantee that no copy
survives in freed memory.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedgl_secure.crypto import ckks, sealing, shamir, threshold
from fedgl_secure.errors import CryptoError

DOMAIN = b"fedgl-secure/key-ceremony/v1"
HELD_SHARE_MAGIC = b"fedgl-secure/held-share/v1\n"  # the sealed payload's first line: format and version
HELD_SHARE_VERSION = 1
EXCHANGE_KEY_BYTES = 32  # raw X25519 public key
SIGNATURE_BYTES = 64  # Ed25519
NONCE_BYTES = 12  # ChaCha20-Poly1305
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


# --- share envelopes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareEnvelope(_Message):
    """One Shamir share f_dealer(recipient), AEAD-encrypted to the recipient's announced X25519 key.

    The key is known only to the dealer and the recipient (X25519 of their announced keys), so the relay can
    neither read nor forge an envelope; the AAD binds roster, dealer and recipient, so it cannot re-address
    one either."""

    roster_sha256: str
    dealer: int
    recipient: int
    nonce: bytes  # 12 bytes
    ciphertext: bytes

    _TYPE: ClassVar[str] = "share-envelope"
    _WHAT: ClassVar[str] = "share envelope"


def _aad(digest: str, dealer: int, recipient: int) -> bytes:
    return DOMAIN + b"share-envelope" + _frame(digest.encode("ascii"), dealer, recipient)


def _envelope_key(
    roster: Roster,
    own: X25519PrivateKey,
    dealer: Announcement,
    recipient: Announcement,
    peer: Announcement,
) -> bytes:
    """HKDF-SHA256 of X25519(own key, ``peer``'s announced key), bound to the roster, both parties and both
    announcements (so a key agreed under one pair of announcements opens nothing sealed under another)."""
    try:
        shared = own.exchange(X25519PublicKey.from_public_bytes(peer.exchange_key))
    except ValueError as error:
        raise CryptoError(f"exchange key of {roster._describe(peer.party)} is unusable: {error}") from None
    info = (
        DOMAIN
        + b"share"
        + _frame(
            roster.digest().encode("ascii"),
            dealer.party,
            recipient.party,
            _sha256(dealer.signed_bytes()),
            _sha256(recipient.signed_bytes()),
        )
    )
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _check_own_exchange_key(roster: Roster, party: int, key: X25519PrivateKey, message: Announcement) -> None:
    if _exchange_public(key) != message.exchange_key:
        raise CryptoError(f"the exchange key given for {roster._describe(party)} is not the one it announced")


def seal_envelopes(
    rings: threshold.Rings,
    roster: Roster,
    dealer: int,
    exchange_key: X25519PrivateKey,
    announcements: Mapping[int, Announcement] | Sequence[Announcement],
    dealt: Mapping[int, np.ndarray],
) -> list[ShareEnvelope]:
    """Bank ``dealer``'s envelopes: ``dealt[j]`` (``threshold.deal_shares``' output) sealed for every other bank
    ``j`` under its announced exchange key; the dealer's own share is not sent (the caller keeps it).

    ``announcements`` must be the verified ones (:func:`verify_announcements`); ``exchange_key`` must be the
    one the dealer announced."""
    roster.bank(dealer)
    announced = _by_party(roster, announcements)
    _check_own_exchange_key(roster, dealer, exchange_key, announced[dealer])
    expected = set(range(1, len(roster.banks) + 1))
    if set(dealt) != expected:
        raise CryptoError(
            f"dealt shares for parties {sorted(dealt, key=repr)}, expected one for each bank 1..{len(expected)}"
        )
    digest = roster.digest()
    envelopes = []
    for recipient in sorted(expected - {dealer}):
        share = shamir.check_element(
            rings.data, dealt[recipient], f"share dealt by {roster._describe(dealer)} to {roster._describe(recipient)}"
        )
        key = _envelope_key(roster, exchange_key, announced[dealer], announced[recipient], announced[recipient])
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = ChaCha20Poly1305(key).encrypt(nonce, residue_bytes(share), _aad(digest, dealer, recipient))
        envelopes.append(ShareEnvelope(digest, dealer, recipient, nonce, ciphertext))
    return envelopes


def open_envelopes(
    rings: threshold.Rings,
    roster: Roster,
    recipient: int,
    exchange_key: X25519PrivateKey,
    announcements: Mapping[int, Announcement] | Sequence[Announcement],
    envelopes: Sequence[ShareEnvelope],
) -> dict[int, np.ndarray]:
    """Bank ``recipient``'s shares: exactly one envelope from every other bank, addressed to it, each opened
    and checked as a data-level ring element. Returns dealer -> share, without the recipient's own share
    (which it kept when dealing, and the caller adds).

    Refused, naming the dealer: a missing, repeated or foreign envelope (another roster, another recipient,
    a dealer that is no other bank), or one that does not open (tampered, or not sealed for this bank)."""
    roster.bank(recipient)
    announced = _by_party(roster, announcements)
    _check_own_exchange_key(roster, recipient, exchange_key, announced[recipient])
    digest, me = roster.digest(), roster._describe(recipient)
    by_dealer: dict[int, ShareEnvelope] = {}
    for envelope in envelopes:
        if not isinstance(envelope, ShareEnvelope):
            raise CryptoError(f"expected share envelopes, got {type(envelope).__name__}")
        source = roster._describe(envelope.dealer)
        if envelope.roster_sha256 != digest:
            raise CryptoError(f"the envelope from {source} is for another roster")
        if envelope.recipient != recipient:
            raise CryptoError(
                f"the envelope from {source} is addressed to {roster._describe(envelope.recipient)}, not to {me}"
            )
        if not 1 <= envelope.dealer <= len(roster.banks) or envelope.dealer == recipient:
            raise CryptoError(f"an envelope for {me} claims foreign dealer {source}: dealers are the other banks")
        if envelope.dealer in by_dealer:
            raise CryptoError(f"{source} sent {me} more than one envelope (duplicate)")
        by_dealer[envelope.dealer] = envelope
    missing = [roster._describe(p) for p in range(1, len(roster.banks) + 1) if p != recipient and p not in by_dealer]
    if missing:
        raise CryptoError(f"no envelope for {me} from {', '.join(missing)} (missing envelope)")

    shares: dict[int, np.ndarray] = {}
    for dealer in sorted(by_dealer):
        envelope, source = by_dealer[dealer], roster._describe(dealer)
        if len(envelope.nonce) != NONCE_BYTES:
            raise CryptoError(
                f"the envelope from {source}: nonce of {len(envelope.nonce)} bytes, expected {NONCE_BYTES}"
            )
        key = _envelope_key(roster, exchange_key, announced[dealer], announced[recipient], announced[dealer])
        try:
            payload = ChaCha20Poly1305(key).decrypt(
                envelope.nonce, envelope.ciphertext, _aad(digest, dealer, recipient)
            )
        except InvalidTag:
            raise CryptoError(
                f"the share dealt by {source} could not be opened (tampered, or not sealed for {me})"
            ) from None
        what = f"share dealt by {source} to {me}"
        shares[dealer] = shamir.check_element(rings.data, parse_residues(payload, rings.data.shape, what), what)
    return shares


# --- the collective public context -----------------------------------------------------------------------


def collective_context(
    rings: threshold.Rings,
    roster: Roster,
    crp: np.ndarray,
    authority_share: np.ndarray,
    bank_shares: Mapping[int, np.ndarray],
) -> bytes:
    """The collective public context (``threshold.public_context`` of ``(p_0 + Σ_b p_b, a)``), as bytes.

    Deterministic: every party that saw the same shares computes the same bytes, which is what lets them
    compare fingerprints. ``crp`` must be the roster's common random polynomial (seeded by its digest)."""
    a = shamir.check_element(rings.key, crp, "common random polynomial")
    if not np.array_equal(a, threshold.common_random_polynomial(rings, roster.digest())):
        raise CryptoError(
            f"the common random polynomial is not the roster's (federation {roster.federation!r}, its policy and banks)"
        )
    if threshold.AUTHORITY in bank_shares:
        raise CryptoError("bank_shares holds party 0: the key authority's public share is passed on its own")
    public_key = threshold.collective_public_key(
        rings, a, {threshold.AUTHORITY: authority_share, **bank_shares}, len(roster.banks)
    )
    return threshold.public_context(rings, public_key)


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


# --- one bank's side -----------------------------------------------------------------------------------


class BankCeremony:
    """One bank's side, step by step. Pure: no I/O, the caller relays the messages.

    ``__init__`` draws the bank's key share ``(s_b, p_b)`` and a fresh X25519 key; :meth:`announcement` is its
    signed public message; :meth:`deal` verifies everyone's announcements, deals and seals its Shamir shares
    and then drops ``s_b`` (a bank needs only its Shamir share afterwards, and a dropped secret cannot leak);
    :meth:`finish` opens the envelopes addressed to it and returns its :class:`HeldShare`. A step called out of
    order is a :class:`CryptoError` naming the step; a refused step changes nothing, so it can be retried with
    the right messages."""

    def __init__(
        self,
        rings: threshold.Rings,
        roster: Roster,
        bank: str,
        signing_key: Ed25519PrivateKey,
        crp: np.ndarray,
    ) -> None:
        self.rings, self.roster, self.bank = rings, roster, bank
        self.party = roster.party(bank)
        self._crp = shamir.check_element(rings.key, crp, "common random polynomial")
        self._key_share: threshold.KeyShare | None = threshold.generate_key_share(rings, self.party, self._crp)
        self._exchange_key: X25519PrivateKey | None = X25519PrivateKey.generate()
        self._announcement = announce(rings, roster, bank, self._key_share, self._exchange_key, signing_key)
        self._announced: dict[int, Announcement] | None = None
        self._public_shares: dict[int, np.ndarray] | None = None
        self._own_share: np.ndarray | None = None
        self._step = "announced"  # announced -> dealt -> finished

    def announcement(self) -> Announcement:
        """This bank's signed announcement (public; the same object at every call)."""
        return self._announcement

    def deal(
        self, announcements: Sequence[Announcement], verify_keys: Mapping[str, Ed25519PublicKey]
    ) -> list[ShareEnvelope]:
        """Verify every bank's announcement, deal Shamir shares of ``s_b`` and seal them for the other banks;
        keep the own share and drop ``s_b``. The relayed announcements must include this bank's own, unchanged."""
        if self._step != "announced" or self._key_share is None or self._exchange_key is None:
            raise CryptoError(f"deal: {self.bank!r} has already dealt (step {self._step!r})")
        public_shares = verify_announcements(self.rings, self.roster, announcements, verify_keys)
        announced = _by_party(self.roster, announcements)
        if announced[self.party] != self._announcement:
            raise CryptoError(f"deal: the announcement relayed for {self.bank!r} is not the one this bank made")
        dealt = threshold.deal_shares(self.rings, self._key_share, self.roster.threshold, len(self.roster.banks))
        envelopes = seal_envelopes(self.rings, self.roster, self.party, self._exchange_key, announced, dealt)
        self._own_share = dealt[self.party].copy()
        for share in dealt.values():  # views of one array holding every bank's share: best-effort wipe
            share.fill(0)
        self._key_share.secret.fill(0)
        self._key_share = None
        self._announced, self._public_shares = announced, public_shares
        self._step = "dealt"
        return envelopes

    def finish(self, envelopes: Sequence[ShareEnvelope], authority_share: np.ndarray) -> HeldShare:
        """Open the envelopes addressed to this bank, add its own share into ``S_j`` and build the collective
        public context with the key authority's public share ``p_0`` (obtained over its authenticated channel)."""
        if self._step != "dealt" or self._own_share is None or self._exchange_key is None:
            before = "call deal first" if self._step == "announced" else "already finished"
            raise CryptoError(f"finish: {self.bank!r} cannot finish at step {self._step!r} ({before})")
        assert self._announced is not None and self._public_shares is not None
        received = open_envelopes(self.rings, self.roster, self.party, self._exchange_key, self._announced, envelopes)
        received[self.party] = self._own_share
        combined = threshold.combine_shares(
            self.rings, self.party, received, self.roster.threshold, len(self.roster.banks)
        )
        context = collective_context(self.rings, self.roster, self._crp, authority_share, self._public_shares)
        held = HeldShare(self.party, self.roster, combined.secret, context)
        for share in received.values():
            share.fill(0)
        self._own_share, self._exchange_key = None, None
        self._step = "finished"
        return held
