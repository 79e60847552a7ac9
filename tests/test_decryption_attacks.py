"""A malicious aggregator against the key authority (issue 27, part 1): the attacks measured at 3e230e3, as tests.

1. **Key recovery by averaging.** The old reply carried a fresh RLWE error of σ ≈ 3.2; one request with many
   copies of one chunk let the aggregator average the errors away, solve ``c0 + c1·s`` for ``s`` and decrypt any
   upload offline. The same attack is run here on the old reply (it recovers a key that decrypts a fresh
   ciphertext) and on the flooded reply (the "recovered" key decrypts nothing), and the request itself is refused.
2. **One bank's upload passed off as a sum** with a second bank's receipt attached: refused, since a decrypted
   ciphertext's ``c1`` must be exactly the sum of the receipted uploads' ``c1``.
"""

from __future__ import annotations

import dataclasses
import json
import secrets

import numpy as np
import pytest
import tenseal.sealapi as sealapi
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks, ring_mask
from fedgl_secure.crypto.key_authority import AGGREGATOR, KeyAuthority, Refusal
from fedgl_secure.crypto.masking import mask_sum
from fedgl_secure.crypto.upload import RoundTicket, check_upload, make_upload, upload_c1
from fedgl_secure.errors import DecryptionRefused, PolicyError, ReceiptError
from fedgl_secure.kinds import EMBEDDINGS, PREDICTIONS
from fedgl_secure.policy.schema import Policy

BANKS = ("bank-a", "bank-b", "bank-c")
FEDERATION = "fed-attack"
SECRET = "operator-secret-for-attack-tests"
COPIES = 1_000  # the measured attack sent 1,000 copies of one chunk in one request


@pytest.fixture
def consortium(tmp_path):
    """The baseline policy (packed, the defaults), a real key authority, three enrolled banks, one open round."""
    policy = Policy()
    authority = KeyAuthority(tmp_path / "ka", policy, SECRET)
    keys = {bank: Ed25519PrivateKey.generate() for bank in BANKS}
    for bank, key in keys.items():
        authority.register_bank(bank, key.public_key())
    ticket = RoundTicket(FEDERATION, 1, secrets.token_hex(16), len(BANKS), authority.fingerprint, policy.digest)
    authority.open_round(FEDERATION, 1, ticket.nonce, BANKS, policy.digest)
    public = ckks.load_public_context(authority.public_context)
    yield authority, public, keys, ticket, policy
    authority.close()


def _uploads(public, policy, ticket, keys, kind, length=300):
    rng = np.random.default_rng(7)
    layout = policy.upload_layout(kind)
    values = {bank: rng.uniform(layout.lower, layout.upper, length) for bank in BANKS}
    return [make_upload(public, policy.he, ticket, bank, keys[bank], kind, values[bank]) for bank in BANKS]


def _decrypt_padded_sum(authority, public, round_number, kind, summed, slots, receipts, c1s):
    """The aggregator's honest request for a sum: padded, with the receipts and each upload's c1."""
    padded = mask_sum(public, summed, slots).chunks
    return authority.decrypt_sum(
        AGGREGATOR, FEDERATION, round_number, kind, padded, receipts, authority.fingerprint, slots, c1s
    )


def _refused(reason: Refusal, call) -> DecryptionRefused:
    with pytest.raises(DecryptionRefused) as caught:
        call()
    assert caught.value.reason == reason.value, caught.value
    return caught.value


# --- the averaging attack, as an aggregator would run it ------------------------------------------------------


def _old_reply(secret, ciphertext, level) -> np.ndarray:
    """The reply before issue 27: ``c0 + c1·s − e`` with ``e`` a fresh RLWE error (SEAL's σ ≈ 3.2): the
    decryption of the ciphertext plus a fresh symmetric encryption of zero."""
    seal = secret.seal_context().data
    zero, total = sealapi.Ciphertext(), sealapi.Ciphertext()
    sealapi.Encryptor(seal, secret.secret_key().data).encrypt_zero_symmetric(list(level.parms_id), zero)
    zero.scale = ciphertext.scale
    sealapi.Evaluator(seal).add(ciphertext, zero, total)
    return ring_mask.decrypt(secret, total, level)


def _averaging_attack(public, level, ciphertext, replies) -> np.ndarray:
    """The aggregator's key recovery: the replies differ only by their errors; averaging the differences to the
    first reply estimates its error, which leaves ``c0 + c1·s`` exactly, and ``s = (that − c0) / c1`` point by
    point in NTT form. Returns the guessed key's NTT residues (k, N)."""
    base = replies[0]
    total = np.zeros(level.shape, dtype=np.uint64)
    for reply in replies[1:]:  # the NTT is linear: sum the differences first, transform once
        total = ring_mask.add_mod(total, ring_mask.sub_mod(reply, base, level), level)
    summed = ring_mask.centred_coefficients(level, ring_mask.from_ntt(public, level, total))
    mean = np.asarray(summed / (len(replies) - 1), dtype=np.float64)  # E[e_i] = 0: mean(e_i − e_0) ≈ −e_0
    first_error = -np.rint(mean).astype(np.int64)
    exact = ring_mask.sub_mod(
        base, ring_mask.to_ntt(public, level, ring_mask.signed_residues(level, first_error)), level
    )
    c0, c1 = ring_mask.ciphertext_polys(ciphertext, level)
    numerator = ring_mask.sub_mod(exact, c0, level)
    guessed = np.empty(level.shape, dtype=np.uint64)
    for row, prime in enumerate(level.moduli):
        guessed[row] = [int(n) * pow(int(c), -1, prime) % prime for n, c in zip(numerator[row], c1[row], strict=True)]
    return guessed


def _decrypts_with(public, level, key_ntt, values) -> float:
    """Largest error of decrypting a fresh encryption of ``values`` with a guessed key (``c0 + c1·key``)."""
    scale = 2.0**40
    chunk = ckks.encrypt_vector(public, values, 40)[0]
    ciphertext, size = ring_mask.tenseal_ciphertext(public, chunk, "fresh")
    c0, c1 = ring_mask.ciphertext_polys(ciphertext, level)
    plain = ring_mask.add_mod(c0, ring_mask.multiply_residues(public, level, c1, key_ntt), level)
    decoded = ring_mask.decode(public, level, plain, scale)[:size]
    return float(np.abs(decoded - values).max())


def test_averaging_many_replies_recovered_the_key_before_and_recovers_nothing_now(consortium):
    authority, public, keys, ticket, policy = consortium
    secret, level = authority._secret_context, authority.level  # the library's own key, for the comparison only
    uploads = _uploads(public, policy, ticket, keys, EMBEDDINGS)
    padded = mask_sum(public, uploads[0].chunks, policy.upload_layout(EMBEDDINGS).slots(300))
    target = ring_mask.load_ciphertext(secret, padded.chunks[0], level, "target")
    fresh = np.random.default_rng(3).uniform(-1, 1, 100)

    old = [_old_reply(secret, target, level) for _ in range(COPIES)]
    recovered = _averaging_attack(public, level, target, old)
    assert _decrypts_with(public, level, recovered, fresh) < 1e-3  # the old reply handed over the key

    flooded = [ring_mask.decrypt_flooded(secret, target, level, authority.flooding_std) for _ in range(COPIES)]
    guessed = _averaging_attack(public, level, target, flooded)
    assert _decrypts_with(public, level, guessed, fresh) > 1.0  # the "recovered" key decrypts nothing


def test_the_one_request_attack_is_refused_naming_the_problem(consortium):
    """1,000 copies of bank-a's chunk 0 in one request: more ciphertexts than the receipted uploads hold; the
    right number of copies: not their sum; and the audit log records each refusal."""
    authority, public, keys, ticket, policy = consortium
    uploads = _uploads(public, policy, ticket, keys, EMBEDDINGS)
    receipts = [u.receipt for u in uploads]
    c1s = [upload_c1(public, u.chunks) for u in uploads]
    layout = policy.upload_layout(EMBEDDINGS)
    slots = layout.slots(300)
    copy = mask_sum(public, uploads[0].chunks[:1], slots).chunks[0]

    def ask(chunks, length):
        return authority.decrypt_sum(
            AGGREGATOR, FEDERATION, 1, EMBEDDINGS, chunks, receipts, authority.fingerprint, length, c1s
        )

    detail = _refused(Refusal.WRONG_SHAPE, lambda: ask([copy] * COPIES, COPIES * 2048)).detail
    assert "the receipted uploads hold" in detail
    detail = _refused(Refusal.WRONG_SHAPE, lambda: ask([copy] * COPIES, slots)).detail
    assert f"{COPIES} ciphertexts sent" in detail
    assert "not the sum" in _refused(Refusal.NOT_A_SUM, lambda: ask([copy], slots)).detail
    reasons = [r.get("reason") for r in map(json.loads, authority.audit.path.read_text().splitlines())]
    assert reasons[-3:] == [Refusal.WRONG_SHAPE.value, Refusal.WRONG_SHAPE.value, Refusal.NOT_A_SUM.value]
    # nothing was consumed: the real sum still decrypts, once
    summed = ckks.add_serialized(public, [u.chunks for u in uploads])
    padded = mask_sum(public, summed, slots)
    assert ask(padded.chunks, slots).shape == (1, *authority.level.shape)
    assert "already decrypted" in _refused(Refusal.ALREADY_DECRYPTED, lambda: ask(padded.chunks, slots)).detail


def test_a_sum_is_never_decrypted_again_in_a_later_round(consortium):
    """A ciphertext already decrypted (same c1) is refused in every later request of the federation."""
    authority, public, keys, ticket, policy = consortium
    uploads = _uploads(public, policy, ticket, keys, PREDICTIONS)
    c1s = [upload_c1(public, u.chunks) for u in uploads]
    slots = policy.upload_layout(PREDICTIONS).slots(300)
    summed = ckks.add_serialized(public, [u.chunks for u in uploads])
    receipts = [u.receipt for u in uploads]
    _decrypt_padded_sum(authority, public, 1, PREDICTIONS, summed, slots, receipts, c1s)
    # round 2 replays round 1's uploads under fresh receipts the banks would sign for them
    second = RoundTicket(FEDERATION, 2, secrets.token_hex(16), len(BANKS), authority.fingerprint, policy.digest)
    authority.open_round(FEDERATION, 2, second.nonce, BANKS, policy.digest)
    from fedgl_secure.crypto.upload import sign_upload

    replayed = [
        sign_upload(public, second, u.receipt.sender, keys[u.receipt.sender], PREDICTIONS, u.chunks, 300)
        for u in uploads
    ]
    detail = _refused(
        Refusal.REPEATED_CIPHERTEXT,
        lambda: _decrypt_padded_sum(
            authority, public, 2, PREDICTIONS, summed, slots, [u.receipt for u in replayed], c1s
        ),
    ).detail
    assert "already decrypted in federation" in detail


def test_one_banks_upload_with_two_receipts_is_not_a_sum(consortium):
    """Item 2 of the issue: bank-a's ciphertext alone, with receipts from bank-a and bank-b (quorum 2 met)."""
    authority, public, keys, ticket, policy = consortium
    uploads = _uploads(public, policy, ticket, keys, PREDICTIONS)[:2]
    slots = policy.upload_layout(PREDICTIONS).slots(300)
    alone = mask_sum(public, uploads[0].chunks, slots).chunks
    receipts = [u.receipt for u in uploads]
    honest_c1 = [upload_c1(public, u.chunks) for u in uploads]

    def ask(c1s):
        return authority.decrypt_sum(
            AGGREGATOR, FEDERATION, 1, PREDICTIONS, alone, receipts, authority.fingerprint, slots, c1s
        )

    assert "not the sum of the 2 receipted uploads" in _refused(Refusal.NOT_A_SUM, lambda: ask(honest_c1)).detail
    # nor can the aggregator pass bank-a's c1 off as bank-b's, or leave bank-b's out
    lying = [honest_c1[0], honest_c1[0]]
    assert "not the ones it signed" in _refused(Refusal.NOT_A_SUM, lambda: ask(lying)).detail
    assert "for 2 receipts" in _refused(Refusal.NOT_A_SUM, lambda: ask(honest_c1[:1])).detail


def test_the_decryption_budget_the_flooding_holds_for_is_enforced(tmp_path):
    """A key authority refuses, naming the setting, once the ciphertexts it decrypted would exceed the policy's
    he.max_decryptions; the refusal consumes nothing."""
    policy = Policy(he=Policy().he.model_copy(update={"max_decryptions": 1}))
    authority = KeyAuthority(tmp_path / "ka", policy, SECRET)
    try:
        keys = {bank: Ed25519PrivateKey.generate() for bank in BANKS}
        for bank, key in keys.items():
            authority.register_bank(bank, key.public_key())
        public = ckks.load_public_context(authority.public_context)
        slots = policy.upload_layout(PREDICTIONS).slots(300)
        for round_number, expect_refusal in ((1, False), (2, True)):
            ticket = RoundTicket(
                FEDERATION, round_number, secrets.token_hex(16), 3, authority.fingerprint, policy.digest
            )
            authority.open_round(FEDERATION, round_number, ticket.nonce, BANKS, policy.digest)
            uploads = _uploads(public, policy, ticket, keys, PREDICTIONS)
            summed = ckks.add_serialized(public, [u.chunks for u in uploads])

            def ask(uploads=uploads, summed=summed, round_number=round_number):
                c1s = [upload_c1(public, u.chunks) for u in uploads]
                receipts = [u.receipt for u in uploads]
                return _decrypt_padded_sum(authority, public, round_number, PREDICTIONS, summed, slots, receipts, c1s)

            if expect_refusal:
                assert "he.max_decryptions = 1" in _refused(Refusal.BUDGET_EXHAUSTED, ask).detail
            else:
                ask()
    finally:
        authority.close()


def test_a_node_running_another_policy_is_refused_with_both_digests(consortium, tmp_path):
    """One policy for all: a round opened by an aggregator under another policy, and receipts a bank signed under
    another policy, are refused naming both digests (item 5 of the issue: banks sized DP noise by their own
    quorum while the key authority enforced its own)."""
    authority, public, keys, ticket, policy = consortium
    other = Policy(quorum=3)
    with pytest.raises(PolicyError) as opened:
        authority.open_round(FEDERATION, 2, secrets.token_hex(16), BANKS, other.digest)
    assert other.digest[:12] in str(opened.value) and policy.digest[:12] in str(opened.value)
    foreign = dataclasses.replace(ticket, policy_sha256=other.digest)
    uploads = _uploads(public, policy, foreign, keys, PREDICTIONS)
    slots = policy.upload_layout(PREDICTIONS).slots(300)
    summed = ckks.add_serialized(public, [u.chunks for u in uploads])
    detail = _refused(
        Refusal.POLICY_MISMATCH,
        lambda: _decrypt_padded_sum(
            authority,
            public,
            1,
            PREDICTIONS,
            summed,
            slots,
            [u.receipt for u in uploads],
            [upload_c1(public, u.chunks) for u in uploads],
        ),
    ).detail
    assert other.digest[:12] in detail and policy.digest[:12] in detail
    # and the aggregator refuses such an upload before adding it
    with pytest.raises(ReceiptError, match="every node must run the same policy file"):
        check_upload(uploads[0], keys["bank-a"].public_key(), ticket, "bank-a")


def test_the_policy_digest_is_canonical():
    """The same policy read twice gives the same digest; any setting changes it."""
    assert Policy().digest == Policy().digest == Policy.model_validate(Policy().model_dump()).digest
    assert Policy(quorum=3).digest != Policy().digest
    assert Policy(he=Policy().he.model_copy(update={"max_decryptions": 7})).digest != Policy().digest
    first = Policy()
    assert first.digest != first.model_copy(update={"quorum": 3}).digest  # never carried over by a copy
