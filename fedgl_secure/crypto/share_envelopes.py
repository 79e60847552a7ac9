"""The key ceremony's share envelopes: a bank's Shamir shares, each sealed to the bank it is dealt to.

In the dealing step of the ceremony (``key_ceremony.py``) each bank Shamir-shares its secret ``s_b`` and seals
``f_b(j)`` for every other bank ``j`` in a :class:`ShareEnvelope`: ChaCha20-Poly1305 under HKDF-SHA256 of the
X25519 secret of the two banks' *announced* keys (``ceremony_messages.Announcement``), bound to the roster, both
parties and both announcements. Only bank ``j`` (or the dealer) can open it (:func:`open_envelopes`), and only an
envelope the dealer sealed for ``j`` opens. It sits above ``ceremony_messages.py`` (roster, announcements, framing)
and below the ceremony itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedgl_secure.crypto import shamir, threshold
from fedgl_secure.crypto.ceremony_messages import (
    DOMAIN,
    Announcement,
    Roster,
    _by_party,
    _exchange_public,
    _frame,
    _Message,
    _sha256,
    parse_residues,
    residue_bytes,
)
from fedgl_secure.errors import CryptoError

NONCE_BYTES = 12  # ChaCha20-Poly1305

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
