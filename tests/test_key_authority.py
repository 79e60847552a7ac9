"""Key authority rules, the key ceremony it relays, receipts, sealed storage and the audit chain (DESIGN §5.3 step 4).

Threshold CKKS: the key authority holds only ``s_0``; a sum decrypts with its partial decryption and ``t`` banks'
(``partial_decryption.BankDecryptor``), fused by the aggregator (``fused_values``). One key ceremony (3 banks,
t = 2) is run per module; each test gets a copy of the key authority's state directory (a restart of it) and fresh
bank ledgers, so the rules run against real shares without a ceremony per test.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks, packing, residue_sum, seal_residues, shamir, tenseal_chunks, threshold
from fedgl_secure.crypto.audit_log import AuditChainError, AuditLog, verify_audit_chain
from fedgl_secure.crypto.ceremony_messages import Announcement, Roster, verify_announcement
from fedgl_secure.crypto.held_share import HeldShare, unseal_held_share
from fedgl_secure.crypto.key_authority import (
    AGGREGATOR,
    AUTHORITY_SHARE_FILE,
    HE_PARAMETERS,
    PUBLIC_FILE,
    SEALED_FILE,
    KeyAuthority,
    Refusal,
)
from fedgl_secure.crypto.key_ceremony import BankCeremony
from fedgl_secure.crypto.partial_decryption import BankDecryptor, fused_values, partial_residues
from fedgl_secure.crypto.receipts import ReceiptFields, canonical_bytes, sign_receipt, verify_receipt
from fedgl_secure.crypto.residues import add_mod
from fedgl_secure.crypto.sealing import MAGIC, seal_secret_context, unseal_secret_context
from fedgl_secure.crypto.secure_summation import local_key_ceremony
from fedgl_secure.crypto.upload import RoundTicket, check_upload, make_upload, read_checked, upload_c1
from fedgl_secure.errors import (
    CiphertextError,
    ContextError,
    CryptoError,
    DecryptionRefused,
    PolicyError,
    ProtocolConflict,
    ReceiptError,
    SealError,
)
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.schema import Policy, Timeouts, policy_from_dict
from fedgl_secure.privacy.dp_round import noise_std

OPERATOR_SECRET = "correct horse battery staple"
FEDERATION = "fed-test"
BANKS = ("bank-a", "bank-b", "bank-c")
DECRYPTING = ("bank-a", "bank-b")  # the t = 2 banks that decrypt a sum unless a test says otherwise
LENGTH = 50


# --- the consortium: a key ceremony once, a copy of its state per test ----------------------------------------


@dataclass(frozen=True)
class Ceremony:
    """A finished key ceremony: the key authority's (closed) state directory, the banks' receipt-signing keys and
    the Shamir shares they keep (a bank keeps its HeldShare itself; its decryptor's state is its ledger)."""

    state_dir: Path
    policy: Policy
    keys: dict[str, Ed25519PrivateKey]
    held: dict[str, HeldShare]


def run_ceremony(root: Path, policy: Policy, banks: tuple[str, ...] = BANKS) -> Ceremony:
    """A key authority over a roster of ``banks`` (t from the policy), the banks registered, ``local_key_ceremony``
    run; everything closed again."""
    roster = Roster(FEDERATION, banks, policy.he.threshold, policy.digest)
    keys = {name: Ed25519PrivateKey.generate() for name in banks}
    authority = KeyAuthority(root / "ka", policy, OPERATOR_SECRET, roster)
    try:
        for name, key in keys.items():
            authority.register_bank(name, key.public_key())
        decryptors = local_key_ceremony(authority, keys, root / "ceremony-banks")
    finally:
        authority.close()
    for decryptor in decryptors.values():
        decryptor.close()
    return Ceremony(root / "ka", policy, keys, {name: d.held for name, d in decryptors.items()})


class Consortium:
    """A key authority (a copy of a ceremony's state directory), three banks' decryptors with fresh ledgers, and
    helpers to run a round against them as the aggregator would. Under a policy other than the ceremony's, a fresh
    ceremony is run first: the key is made under one policy."""

    def __init__(self, root: Path, ceremony: Ceremony, policy: Policy | None = None) -> None:
        if policy is not None and policy.digest != ceremony.policy.digest:  # the policy is bound into the key (R15)
            ceremony = run_ceremony(root / "ceremony", policy, tuple(ceremony.keys))
        self.root, self.state_dir = root, root / "ka"
        shutil.copytree(ceremony.state_dir, self.state_dir)
        self.policy = policy or ceremony.policy
        self.keys, self.held = ceremony.keys, ceremony.held
        self.roster = Roster(FEDERATION, tuple(ceremony.keys), self.policy.he.threshold, ceremony.policy.digest)
        self.values = {name: np.full(LENGTH, float(i + 1)) for i, name in enumerate(ceremony.keys)}
        self._start()

    def _start(self) -> None:
        self.authority = KeyAuthority(self.state_dir, self.policy, OPERATOR_SECRET, self.roster)
        self.public = ckks.load_public_context(self.authority.public_context)
        verify_keys = {name: key.public_key() for name, key in self.keys.items()}
        self.banks = {
            name: BankDecryptor(self.root / "banks" / name, self.policy, self.authority.rings, held, verify_keys)
            for name, held in self.held.items()
        }

    def close(self) -> None:
        for bank in self.banks.values():
            bank.close()
        self.authority.close()

    def restart(self) -> None:
        self.close()
        self._start()

    def open(self, round_number: int, participants=BANKS) -> RoundTicket:
        digest = self.policy.digest
        ticket = RoundTicket(
            FEDERATION, round_number, secrets.token_hex(16), tuple(participants), self.authority.fingerprint, digest
        )
        self.authority.open_round(FEDERATION, round_number, ticket.nonce, participants, digest)
        return ticket

    def uploads(self, ticket: RoundTicket, kind: str = "weights", senders=BANKS, values=None):
        values = self.values if values is None else values
        layout = self.policy.upload_layout(kind)
        return [
            make_upload(self.public, self.policy.he, ticket, name, self.keys[name], kind, values[name], layout=layout)
            for name in senders
        ]

    def c1s(self, uploads) -> list[np.ndarray]:
        """What the aggregator sends beside a sum: each receipted upload's c1 polynomials."""
        return [upload_c1(self.public, u.chunks) for u in uploads]

    def read(self, upload) -> residue_sum.ChunkedCiphertext:
        """The aggregator's reading of one upload (its chunks checked as ciphertexts)."""
        slots = self.slots(upload.kind, upload.length)
        return residue_sum.read_upload(self.public, upload.chunks, slots, upload.kind)

    def slots(self, kind: str, length: int) -> int:
        return packing.slot_length(self.policy.upload_layout(kind), length)

    def authority_partial(
        self, ticket, kind, uploads, role=AGGREGATOR, fingerprint=None, receipts=None, length=None, c1s=None
    ) -> np.ndarray:
        return self.authority.decrypt_sum(
            role,
            FEDERATION,
            ticket.round,
            kind,
            [u.receipt for u in uploads] if receipts is None else receipts,
            fingerprint or self.authority.fingerprint,
            self.slots(kind, uploads[0].length) if length is None else length,
            self.c1s(uploads) if c1s is None else c1s,
        )

    def bank_partials(self, ticket, kind, uploads, decrypting=DECRYPTING) -> list[np.ndarray]:
        receipts, c1s = [u.receipt for u in uploads], self.c1s(uploads)
        return [self.banks[name].partial(ticket.round, kind, receipts, c1s, list(decrypting)) for name in decrypting]

    def fuse(self, kind, uploads, partials) -> np.ndarray:
        summed = residue_sum.add(self.public, [self.read(u) for u in uploads])
        layout = self.policy.upload_layout(kind)
        return fused_values(self.public, summed, partials, uploads[0].length, layout, len(uploads))

    def decrypt(self, ticket, kind="weights", uploads=None, decrypting=DECRYPTING, **request) -> np.ndarray:
        """The aggregator's whole side: add, have the key authority and t banks partially decrypt, fuse, decode."""
        uploads = self.uploads(ticket, kind) if uploads is None else uploads
        partials = [self.authority_partial(ticket, kind, uploads, **request)]
        partials += self.bank_partials(ticket, kind, uploads, decrypting)
        return self.fuse(kind, uploads, partials)

    def coalition_authority_partial(self, kind, uploads) -> np.ndarray:
        """TEST ONLY: what a key authority in the coalition gives without any of its rules — c1_sum·s_0 + flooding,
        from its unsealed share."""
        level = self.authority.level
        total = np.zeros((len(self.c1s(uploads)[0]), *level.shape), dtype=np.uint64)
        for c1 in self.c1s(uploads):
            total = add_mod(total, c1, level)
        secret = np.ascontiguousarray(self.authority_secret()[: len(level.moduli)])
        return partial_residues(self.authority.rings, total, secret, self.policy.he.flooding_std())

    def authority_secret(self) -> np.ndarray:
        """TEST ONLY: s_0 (key level), unsealed from the state directory with the operator secret."""
        sealed = (self.state_dir / SEALED_FILE).read_bytes()
        return unseal_held_share(sealed, OPERATOR_SECRET, self.authority.rings).secret

    def collective_secret(self, chosen=(1, 2)) -> np.ndarray:
        """TEST ONLY: s = s_0 + Σ_b s_b at the data level, from s_0 and t banks' Shamir shares (Σ_j λ_j S_j = Σ_b s_b),
        which no library function forms."""
        level = self.authority.level
        total = self.authority_secret()[: len(level.moduli)].copy()
        factors = shamir.lagrange_factors(level, list(chosen))
        for party in chosen:
            share = self.held[self.roster.bank(party)].secret
            total = add_mod(total, shamir.scale_rows(level, share, factors[party]), level)
        return total


@pytest.fixture(scope="module")
def ceremony(tmp_path_factory, small_policy) -> Ceremony:
    return run_ceremony(tmp_path_factory.mktemp("ceremony"), small_policy)


@pytest.fixture
def consortium(tmp_path, ceremony):
    consortium = Consortium(tmp_path, ceremony)
    yield consortium
    consortium.close()


def _refused(reason, call):
    with pytest.raises(DecryptionRefused) as caught:
        call()
    assert caught.value.reason == reason.value, caught.value
    return caught.value


def _close(values, expected):
    np.testing.assert_allclose(values, expected, atol=HEParameters.UNPACKED_PRECISION)


# --- decryption ------------------------------------------------------------------------------------------------


def test_valid_request_decrypts_the_sum(consortium):
    _close(consortium.decrypt(consortium.open(1)), np.full(LENGTH, 6.0))


def test_the_key_authority_with_any_t_banks_decrypts_and_fewer_do_not(consortium):
    """Every decrypting set of t banks fuses to the sum (a new set for the same sum is served); the key authority's
    partial alone, or with t − 1 banks', decodes beyond the wrap-around bound and is refused, not decoded."""
    c = consortium
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    authority = c.authority_partial(ticket, "weights", uploads)
    for chosen in [("bank-a", "bank-b"), ("bank-a", "bank-c"), ("bank-b", "bank-c")]:
        partials = c.bank_partials(ticket, "weights", uploads, chosen)
        _close(c.fuse("weights", uploads, [authority, *partials]), np.full(LENGTH, 6.0))
        with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
            c.fuse("weights", uploads, [authority, partials[0]])
        with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
            c.fuse("weights", uploads, partials)  # t banks without the key authority
    with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
        c.fuse("weights", uploads, [authority])


def test_refusals_leave_the_authority_serving(consortium):
    c = consortium
    ticket = c.open(1)
    _refused(Refusal.NOT_AGGREGATOR, lambda: c.decrypt(ticket, role="bank"))
    _refused(Refusal.FOREIGN_CONTEXT, lambda: c.decrypt(ticket, fingerprint="ab" * 32))
    one = c.uploads(ticket, senders=("bank-a",))
    _refused(Refusal.BELOW_QUORUM, lambda: c.decrypt(ticket, uploads=one))
    a, b = c.uploads(ticket, senders=("bank-a", "bank-b"))
    _refused(Refusal.DUPLICATE_SENDER, lambda: c.decrypt(ticket, uploads=[a, b, a]))
    forged = sign_receipt(Ed25519PrivateKey.generate(), b.receipt.fields())  # b's fields, someone else's key
    _refused(Refusal.BAD_RECEIPT, lambda: c.decrypt(ticket, uploads=[a, b], receipts=[a.receipt, forged]))
    tampered = b.receipt.model_copy(update={"ciphertext_sha256": "0" * 64})
    _refused(Refusal.BAD_RECEIPT, lambda: c.decrypt(ticket, uploads=[a, b], receipts=[a.receipt, tampered]))
    _refused(Refusal.BAD_RECEIPT, lambda: c.decrypt(ticket, uploads=[a, b], receipts=[a.receipt, {"sender": "x"}]))
    other_kind = c.uploads(ticket, kind="predictions")
    _refused(
        Refusal.RECEIPT_MISMATCH,
        lambda: c.decrypt(ticket, uploads=[a, b], receipts=[u.receipt for u in other_kind[:2]]),
    )
    stranger = Ed25519PrivateKey.generate()
    alien = sign_receipt(stranger, b.receipt.fields().model_copy(update={"sender": "bank-z"}))
    _refused(Refusal.UNKNOWN_SENDER, lambda: c.decrypt(ticket, uploads=[a, b], receipts=[a.receipt, alien]))
    # after all that, a valid request is still served: nothing was consumed
    _close(c.decrypt(ticket), np.full(LENGTH, 6.0))


def test_stale_round_and_non_participant_are_refused(tmp_path, small_policy):
    """A roster of four banks, so that a round can leave one out and still reach the quorum of three."""
    four = (*BANKS, "bank-d")
    c = Consortium(tmp_path / "run", run_ceremony(tmp_path / "ceremony", small_policy, banks=four))
    try:
        first = c.open(1)
        old_uploads = c.uploads(first)
        second = c.open(2, participants=BANKS)
        _refused(Refusal.STALE_ROUND, lambda: c.decrypt(first, uploads=old_uploads))
        # receipts of round 1 replayed into round 2: bound to another round and nonce
        replay = replace(first, round=2)
        _refused(Refusal.RECEIPT_MISMATCH, lambda: c.decrypt(replay, uploads=old_uploads))
        _refused(Refusal.NOT_PARTICIPANT, lambda: c.decrypt(second, uploads=c.uploads(second, senders=four)))
        _close(c.decrypt(second, uploads=c.uploads(second)), np.full(LENGTH, 6.0))
    finally:
        c.close()


def test_no_open_round_is_refused(consortium):
    c = consortium
    ticket = RoundTicket(FEDERATION, 1, "ab" * 16, tuple(BANKS), c.authority.fingerprint, c.policy.digest)
    _refused(Refusal.NO_OPEN_ROUND, lambda: c.decrypt(ticket))


def test_each_round_and_kind_is_decrypted_once_even_across_restarts(consortium):
    c = consortium
    ticket = c.open(1)
    c.decrypt(ticket, kind="weights")
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(ticket, kind="weights"))
    public, share = c.authority.public_context, c.authority.authority_share.copy()
    c.restart()
    # the same share unsealed: the same public share and byte for byte the same collective context
    assert c.authority.public_context == public
    assert np.array_equal(c.authority.authority_share, share)
    assert c.authority.fingerprint == ckks.fingerprint(public)
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(ticket, kind="weights"))
    # a reopened round (fresh nonce) cannot be used to decrypt the same kind again either, at the key authority
    # or at a (restarted) bank, whose ledger holds the sum it decrypted
    reopened = c.open(1)
    fresh = c.uploads(reopened)
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(reopened, kind="weights", uploads=fresh))
    refusal = _refused(
        Refusal.ALREADY_DECRYPTED,
        lambda: c.banks["bank-a"].partial(1, "weights", [u.receipt for u in fresh], c.c1s(fresh), list(DECRYPTING)),
    )
    assert "decrypted for another sum" in refusal.detail
    # the restarted key authority's partial still fuses with the banks': its share is the one it had
    _close(c.decrypt(reopened, kind="predictions"), np.full(LENGTH, 6.0))
    assert verify_audit_chain(c.state_dir / "audit.jsonl").ok
    assert c.authority.verify_audit().ok


def test_restart_under_other_he_parameters_is_refused(consortium, small_policy):
    consortium.close()
    other = small_policy.model_copy(update={"he": HEParameters()})
    roster = Roster(FEDERATION, BANKS, 2, other.digest)
    with pytest.raises(ContextError, match="the key share was made for HE parameters"):
        KeyAuthority(consortium.state_dir, other, OPERATOR_SECRET, roster)
    consortium.restart()
    _close(consortium.decrypt(consortium.open(1)), np.full(LENGTH, 6.0))


def test_restart_with_another_roster_is_refused(consortium):
    c = consortium
    c.close()
    for roster in (
        Roster(FEDERATION, (*BANKS, "bank-d"), 2, c.policy.digest),  # a bank more
        Roster(FEDERATION, ("bank-b", "bank-a", "bank-c"), 2, c.policy.digest),  # another order: other party indices
        Roster("another-federation", BANKS, 2, c.policy.digest),
    ):
        with pytest.raises(ContextError, match="another federation or bank list"):
            KeyAuthority(c.state_dir, c.policy, OPERATOR_SECRET, roster)
    with pytest.raises(PolicyError, match="the roster's threshold 3 is not the policy's"):
        KeyAuthority(c.state_dir, c.policy, OPERATOR_SECRET, Roster(FEDERATION, BANKS, 3, c.policy.digest))
    with pytest.raises(SealError, match="wrong operator secret"):
        KeyAuthority(c.state_dir, c.policy, "not the operator secret at all", c.roster)
    # the policy is bound into the key (R15): another policy, even with its own roster, is refused naming both
    other = c.policy.model_copy(update={"timeouts": Timeouts(upload_seconds=c.policy.timeouts.upload_seconds + 1)})
    assert other.digest != c.policy.digest
    with pytest.raises(PolicyError, match=f"the roster binds policy {c.policy.digest[:12]}…, this key authority runs"):
        KeyAuthority(c.state_dir, other, OPERATOR_SECRET, c.roster)
    other_roster = Roster(FEDERATION, BANKS, 2, other.digest)
    with pytest.raises(
        ContextError, match=f"made under policy {c.policy.digest[:12]}…, this key authority runs {other.digest[:12]}"
    ):
        KeyAuthority(c.state_dir, other, OPERATOR_SECRET, other_roster)
    with pytest.raises(
        PolicyError, match=f"made under policy {c.policy.digest[:12]}…, the bank runs {other.digest[:12]}"
    ):
        BankDecryptor(
            c.root / "other-bank",
            other,
            c.authority.rings,
            c.held["bank-a"],
            {n: k.public_key() for n, k in c.keys.items()},
        )
    c.restart()  # none of that changed the state
    _close(c.decrypt(c.open(1)), np.full(LENGTH, 6.0))


def test_parameters_recorded_with_the_retired_mask_bits_still_match(consortium):
    """A state directory from before the ring pad recorded ``mask_bits``; the keys never depended on it."""
    recorded = json.loads(consortium.authority.ledger.get_meta(HE_PARAMETERS))
    consortium.authority.ledger.set_meta(HE_PARAMETERS, json.dumps({**recorded, "mask_bits": 0}))
    consortium.restart()
    _close(consortium.decrypt(consortium.open(1)), np.full(LENGTH, 6.0))


def test_c1_of_the_wrong_shape_or_not_the_signed_one_is_refused_and_consumes_nothing(consortium):
    c = consortium
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    c1s = c.c1s(uploads)

    def ask(c1s=c1s, length=LENGTH, uploads=uploads):
        return c.authority_partial(ticket, "weights", uploads, c1s=c1s, length=length)

    assert "for 3 receipts" in _refused(Refusal.WRONG_SHAPE, lambda: ask(c1s[:2])).detail
    assert (
        "expected 1 ciphertexts" in _refused(Refusal.WRONG_SHAPE, lambda: ask([c1s[0], c1s[1], c1s[2][[0, 0]]])).detail
    )
    signed = [c1s[0], c1s[1], c1s[2].astype(np.int64)]
    assert "must be uint64" in _refused(Refusal.WRONG_SHAPE, lambda: ask(signed)).detail
    unreduced = c1s[2].copy()
    unreduced[0, 0, 0] = c.authority.level.moduli[0]
    assert "at or above their prime" in _refused(Refusal.WRONG_SHAPE, lambda: ask([c1s[0], c1s[1], unreduced])).detail
    assert "the receipted uploads hold 50" in _refused(Refusal.WRONG_SHAPE, lambda: ask(length=LENGTH + 1)).detail
    # c1 swapped between banks, or changed in one residue: not the ones the receipts signed
    swapped = [c1s[1], c1s[0], c1s[2]]
    assert "not the ones it signed" in _refused(Refusal.NOT_A_SUM, lambda: ask(swapped)).detail
    altered = c1s[2].copy()
    altered[0, 1, 7] = (int(altered[0, 1, 7]) + 1) % c.authority.level.moduli[1]
    detail = _refused(Refusal.NOT_A_SUM, lambda: ask([c1s[0], c1s[1], altered])).detail
    assert "'bank-c'" in detail
    # receipts of uploads of different sizes
    longer = c.uploads(ticket, senders=("bank-c",), values={"bank-c": np.ones(LENGTH + 1)})
    mixed = [*uploads[:2], *longer]
    detail = _refused(Refusal.RECEIPT_MISMATCH, lambda: ask(c.c1s(mixed), uploads=mixed)).detail
    assert "disagree on the upload's size" in detail
    # nothing was consumed
    _close(c.decrypt(ticket, uploads=uploads), np.full(LENGTH, 6.0))


def test_the_key_authority_returns_residues_not_values(consortium):
    c = consortium
    ticket = c.open(1)
    view = c.authority_partial(ticket, "weights", c.uploads(ticket))
    assert view.dtype == np.uint64 and view.shape == (1, *c.authority.level.shape)
    assert np.all(view < c.authority.level.column())


def _solve_for_share(reply: np.ndarray, c1: np.ndarray, level) -> np.ndarray:
    """What an aggregator would try: it knows the summed c1 (it computes it, as the key authority does), and a reply
    ``c1·s_0 + E`` is linear in s_0, so s_0 = reply / c1 point by point in NTT form."""
    solved = np.empty(level.shape, dtype=np.uint64)
    for row, prime in enumerate(level.moduli):
        solved[row] = [int(r) * pow(int(x), -1, prime) % prime for r, x in zip(reply[row], c1[row], strict=True)]
    return solved


def test_a_reply_does_not_hand_the_aggregator_the_key_authoritys_share(consortium):
    """An exact ``c1·s_0`` of a c1 the aggregator knows gives s_0 away; each reply carries fresh flooding noise, so
    solving as above yields garbage. (The aggregator would then decrypt any upload with t colluding banks.)"""
    c = consortium
    rings, level = c.authority.rings, c.authority.level
    secret = c.authority_secret()[: len(level.moduli)]
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    c1 = c.c1s(uploads)
    total = add_mod(add_mod(c1[0][0], c1[1][0], level), c1[2][0], level)
    exact = seal_residues.multiply_residues(rings.context, level, total, secret)
    assert np.array_equal(_solve_for_share(exact, total, level), secret)  # why the flooding is needed
    reply = c.authority_partial(ticket, "weights", uploads)
    solved = _solve_for_share(reply[0], total, level)
    assert np.count_nonzero(solved == secret) < secret.size // 100
    _close(c.fuse("weights", uploads, [reply, *c.bank_partials(ticket, "weights", uploads)]), np.full(LENGTH, 6.0))


def test_open_round_refusals(consortium):
    c = consortium
    with pytest.raises(PolicyError, match="quorum"):
        c.open(1, participants=("bank-a",))
    with pytest.raises(PolicyError, match="not registered"):
        c.open(1, participants=("bank-a", "bank-x"))
    c.open(3)
    with pytest.raises(PolicyError, match="older than the open round 3"):
        c.open(2)
    with pytest.raises(PolicyError, match="already open with this nonce"):
        current = c.authority.ledger.current_round(FEDERATION)
        c.authority.open_round(FEDERATION, 3, current.nonce, BANKS, c.policy.digest)
    with pytest.raises(ReceiptError, match="different signing key"):
        c.authority.register_bank("bank-a", Ed25519PrivateKey.generate().public_key())


def test_disallowed_kind_is_refused(tmp_path, ceremony, small_policy):
    policy = small_policy.model_copy(update={"allowed_kinds": ("weights",)})
    c = Consortium(tmp_path, ceremony, policy)
    try:
        ticket = c.open(1)
        uploads = c.uploads(ticket, kind="embeddings")
        _refused(Refusal.KIND_NOT_ALLOWED, lambda: c.decrypt(ticket, kind="embeddings", uploads=uploads))
        _refused(Refusal.KIND_NOT_ALLOWED, lambda: c.bank_partials(ticket, "embeddings", uploads))
        _close(c.decrypt(ticket, kind="weights"), np.full(LENGTH, 6.0))
    finally:
        c.close()


def test_a_key_authority_serves_its_rosters_federation_only(consortium):
    c = consortium
    with pytest.raises(PolicyError, match="serves federation 'fed-test' only"):
        c.authority.open_round("theirs", 1, "ab" * 16, BANKS, c.policy.digest)
    c.open(1)
    with pytest.raises(DecryptionRefused) as refusal:
        c.authority.decrypt_sum(AGGREGATOR, "theirs", 1, "weights", [], c.authority.fingerprint, 1, [])
    assert refusal.value.reason == Refusal.FOREIGN_FEDERATION.value


# --- the key ceremony, relayed ----------------------------------------------------------------------------------


def test_the_ceremony_relay_checks_announcements_and_waits_for_every_bank(tmp_path, small_policy):
    roster = Roster(FEDERATION, BANKS, 2, small_policy.digest)
    authority = KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET, roster)
    try:
        keys = {name: Ed25519PrivateKey.generate() for name in BANKS}
        for name, key in keys.items():
            authority.register_bank(name, key.public_key())
        rings = authority.rings
        crp = threshold.common_random_polynomial(rings, roster.digest())
        banks = {name: BankCeremony(rings, roster, name, keys[name], crp) for name in BANKS}
        mine = banks["bank-a"].announcement()

        def not_ready(missing):
            with pytest.raises(ProtocolConflict) as caught:
                authority.public_context  # noqa: B018
            assert caught.value.code == "not-ready" and str(missing) in caught.value.detail
            assert authority.fingerprint is None and not authority.ceremony_complete

        not_ready(list(BANKS))
        assert not (tmp_path / "ka" / PUBLIC_FILE).exists()
        authority.open_round(FEDERATION, 1, "ab" * 16, BANKS, small_policy.digest)
        refusal = _refused(
            Refusal.FOREIGN_CONTEXT,
            lambda: authority.decrypt_sum(AGGREGATOR, FEDERATION, 1, "weights", [], "ab" * 32, 1, []),
        )
        assert "has not completed" in refusal.detail
        # a bank announcing in another's name (its own authenticated name is the caller)
        with pytest.raises(ProtocolConflict, match="'bank-b' cannot announce for 'bank-a'") as caught:
            authority.accept_announcement("bank-b", mine)
        assert caught.value.code == "not-your-share"
        # a bad signature: signed by another key, or a public share altered after signing
        forged = dataclasses.replace(mine, signature=keys["bank-b"].sign(mine.signed_bytes()))
        with pytest.raises(ProtocolConflict, match="announcement of bank 'bank-a': bad signature"):
            authority.accept_announcement("bank-a", forged)
        altered = bytearray(mine.public_share)
        altered[0] ^= 1
        with pytest.raises(ProtocolConflict, match="bad signature"):
            authority.accept_announcement("bank-a", dataclasses.replace(mine, public_share=bytes(altered)))
        # an announcement made for another roster (a replay from another ceremony), validly signed
        other = Roster("another-federation", BANKS, 2, small_policy.digest)
        foreign = BankCeremony(rings, other, "bank-a", keys["bank-a"], crp).announcement()
        with pytest.raises(ProtocolConflict, match="is for another roster"):
            authority.accept_announcement("bank-a", foreign)
        assert authority.announcements() == []
        # the real one, twice (a retry: a no-op), then a second, different one: refused, the first one kept
        authority.accept_announcement("bank-a", mine)
        authority.accept_announcement("bank-a", Announcement.from_json(mine.to_json()))
        second = BankCeremony(rings, roster, "bank-a", keys["bank-a"], crp).announcement()
        with pytest.raises(ProtocolConflict, match="'bank-a' already announced another key share") as caught:
            authority.accept_announcement("bank-a", second)
        assert caught.value.code == "already-announced"
        assert authority.announcements() == [mine]
        not_ready(["bank-b", "bank-c"])
        authority.accept_announcement("bank-b", banks["bank-b"].announcement())
        not_ready(["bank-c"])
        authority.accept_announcement("bank-c", banks["bank-c"].announcement())
        context = authority.public_context  # the last announcement completes the collective context
        assert authority.ceremony_complete and authority.fingerprint == ckks.fingerprint(context)
        assert (tmp_path / "ka" / PUBLIC_FILE).read_bytes() == context
        assert not ckks.load_public_context(context).has_secret_key()
        # dealing: only a bank's own envelopes, and never a second, different one to the same bank
        announcements = authority.announcements()
        verify = {name: key.public_key() for name, key in keys.items()}
        envelopes = {name: banks[name].deal(announcements, verify) for name in BANKS}
        with pytest.raises(ProtocolConflict, match="did not deal") as caught:
            authority.accept_envelopes("bank-b", envelopes["bank-a"])
        assert caught.value.code == "not-your-share"
        for name in BANKS:
            authority.accept_envelopes(name, envelopes[name])
        redealt = dataclasses.replace(envelopes["bank-a"][0], nonce=bytes(12))
        with pytest.raises(ProtocolConflict, match="already dealt another share") as caught:
            authority.accept_envelopes("bank-a", [redealt])
        assert caught.value.code == "already-dealt"
        held = {name: banks[name].finish(authority.envelopes_for(name), authority.authority_share) for name in BANKS}
        assert all(h.public_context == context for h in held.values())  # every party has the same context
        records = [json.loads(line) for line in (tmp_path / "ka" / "audit.jsonl").read_text().splitlines()]
        announced = [(r["bank"], r["decision"]) for r in records if r["event"] == "announce"]
        assert announced == [
            ("bank-a", "refused"),
            ("bank-a", "refused"),
            ("bank-a", "refused"),
            ("bank-a", "allowed"),
            ("bank-b", "allowed"),
            ("bank-c", "allowed"),
        ]
        assert [r["event"] for r in records].count("ceremony-complete") == 1
    finally:
        authority.close()
    # a restart keeps the ceremony: the same context, nothing to announce again
    again = KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET, roster)
    try:
        assert again.public_context == context and again.announcements() == announcements
    finally:
        again.close()


def _pieces(residues: np.ndarray) -> list[bytes]:
    """Substrings a file holding these residues would contain: each row's first 64 bytes (little-endian words, as
    every serialisation here writes them) and their base64 (the JSON messages' encoding)."""
    rows = [np.ascontiguousarray(row, dtype="<u8").tobytes()[:64] for row in residues]
    return rows + [base64.b64encode(row[:48]) for row in rows]


def _files(*directories: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for directory in directories for path in directory.rglob("*") if path.is_file()}


def test_the_state_directory_holds_no_secret_in_clear(consortium):
    """s_0 is on disk only sealed under the operator secret; no file holds a bank's share or the collective secret;
    the rest is public (the context, the public share, signed announcements, envelopes sealed to banks)."""
    c = consortium
    ticket = c.open(1)
    c.decrypt(ticket)  # the ledger and audit log as after a decryption
    c.close()
    files = _files(c.state_dir)
    names = {str(path.relative_to(c.state_dir)) for path in files}
    ceremony = {name for name in names if name.startswith("ceremony/")}
    assert names - ceremony <= {
        SEALED_FILE,
        AUTHORITY_SHARE_FILE,
        PUBLIC_FILE,
        "ledger.sqlite3",
        "ledger.sqlite3-wal",
        "ledger.sqlite3-shm",
        "audit.jsonl",
    }
    assert {Path(name).name.split("-")[0] for name in ceremony} == {"announcement", "envelope"}
    sealed = files[c.state_dir / SEALED_FILE]
    assert sealed.startswith(MAGIC)
    with pytest.raises(SealError, match="wrong operator secret"):
        unseal_secret_context(sealed, "an attacker's guess at the secret")
    level, key_level = c.authority.level, c.authority.rings.key
    s_0 = c.authority_secret()
    # the scan finds a secret where there is one: s_0 in the unsealed payload
    assert all(piece in unseal_secret_context(sealed, OPERATOR_SECRET) for piece in _pieces(s_0)[: len(s_0)])
    # and what it looks for as the collective secret is it: it decrypts an upload on its own
    upload = c.uploads(ticket, senders=("bank-c",))[0]
    ciphertext, size = tenseal_chunks.tenseal_ciphertext(c.public, upload.chunks[0], "bank-c")
    c0, c1 = seal_residues.ciphertext_polys(ciphertext, level)
    plain = add_mod(c0, seal_residues.multiply_residues(c.public, level, c1, c.collective_secret()), level)
    _close(seal_residues.decode(c.public, level, plain, ciphertext.scale)[:size], c.values["bank-c"])
    secrets_ = {
        "s_0": s_0,
        "s_0 in coefficients": seal_residues.from_ntt(c.authority.rings.key_context, key_level, s_0),
        "the collective secret": c.collective_secret(),
    }
    secrets_ |= {f"{name}'s Shamir share": held.secret for name, held in c.held.items()}
    for what, residues in secrets_.items():
        for piece in _pieces(residues):
            holders = [str(path) for path, data in files.items() if piece in data]
            assert not holders, f"{what} in {holders}"
    # the public files: the collective context (no secret key in it) and p_0
    context = ckks.load_public_context(files[c.state_dir / PUBLIC_FILE])
    assert not context.has_secret_key()
    assert files[c.state_dir / AUTHORITY_SHARE_FILE] == c.authority.authority_share.astype("<u8").tobytes()
    announcements = [Announcement.from_json(data) for path, data in files.items() if "announcement-" in path.name]
    verify = {name: key.public_key() for name, key in c.keys.items()}
    assert len(announcements) == len(BANKS)
    for announcement in announcements:
        verify_announcement(c.authority.rings, c.roster, announcement, verify)
    c._start()  # for the fixture's close


# --- the audit log ----------------------------------------------------------------------------------------------


def test_audit_log_records_every_decision_and_detects_tampering(consortium):
    c = consortium
    ticket = c.open(1)
    c.decrypt(ticket)
    _refused(Refusal.NOT_AGGREGATOR, lambda: c.decrypt(ticket, kind="predictions", role="bank"))
    path = c.state_dir / "audit.jsonl"
    report = verify_audit_chain(path)
    assert report.ok and report.broken_line is None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    decisions = [(r["event"], r["decision"], r.get("reason")) for r in records if r["event"] == "decrypt"]
    assert decisions == [("decrypt", "allowed", None), ("decrypt", "refused", "not-aggregator")]
    events = [r["event"] for r in records]
    assert events.count("announce") == len(BANKS) and events.count("ceremony-complete") == 1
    allowed = next(r for r in records if r["event"] == "decrypt")
    assert allowed["senders"] == list(BANKS) and allowed["flooding_std"] == c.policy.he.flooding_std()
    lines = path.read_text().splitlines(keepends=True)
    at = events.index("decrypt")  # the allowed decryption's line, 0-based
    # altering a line's content is pinned to that line
    altered = lines.copy()
    altered[at] = altered[at].replace('"decision":"allowed"', '"decision":"refused"')
    assert altered[at] != lines[at]
    path.write_text("".join(altered))
    report = verify_audit_chain(path)
    assert not report.ok and report.broken_line == at + 1 and "altered" in report.problem
    # removing a line breaks the next link
    path.write_text("".join(lines[:at] + lines[at + 1 :]))
    report = verify_audit_chain(path)
    assert report.broken_line == at + 1 and "prev" in report.problem
    # cutting the tail is caught at the next start against the head kept in the ledger
    path.write_text("".join(lines[:-1]))
    c.close()
    with pytest.raises(AuditChainError, match="cut from the end"):
        KeyAuthority(c.state_dir, c.policy, OPERATOR_SECRET, c.roster)
    path.write_text("".join(lines))
    c.restart()
    assert c.authority.verify_audit().ok


def test_audit_log_appends_across_reopen(tmp_path):
    log = AuditLog(tmp_path / "a.jsonl")
    log.append({"event": "x"})
    again = AuditLog(tmp_path / "a.jsonl", expected_head=log.head)
    again.append({"event": "y"})
    report = verify_audit_chain(tmp_path / "a.jsonl", expected_head=again.head)
    assert report.ok and report.lines == 2


# --- sealing and receipts ---------------------------------------------------------------------------------------


def test_sealed_secret_round_trips_and_wrong_secret_fails(tmp_path, small_policy):
    sealed = seal_secret_context(b"secret context bytes", OPERATOR_SECRET)
    assert b"secret context bytes" not in sealed
    assert unseal_secret_context(sealed, OPERATOR_SECRET) == b"secret context bytes"
    with pytest.raises(SealError, match="wrong operator secret"):
        unseal_secret_context(sealed, "another sixteen+ byte secret")
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    with pytest.raises(SealError, match="altered"):
        unseal_secret_context(bytes(flipped), OPERATOR_SECRET)
    with pytest.raises(SealError, match="bad header"):
        unseal_secret_context(b"xx", OPERATOR_SECRET)
    with pytest.raises(SealError, match="at least 16"):
        seal_secret_context(b"x", "short")
    # the key authority's share file is sealed from the start (before any bank announced); restarting with the
    # wrong secret fails clearly
    roster = Roster(FEDERATION, BANKS, 2, small_policy.digest)
    authority = KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET, roster)
    share = authority.authority_share.copy()
    authority.close()
    assert (tmp_path / "ka" / SEALED_FILE).read_bytes().startswith(MAGIC)
    with pytest.raises(SealError, match="wrong operator secret"):
        KeyAuthority(tmp_path / "ka", small_policy, "not the operator secret at all", roster)
    # an altered public share file is noticed
    (tmp_path / "ka" / AUTHORITY_SHARE_FILE).write_bytes(bytes(len(share.tobytes())))
    with pytest.raises(CryptoError, match="altered"):
        KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET, roster)
    (tmp_path / "ka" / AUTHORITY_SHARE_FILE).write_bytes(share.astype("<u8").tobytes())
    again = KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET, roster)
    assert np.array_equal(again.authority_share, share)
    again.close()


def test_receipts_sign_verify_and_bind_every_field():
    key = Ed25519PrivateKey.generate()
    fields = ReceiptFields(
        federation="f",
        round=1,
        nonce="ab" * 16,
        kind="weights",
        sender="bank-a",
        ciphertext_sha256="1" * 64,
        context_fingerprint="2" * 64,
        values=10,
        c1_sha256="3" * 64,
        policy_sha256="5" * 64,
        participants=("bank-a", "bank-b"),
    )
    receipt = sign_receipt(key, fields)
    verify_receipt(key.public_key(), receipt)
    assert canonical_bytes(fields).endswith(b'"values":10}')  # sorted keys
    changes = [("round", 2), ("kind", "predictions"), ("sender", "bank-b"), ("nonce", "cd" * 16), ("values", 11)]
    changes.append(("participants", ("bank-a", "bank-b", "bank-c")))
    for name, value in changes + [("c1_sha256", "4" * 64), ("policy_sha256", "6" * 64)]:
        with pytest.raises(ReceiptError, match="bad signature"):
            verify_receipt(key.public_key(), receipt.model_copy(update={name: value}))
    with pytest.raises(ReceiptError, match="bad signature"):
        verify_receipt(Ed25519PrivateKey.generate().public_key(), receipt)


def test_aggregator_checks_uploads_before_adding(consortium):
    c = consortium
    ticket = c.open(1)
    upload = c.uploads(ticket, senders=("bank-a",))[0]
    check_upload(upload, c.keys["bank-a"].public_key(), ticket, "bank-a")
    swapped = replace(upload, chunks=c.uploads(ticket, senders=("bank-b",))[0].chunks)
    with pytest.raises(ReceiptError, match="digest"):
        check_upload(swapped, c.keys["bank-a"].public_key(), ticket, "bank-a")
    with pytest.raises(ReceiptError, match="bound to another sender"):
        check_upload(upload, c.keys["bank-a"].public_key(), ticket, "bank-b")
    with pytest.raises(ReceiptError, match="bad signature"):
        check_upload(upload, c.keys["bank-b"].public_key(), ticket, "bank-a")
    # a receipt whose c1 digest is not its chunks' (signed by the bank itself): refused here, alone, before the
    # decryptors would refuse the whole sum
    fields = upload.receipt.fields().model_copy(update={"c1_sha256": "7" * 64})
    wrong_c1 = replace(upload, receipt=sign_receipt(c.keys["bank-a"], fields))
    check_upload(wrong_c1, c.keys["bank-a"].public_key(), ticket, "bank-a")  # signed, bound: only the c1 differs
    slots = c.slots(upload.kind, upload.length)
    np.testing.assert_array_equal(read_checked(c.public, upload, "bank-a", slots).c1, c.c1s([upload])[0])
    with pytest.raises(ReceiptError, match="c1 does not match"):
        read_checked(c.public, wrong_c1, "bank-a", slots)


# --- central DP noise -------------------------------------------------------------------------------------------


def central_noise_policy(he):
    """Central noise on weights and predictions; node_weight is public (no channel)."""
    channel = {"clip": 1.0, "noise_multiplier": 1.0, "noise": "central"}
    return policy_from_dict(
        {
            "he": he.model_dump(),
            "allowed_kinds": ["weights", "predictions", "node_weight"],
            "dp": {"weights": channel, "predictions": channel, "graph": {"max_degree": 3}},
            "budget": {"epsilon": 1000.0, "delta": 1e-5, "rounds": 10},
        }
    )


def test_central_noise_is_added_to_the_key_authoritys_partial_and_audited(tmp_path, ceremony, small_he):
    """The fused result (c0 + the key authority's partial with Encode(n) + t banks' partials) is s + N(0, σ²),
    Σŵ_k exact; audited."""
    policy = central_noise_policy(small_he)
    c = Consortium(tmp_path, ceremony, policy)
    n = 4000  # two chunks at N = 4096
    c.values = {name: np.linspace(-1.0, 1.0, n) * (i + 1) for i, name in enumerate(BANKS)}
    exact = sum(c.values.values())
    ticket = c.open(1)
    observed = {}
    try:
        for kind in ("weights", "predictions", "node_weight"):
            observed[kind] = c.decrypt(ticket, kind) - exact
    finally:
        c.close()

    # CKKS and flooding error at scale 2^62 stay far below 1e-3; the noise is σ ≥ 2
    weights, predictions, node_weight = observed["weights"], observed["predictions"], observed["node_weight"]
    assert abs(weights[-1]) < 1e-3  # Σ ŵ_k: public, never noised
    assert np.max(np.abs(node_weight)) < 1e-3  # no DP channel: exact
    for kind, noise in (("weights", weights[:-1]), ("predictions", predictions)):
        sigma = noise_std(policy, kind)
        # n ≈ 4000 i.i.d. N(0, σ²): the sample std is within 6/√(2n) ≈ 6.7 % of σ and the mean within 6σ/√n
        # except with probability < 1e-8 each; noise added twice (or by banks too) would push the std past 1.2σ
        assert abs(noise.std() / sigma - 1) < 6 / np.sqrt(2 * noise.size), kind
        assert abs(noise.mean()) < 6 * sigma / np.sqrt(noise.size), kind
    assert abs(np.corrcoef(weights[:-1], predictions[:-1])[0, 1]) < 6 / np.sqrt(n)  # fresh noise per kind

    records = [json.loads(line) for line in (c.state_dir / "audit.jsonl").read_text().splitlines()]
    allowed = {r["kind"]: r for r in records if r["event"] == "decrypt" and r["decision"] == "allowed"}
    assert allowed["weights"]["central_noise_std"] == noise_std(policy, "weights") == 2.0
    assert allowed["weights"]["central_noise_values"] == n - 1
    assert allowed["predictions"]["central_noise_std"] == pytest.approx(noise_std(policy, "predictions"))
    assert allowed["predictions"]["central_noise_values"] == n
    assert "central_noise_std" not in allowed["node_weight"]
    assert verify_audit_chain(c.state_dir / "audit.jsonl").ok


def test_without_a_central_channel_the_key_authority_adds_no_noise(tmp_path, ceremony, small_he):
    channel = {"clip": 1.0, "noise_multiplier": 1.0, "noise": "distributed"}
    policy = policy_from_dict(
        {
            "he": small_he.model_dump(),
            "allowed_kinds": ["weights", "node_weight"],
            "dp": {"weights": channel},
            "budget": {"epsilon": 1000.0, "delta": 1e-5, "rounds": 10},
        }
    )
    c = Consortium(tmp_path, ceremony, policy)
    try:
        assert c.authority.central_noise_std == {}
        _close(c.decrypt(c.open(1)), np.full(LENGTH, 6.0))
    finally:
        c.close()


def test_central_noise_too_wide_for_the_sums_range_is_refused_at_start(tmp_path, small_he):
    """The noise is added in the ring, so it must fit beside the banks' terms: 8σ below half the wrap-around bound."""
    policy = policy_from_dict(
        {
            "he": small_he.model_dump(),
            "allowed_kinds": ["weights", "node_weight"],
            "dp": {"weights": {"clip": 1.0, "noise_multiplier": 5000.0, "noise": "central"}},
            "budget": {"epsilon": 1000.0, "delta": 1e-5, "rounds": 10},
        }
    )
    assert noise_std(policy, "weights") == 10000.0  # 8σ = 80,000 > 2^(54 − 36 − 1) / 2 = 65,536
    with pytest.raises(PolicyError, match="does not fit the range"):
        KeyAuthority(tmp_path / "ka", policy, OPERATOR_SECRET, Roster(FEDERATION, BANKS, 2, policy.digest))
    assert not (tmp_path / "ka").exists()  # refused before any key share was made
