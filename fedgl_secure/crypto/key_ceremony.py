"""The threshold-CKKS key ceremony as messages: the key authority and n banks over an untrusted relay.

``threshold.py`` has the mathematics of dealer-free key generation (Mouchet et al., PETS 2021, with the banks'
part t-of-n); this module has one bank's side of the ceremony (:class:`BankCeremony`) and the collective public
context every party computes (:func:`collective_context`). The messages that carry it between parties who only
talk through a relay (the aggregator) are in ``ceremony_messages.py`` (roster, announcements) and
``share_envelopes.py`` (sealed Shamir shares); the sealed form of what each party keeps afterwards is in
``held_share.py``. Party 0 is the key authority, bank ``i`` of the :class:`Roster` (consortium order) is party
``i + 1``.

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

from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedgl_secure.crypto import shamir, threshold
from fedgl_secure.crypto.ceremony_messages import Announcement, Roster, _by_party, announce, verify_announcements
from fedgl_secure.crypto.held_share import HeldShare
from fedgl_secure.crypto.share_envelopes import ShareEnvelope, open_envelopes, seal_envelopes
from fedgl_secure.errors import CryptoError

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
