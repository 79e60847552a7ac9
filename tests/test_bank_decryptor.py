"""crypto/partial_decryption.BankDecryptor: a bank's partial decryptions under its Shamir share, and their rules.

A bank checks what it decrypts itself (receipts against the federation's signing keys it holds, each upload's c1
against its receipt, the sum it computes), decrypts a (round, kind) for one sum only, each decrypting set once, a
summed c1 never again, within the query budget; its SQLite ledger keeps all that across a restart. One key ceremony
per module (``test_key_authority.run_ceremony``: 3 banks, t = 2, the small parameters).
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_key_authority import BANKS, FEDERATION, LENGTH, Ceremony, Consortium, run_ceremony

from fedgl_secure.crypto import ckks, residues, seal_residues, shamir, threshold
from fedgl_secure.crypto.partial_decryption import BankDecryptor, Refusal
from fedgl_secure.crypto.receipts import sign_receipt
from fedgl_secure.crypto.upload import RoundTicket, make_upload, sign_upload
from fedgl_secure.errors import CiphertextError, CryptoError, DecryptionRefused
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.packing_layout import flooding_std

KIND = "weights"
SET_AB, SET_AC = ["bank-a", "bank-b"], ["bank-a", "bank-c"]


@pytest.fixture(scope="module")
def ceremony(tmp_path_factory, small_policy) -> Ceremony:
    return run_ceremony(tmp_path_factory.mktemp("bank-ceremony"), small_policy)


@pytest.fixture
def consortium(tmp_path, ceremony):
    consortium = Consortium(tmp_path, ceremony)
    consortium.ticket = consortium.open(1)
    yield consortium
    consortium.close()


def _refused(reason: Refusal, match: str, call) -> DecryptionRefused:
    with pytest.raises(DecryptionRefused, match=match) as caught:
        call()
    assert caught.value.reason == reason.value, caught.value
    return caught.value


def _request(c: Consortium, uploads):
    return [u.receipt for u in uploads], c.c1s(uploads)


def test_a_bank_needs_every_banks_signing_key(tmp_path, ceremony, small_policy):
    keys = {name: key.public_key() for name, key in ceremony.keys.items() if name != "bank-c"}
    held, he = ceremony.held["bank-a"], small_policy.he
    rings = threshold.rings_for(he)
    with pytest.raises(CryptoError, match=r"no receipt-signing key for banks \['bank-c'\]"):
        BankDecryptor(tmp_path / "bank-a", small_policy, rings, held, keys)


def test_the_decrypting_set_must_be_exactly_t_banks_of_the_federation_with_this_one(consortium):
    c = consortium
    bank = c.banks["bank-a"]
    receipts, c1s = _request(c, c.uploads(c.ticket))

    def ask(chosen, who=bank):
        return who.partial(1, KIND, receipts, c1s, chosen)

    cases = [
        (["bank-a"], "fewer than the threshold t = 2"),
        (list(BANKS), "exactly t = 2 decrypt a sum"),
        (["bank-a", "bank-z"], "'bank-z' is not in the roster"),
        (["bank-a", "bank-a"], "appear more than once"),
        ([], "fewer than the threshold"),
    ]
    for chosen, problem in cases:
        _refused(Refusal.BAD_DECRYPTING_SET, problem, lambda chosen=chosen: ask(chosen))
    _refused(
        Refusal.BAD_DECRYPTING_SET, "'bank-c' is not in the decrypting set", lambda: ask(SET_AB, c.banks["bank-c"])
    )
    assert bank.decryption_count() == 0  # nothing consumed
    assert ask(SET_AB).shape == (1, *c.authority.level.shape)
    assert bank.decryption_count() == 1


def test_a_bank_checks_receipts_and_c1_itself_and_refusals_consume_nothing(consortium):
    c = consortium
    bank = c.banks["bank-b"]
    uploads = c.uploads(c.ticket)
    receipts, c1s = _request(c, uploads)
    a, b, _ = uploads
    authority = c.authority_partial(c.ticket, KIND, uploads)  # before the round is reopened below

    def ask(receipts=receipts, c1s=c1s, kind=KIND, round_number=1):
        return bank.partial(round_number, kind, receipts, c1s, SET_AB)

    _refused(Refusal.KIND_NOT_ALLOWED, "does not let 'raw_rows' leave a bank", lambda: ask(kind="raw_rows"))
    _refused(Refusal.BELOW_QUORUM, "1 valid receipts, the quorum is 3", lambda: ask([a.receipt], c1s[:1]))
    _refused(Refusal.BELOW_QUORUM, "2 valid receipts, the quorum is 3", lambda: ask([a.receipt, b.receipt], c1s[:2]))
    _refused(Refusal.DUPLICATE_SENDER, "two receipts from 'bank-a'", lambda: ask([a.receipt, a.receipt], c1s[:1] * 2))
    forged = sign_receipt(Ed25519PrivateKey.generate(), b.receipt.fields())
    _refused(Refusal.BAD_RECEIPT, "receipt 1: .*bad signature", lambda: ask([a.receipt, forged], c1s[:2]))
    _refused(Refusal.BAD_RECEIPT, "receipt 1", lambda: ask([a.receipt, {"sender": "x"}], c1s[:2]))
    alien = sign_receipt(Ed25519PrivateKey.generate(), b.receipt.fields().model_copy(update={"sender": "bank-z"}))
    _refused(Refusal.UNKNOWN_SENDER, "'bank-z'", lambda: ask([a.receipt, alien], c1s[:2]))
    # bound to another round, kind or context than the request says
    _refused(Refusal.RECEIPT_MISMATCH, "bound to another round", lambda: ask(round_number=2))
    _refused(Refusal.RECEIPT_MISMATCH, "bound to another kind", lambda: ask(kind="predictions"))
    foreign = RoundTicket(FEDERATION, 1, c.ticket.nonce, c.ticket.participants, "ab" * 32, c.policy.digest)
    other = make_upload(c.public, c.policy.he, foreign, "bank-c", c.keys["bank-c"], KIND, np.ones(LENGTH))
    detail = "bound to another context_fingerprint"
    _refused(Refusal.RECEIPT_MISMATCH, detail, lambda: ask([a.receipt, other.receipt], c.c1s([a, other])))
    # the round reopened with a fresh nonce: receipts of both nonces are not one sum
    reopened = c.open(1)
    late = c.uploads(reopened, senders=("bank-c",))[0]
    _refused(
        Refusal.RECEIPT_MISMATCH,
        "different round nonces",
        lambda: ask([a.receipt, b.receipt, late.receipt], c.c1s([a, b, late])),
    )
    other_policy = c.policy.model_copy(update={"quorum": 4})
    signed = sign_receipt(
        c.keys["bank-b"], b.receipt.fields().model_copy(update={"policy_sha256": other_policy.digest})
    )
    _refused(Refusal.POLICY_MISMATCH, "signed under policy", lambda: ask([a.receipt, signed], c1s[:2]))
    # c1 polynomials: the number of uploads, their shape, and the ones the receipts signed
    _refused(Refusal.WRONG_SHAPE, "c1 polynomials of 2 uploads sent for 3 receipts", lambda: ask(c1s=c1s[:2]))
    _refused(Refusal.WRONG_SHAPE, "expected 1 ciphertexts", lambda: ask(c1s=[c1s[0], c1s[1], c1s[2][[0, 0]]]))
    _refused(
        Refusal.NOT_A_SUM, "given for 'bank-b' are not the ones it signed", lambda: ask(c1s=[c1s[0], c1s[0], c1s[2]])
    )
    assert bank.decryption_count() == 0
    partials = [authority, ask(), c.banks["bank-a"].partial(1, KIND, receipts, c1s, SET_AB)]
    np.testing.assert_allclose(
        c.fuse(KIND, uploads, partials), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION
    )


def test_one_sum_per_round_and_kind_each_decrypting_set_once_and_the_ledger_survives_a_restart(consortium):
    c = consortium
    uploads = c.uploads(c.ticket)
    receipts, c1s = _request(c, uploads)
    authority = c.authority_partial(c.ticket, KIND, uploads)
    a_ab = c.banks["bank-a"].partial(1, KIND, receipts, c1s, SET_AB)
    b_ab = c.banks["bank-b"].partial(1, KIND, receipts, c1s, SET_AB)
    _refused(
        Refusal.ALREADY_DECRYPTED,
        r"already decrypted for the decrypting set \[1, 2\]",
        lambda: c.banks["bank-a"].partial(1, KIND, receipts, c1s, list(reversed(SET_AB))),
    )
    # a new decrypting set for the same sum (the aggregator retrying without bank-b): served, once
    a_ac = c.banks["bank-a"].partial(1, KIND, receipts, c1s, SET_AC)
    c_ac = c.banks["bank-c"].partial(1, KIND, receipts, c1s, SET_AC)
    expected = np.full(LENGTH, 6.0)
    for pair in ([a_ab, b_ab], [a_ac, c_ac]):
        np.testing.assert_allclose(
            c.fuse(KIND, uploads, [authority, *pair]), expected, atol=HEParameters.UNPACKED_PRECISION
        )
    # partials made for different decrypting sets carry different Lagrange weights: they do not fuse
    with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
        c.fuse(KIND, uploads, [authority, a_ab, c_ac])
    assert c.banks["bank-a"].decryption_count() == 2
    # another sum for the same (round, kind): bank-a's and bank-c's uploads with a fresh one from bank-b
    other = c.uploads(c.ticket, senders=("bank-b",))
    receipts_other, c1s_other = _request(c, [uploads[0], *other, uploads[2]])

    def another_sum(bank):
        return c.banks[bank].partial(1, KIND, receipts_other, c1s_other, ["bank-b", "bank-c"])

    for _ in range(2):  # before and after a restart: the ledger is on disk
        _refused(Refusal.ALREADY_DECRYPTED, "decrypted for another sum", lambda: another_sum("bank-c"))
        _refused(
            Refusal.ALREADY_DECRYPTED,
            "already decrypted for the decrypting set",
            lambda: c.banks["bank-a"].partial(1, KIND, receipts, c1s, SET_AC),
        )
        assert c.banks["bank-a"].decryption_count() == 2 and c.banks["bank-b"].decryption_count() == 1
        c.restart()
    # the summed c1, replayed into a later round under fresh receipts: never decrypted again
    second = c.open(2)
    replayed = [
        sign_upload(c.public, second, u.receipt.sender, c.keys[u.receipt.sender], KIND, u.chunks, LENGTH)
        for u in uploads
    ]
    _refused(
        Refusal.REPEATED_CIPHERTEXT,
        "already decrypted in federation",
        lambda: c.banks["bank-a"].partial(2, KIND, *_request(c, replayed), SET_AB),
    )
    # a fresh sum in round 2 is served
    receipts_2, c1s_2 = _request(c, c.uploads(second))
    assert c.banks["bank-a"].partial(2, KIND, receipts_2, c1s_2, SET_AB).shape == (1, *c.authority.level.shape)


def test_the_budget_is_enforced_and_survives_a_restart(tmp_path, ceremony, small_policy):
    """he.max_decryptions counts every ciphertext a share partially decrypted, new decrypting sets included."""
    policy = small_policy.model_copy(update={"he": small_policy.he.model_copy(update={"max_decryptions": 2})})
    c = Consortium(tmp_path, ceremony, policy)  # for the public context, the shares and the signing keys
    verify = {name: key.public_key() for name, key in c.keys.items()}
    fingerprint = ckks.fingerprint(c.authority.public_context)

    def decryptor():
        return BankDecryptor(tmp_path / "budget-bank", policy, c.authority.rings, c.held["bank-a"], verify)

    def request(round_number):
        ticket = RoundTicket(FEDERATION, round_number, secrets.token_hex(16), tuple(BANKS), fingerprint, policy.digest)
        uploads = [make_upload(c.public, policy.he, ticket, name, c.keys[name], KIND, c.values[name]) for name in BANKS]
        return _request(c, uploads)

    bank = decryptor()
    try:
        first = request(1)
        bank.partial(1, KIND, *first, SET_AB)
        bank.partial(1, KIND, *first, SET_AC)
        assert bank.decryption_count() == 2
        second = request(2)
        _refused(Refusal.BUDGET_EXHAUSTED, "he.max_decryptions = 2", lambda: bank.partial(2, KIND, *second, SET_AB))
        bank.close()
        bank = decryptor()
        assert bank.decryption_count() == 2
        _refused(
            Refusal.BUDGET_EXHAUSTED,
            "2 ciphertexts decrypted under this share",
            lambda: bank.partial(2, KIND, *second, SET_AB),
        )
    finally:
        bank.close()
        c.close()


def test_a_bank_partial_is_its_weighted_share_times_the_sum_plus_flooding(consortium):
    """``c1·λ_j·S_j + E`` with E of the policy's flooding σ: the reply minus the exact product is a small-integer
    polynomial of that standard deviation (not zero: an exact product of a known c1 would hand over λ_j·S_j)."""
    c = consortium
    rings, level = c.authority.rings, c.authority.level
    uploads = c.uploads(c.ticket)
    receipts, c1s = _request(c, uploads)
    reply = c.banks["bank-b"].partial(1, KIND, receipts, c1s, SET_AB)[0]
    total = np.zeros(level.shape, dtype=np.uint64)
    for c1 in c1s:
        total = residues.add_mod(total, c1[0], level)
    factors = shamir.lagrange_factors(level, [1, 2])[2]
    weighted = shamir.scale_rows(level, c.held["bank-b"].secret, factors)
    exact = seal_residues.multiply_residues(rings.context, level, total, weighted)
    error = residues.centred_coefficients(
        level, seal_residues.from_ntt(rings.context, level, residues.sub_mod(reply, exact, level))
    )
    error = np.asarray(error, dtype=np.float64)
    he = c.policy.he
    sigma = flooding_std(he.poly_modulus_degree, he.max_banks, he.statistical_security, he.max_decryptions)
    assert sigma == c.banks["bank-b"].flooding_std > 2 ** (he.statistical_security / 2)
    # 4096 draws: the sample std is within 10 % of σ except with probability far below 1e-6
    assert abs(error.std() / sigma - 1) < 0.1
    assert abs(error.mean()) < 6 * sigma / np.sqrt(error.size)
