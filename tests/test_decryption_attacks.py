"""A malicious aggregator, alone or with the key authority and t − 1 banks, against threshold decryption (issue 27).

No party holds the secret key: a sum decrypts only with the key authority's partial decryption ``c1·s_0 + E`` and
t banks' ``c1·λ_j·S_j + E_j``, each decryptor multiplying its share by a ``c1`` **it sums itself** from receipted
uploads. Under the baseline policy (packed, the defaults; 3 banks, t = 2):

1. **Key recovery by averaging.** A reply with a small fresh error (σ ≈ 3.2) for a known ``c1`` averages out over
   many replies and hands over ``s_0``, which with t colluding banks decrypts anything; the flooded reply
   recovers nothing, and the key authority gives one reply per summed ``c1`` anyway (ledger, budget).
2. **The one-request attack** (1,000 copies of one chunk) and **one bank's upload passed off as a sum**: refused,
   naming the problem; the partials of a real sum do not decrypt one upload.
3. **A coalition of the aggregator, the key authority and t − 1 banks** holding all their secrets cannot decrypt one
   bank's upload, and the honest bank outside it refuses to help; the key authority with t banks decrypts the sum.
4. With more banks than the quorum, no two sums of one round over different bank sets decrypt (R13).
5. No state file of any party holds the collective secret.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from pathlib import Path

import numpy as np
import pytest
from test_key_authority import BANKS, FEDERATION, OPERATOR_SECRET, Ceremony, Consortium, run_ceremony

from fedgl_secure.crypto import ckks, packing, seal_residues, shamir, tenseal_chunks
from fedgl_secure.crypto.key_authority import AGGREGATOR, Refusal
from fedgl_secure.crypto.partial_decryption import fused_values
from fedgl_secure.crypto.residues import add_mod, centred_coefficients, signed_residues, sub_mod
from fedgl_secure.crypto.sealing import unseal_secret_context
from fedgl_secure.crypto.upload import check_upload, sign_upload
from fedgl_secure.errors import CiphertextError, DecryptionRefused, PolicyError, ReceiptError
from fedgl_secure.kinds import EMBEDDINGS, PREDICTIONS
from fedgl_secure.policy.schema import Policy

COPIES = 1_000  # the measured attack sent 1,000 copies of one chunk in one request
REPLIES = 1_500  # replies averaged: enough that SEAL's σ = 3.2 averages to an exact key (all 4096 coefficients)
SMALL_ERROR_STD = 3.2  # a fresh RLWE error, SEAL's σ: what a reply without flooding would carry
LENGTH = 300


@pytest.fixture(scope="module")
def ceremony(tmp_path_factory) -> Ceremony:
    return run_ceremony(tmp_path_factory.mktemp("attack-ceremony"), Policy())


@pytest.fixture
def consortium(tmp_path, ceremony):
    """The baseline policy, a copy of the key authority's state, three banks' decryptors, round 1 open."""
    consortium = Consortium(tmp_path, ceremony)
    consortium.ticket = consortium.open(1)
    yield consortium
    consortium.close()


def _values(policy: Policy, kind: str, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    layout = policy.upload_layout(kind)
    return {bank: rng.uniform(layout.lower, layout.upper, LENGTH) for bank in BANKS}


def _refused(reason: Refusal, call) -> DecryptionRefused:
    with pytest.raises(DecryptionRefused) as caught:
        call()
    assert caught.value.reason == reason.value, caught.value
    return caught.value


def _receipts(uploads):
    return [u.receipt for u in uploads]


def _summed_c1(c: Consortium, uploads) -> np.ndarray:
    """Σ c1 of the uploads' first chunk: what every decryptor multiplies its share by (and the aggregator knows)."""
    level = c.authority.level
    total = np.zeros(level.shape, dtype=np.uint64)
    for c1 in c.c1s(uploads):
        total = add_mod(total, c1[0], level)
    return total


def _polys(c: Consortium, chunk: bytes) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(c0, c1, scale, slots) of one serialised chunk."""
    ciphertext, size = tenseal_chunks.tenseal_ciphertext(c.public, chunk, "chunk")
    c0, c1 = seal_residues.ciphertext_polys(ciphertext, c.authority.level)
    return c0, c1, float(ciphertext.scale), size


def _banks_part(c: Consortium, chosen: tuple[int, ...]) -> np.ndarray:
    """TEST ONLY: Σ_{j ∈ chosen} λ_j·S_j, what t colluding banks hold together (= Σ_b s_b)."""
    level = c.authority.level
    factors = shamir.lagrange_factors(level, list(chosen))
    total = np.zeros(level.shape, dtype=np.uint64)
    for party in chosen:
        share = c.held[c.roster.bank(party)].secret
        total = add_mod(total, shamir.scale_rows(level, share, factors[party]), level)
    return total


# --- 1. the averaging attack ----------------------------------------------------------------------------------


def _errors_ntt(c: Consortium, coefficients: np.ndarray) -> np.ndarray:
    level = c.authority.level
    return seal_residues.to_ntt(c.authority.rings.context, level, signed_residues(level, coefficients))


def _differences(c: Consortium, base: np.ndarray, product: np.ndarray, std: float, rng) -> np.ndarray:
    """Σ (reply_i − base) over REPLIES − 1 more replies ``c1·s_0 + E_i`` to the same request, E_i rounded Gaussians
    of σ ``std`` as ``partial_residues`` draws them. The NTT is linear, so this is NTT(Σ E_i) + (REPLIES − 1)·(c1·s_0 −
    base): drawn here with one transform instead of one per reply (the attacker sums the same differences)."""
    level = c.authority.level
    count, errors = REPLIES - 1, np.zeros(level.degree, dtype=np.int64)
    for start in range(0, count, 250):
        batch = min(250, count - start)
        errors += np.rint(rng.normal(0.0, std, size=(batch, level.degree))).astype(np.int64).sum(axis=0)
    shift = (sub_mod(product, base, level) * np.uint64(count)) % level.column()  # < 2^47: no overflow
    return add_mod(_errors_ntt(c, errors), shift, level)


def _averaging_attack(c: Consortium, base: np.ndarray, differences: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """The aggregator's recovery of s_0 from the first reply ``base`` and the sum of the other replies' differences
    to it: the replies differ only by their errors; averaging the differences estimates the first reply's error,
    which leaves ``c1·s_0`` exactly, and ``s_0 = that / c1`` point by point in NTT form. Returns the guessed share's
    NTT residues (k, N)."""
    rings, level = c.authority.rings, c.authority.level
    summed = centred_coefficients(level, seal_residues.from_ntt(rings.context, level, differences))
    mean = np.asarray(summed / (REPLIES - 1), dtype=np.float64)  # E[E_i] = 0: mean(E_i − E_0) ≈ −E_0
    exact = sub_mod(base, _errors_ntt(c, -np.rint(mean).astype(np.int64)), level)
    guessed = np.empty(level.shape, dtype=np.uint64)
    for row, prime in enumerate(level.moduli):
        guessed[row] = [int(n) * pow(int(x), -1, prime) % prime for n, x in zip(exact[row], c1[row], strict=True)]
    return guessed


def _decrypts_with(c: Consortium, authority_share: np.ndarray, values: np.ndarray) -> float:
    """Largest error of decrypting a fresh encryption of ``values`` with a guessed s_0 and t = 2 colluding banks'
    shares (banks 2 and 3): ``c0 + c1·(s_0 + λ_2 S_2 + λ_3 S_3)``."""
    level = c.authority.level
    c0, c1, scale, size = _polys(c, ckks.encrypt_vector(c.public, values, 40)[0])
    key = add_mod(authority_share, _banks_part(c, (2, 3)), level)
    plain = add_mod(c0, seal_residues.multiply_residues(c.public, level, c1, key), level)
    return float(np.abs(seal_residues.decode(c.public, level, plain, scale)[:size] - values).max())


def test_averaging_many_replies_recovers_the_share_without_flooding_and_nothing_with_it(consortium):
    c = consortium
    rings, level = c.authority.rings, c.authority.level
    secret = c.authority_secret()[: len(level.moduli)]  # the library's own share, for the comparison only
    uploads = c.uploads(c.ticket, EMBEDDINGS, values=_values(c.policy, EMBEDDINGS))
    total = _summed_c1(c, uploads)
    fresh = np.random.default_rng(3).uniform(-1, 1, 100)
    product = seal_residues.multiply_residues(rings.context, level, total, secret)

    # the real reply, and what the key authority would say to the same request again: no second reply
    reply = c.authority_partial(c.ticket, EMBEDDINGS, uploads)
    assert reply.shape == (1, *level.shape)
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.authority_partial(c.ticket, EMBEDDINGS, uploads))

    # had it answered REPLIES times with a small fresh error, the aggregator would hold s_0 ...
    rng = np.random.default_rng(27)
    small = add_mod(product, _errors_ntt(c, np.rint(rng.normal(0.0, SMALL_ERROR_STD, level.degree))), level)
    recovered = _averaging_attack(c, small, _differences(c, small, product, SMALL_ERROR_STD, rng), total)
    assert np.array_equal(recovered, secret)
    assert _decrypts_with(c, recovered, fresh) < 1e-3  # and, with t colluding banks, decrypt anything
    # ... with the policy's flooding (the real reply first), the "recovered" share decrypts nothing
    flooded = _differences(c, reply[0], product, c.authority.flooding_std, rng)
    guessed = _averaging_attack(c, reply[0], flooded, total)
    assert np.count_nonzero(guessed == secret) < secret.size // 100
    assert _decrypts_with(c, guessed, fresh) > 1.0


# --- 2. requests that are not a sum ---------------------------------------------------------------------------


def test_the_one_request_attack_is_refused_naming_the_problem(consortium):
    """The measured attack sent 1,000 copies of bank-a's chunk in one request; decryptors now get no ciphertext,
    only each receipted upload's c1. 1,000 copies of bank-a's c1: more c1 polynomials or values than the receipted
    uploads hold; the right number of copies: not the c1 the receipts signed; 1,000 copies of its receipt: a
    duplicate sender. The key authority audits each refusal, a bank refuses the same, and nothing is consumed."""
    c = consortium
    values = _values(c.policy, EMBEDDINGS)
    uploads = c.uploads(c.ticket, EMBEDDINGS, values=values)
    receipts, c1s = _receipts(uploads), c.c1s(uploads)
    slots = c.slots(EMBEDDINGS, LENGTH)
    copy = c1s[0]  # bank-a's

    def ask(c1s, length=slots, receipts=receipts):
        return c.authority.decrypt_sum(
            AGGREGATOR, FEDERATION, 1, EMBEDDINGS, receipts, c.authority.fingerprint, length, c1s
        )

    detail = _refused(Refusal.WRONG_SHAPE, lambda: ask([copy] * COPIES)).detail
    assert f"c1 polynomials of {COPIES} uploads sent for 3 receipts" in detail
    many = [np.repeat(copy, COPIES, axis=0), c1s[1], c1s[2]]  # one "upload" of 1,000 chunks
    assert "the receipted uploads hold" in _refused(Refusal.WRONG_SHAPE, lambda: ask(many, COPIES * 2048)).detail
    assert "expected 1 ciphertexts" in _refused(Refusal.WRONG_SHAPE, lambda: ask(many)).detail
    assert "not the ones it signed" in _refused(Refusal.NOT_A_SUM, lambda: ask([copy] * 3)).detail
    duplicate = _refused(Refusal.DUPLICATE_SENDER, lambda: ask([copy] * COPIES, receipts=[receipts[0]] * COPIES))
    assert "two receipts from 'bank-a'" in duplicate.detail
    reasons = [r.get("reason") for r in map(json.loads, c.authority.audit.path.read_text().splitlines())]
    assert reasons[-5:] == [Refusal.WRONG_SHAPE.value] * 3 + [Refusal.NOT_A_SUM.value, Refusal.DUPLICATE_SENDER.value]
    bank = c.banks["bank-b"]
    for c1_list, reason in (([copy] * COPIES, Refusal.WRONG_SHAPE), ([copy] * 3, Refusal.NOT_A_SUM)):
        _refused(reason, lambda c1_list=c1_list: bank.partial(1, EMBEDDINGS, receipts, c1_list, ["bank-a", "bank-b"]))
    assert bank.decryption_count() == 0
    # nothing was consumed: the real sum still decrypts, once
    fused = c.decrypt(c.ticket, EMBEDDINGS, uploads=uploads)
    layout = c.policy.upload_layout(EMBEDDINGS)
    assert np.abs(fused - sum(values.values())).max() <= len(BANKS) * layout.step / 2 + 1e-9
    assert "already decrypted" in _refused(Refusal.ALREADY_DECRYPTED, lambda: ask(c1s)).detail


def test_a_sum_is_never_decrypted_again_in_a_later_round(consortium):
    """A summed c1 already decrypted is refused in every later request of the federation, by the key authority
    (part of every decryption) and by the banks that decrypted it."""
    c = consortium
    uploads = c.uploads(c.ticket, PREDICTIONS, values=_values(c.policy, PREDICTIONS))
    c.decrypt(c.ticket, PREDICTIONS, uploads=uploads)
    # round 2 replays round 1's uploads under fresh receipts the banks would sign for them
    second = c.open(2)
    replayed = [
        sign_upload(c.public, second, u.receipt.sender, c.keys[u.receipt.sender], PREDICTIONS, u.chunks, LENGTH)
        for u in uploads
    ]
    detail = _refused(Refusal.REPEATED_CIPHERTEXT, lambda: c.authority_partial(second, PREDICTIONS, replayed)).detail
    assert "already decrypted in federation" in detail
    for name in ("bank-a", "bank-b"):  # the decrypting set of round 1
        _refused(
            Refusal.REPEATED_CIPHERTEXT,
            lambda name=name: c.banks[name].partial(
                2, PREDICTIONS, _receipts(replayed), c.c1s(replayed), ["bank-a", "bank-b"]
            ),
        )


def test_one_banks_upload_with_the_quorums_receipts_is_not_a_sum(consortium):
    """Bank-a's ciphertext alone, with receipts from bank-a, bank-b and bank-c (the quorum met; item 2 of the issue):
    every c1 the aggregator can send is refused but the real ones, whose sum the decryptors multiply their shares by —
    and those partials decrypt the sum, not bank-a's upload."""
    c = consortium
    values = _values(c.policy, PREDICTIONS)
    uploads = c.uploads(c.ticket, PREDICTIONS, values=values)
    a = uploads[0]
    receipts, c1s = _receipts(uploads), c.c1s(uploads)
    c1_a = c1s[0]

    def ask(c1s):
        return c.authority_partial(c.ticket, PREDICTIONS, uploads, c1s=c1s)

    # the aggregator cannot pass bank-a's c1 off as the others', nor leave theirs out
    assert "not the ones it signed" in _refused(Refusal.NOT_A_SUM, lambda: ask([c1_a] * len(uploads))).detail
    assert f"for {len(uploads)} receipts" in _refused(Refusal.WRONG_SHAPE, lambda: ask([c1_a])).detail
    bank = c.banks["bank-c"]
    _refused(
        Refusal.NOT_A_SUM, lambda: bank.partial(1, PREDICTIONS, receipts, [c1_a] * len(uploads), ["bank-b", "bank-c"])
    )
    # with the real c1, every decryptor multiplies its share by Σ c1: fused on bank-a's ciphertext alone, that is
    # garbage beyond the wrap-around bound, refused; on the sum, the sum
    partials = [ask(c1s)]
    partials += [
        c.banks[name].partial(1, PREDICTIONS, receipts, c1s, ["bank-b", "bank-c"]) for name in ("bank-b", "bank-c")
    ]
    layout = c.policy.upload_layout(PREDICTIONS)
    with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
        fused_values(c.public, c.read(a), partials, LENGTH, layout, 1)
    fused = c.fuse(PREDICTIONS, uploads, partials)
    assert np.abs(fused - sum(values.values())).max() <= len(uploads) * layout.step / 2 + 1e-9


def test_the_decryption_budget_the_flooding_holds_for_is_enforced(tmp_path):
    """The key authority and every bank refuse, naming the setting, once the ciphertexts they decrypted would exceed
    the policy's he.max_decryptions; the refusal consumes nothing."""
    policy = Policy(he=Policy().he.model_copy(update={"max_decryptions": 1}))
    c = Consortium(tmp_path / "run", run_ceremony(tmp_path / "ceremony", policy))
    try:
        values = _values(policy, PREDICTIONS)
        first = c.open(1)
        summed = c.uploads(first, PREDICTIONS, values=values)
        c.decrypt(first, PREDICTIONS, uploads=summed)
        second = c.open(2)
        uploads = c.uploads(second, PREDICTIONS, values=values)
        for _ in range(2):  # refused twice: the first refusal consumed nothing, nor changed the reason
            detail = _refused(Refusal.BUDGET_EXHAUSTED, lambda: c.authority_partial(second, PREDICTIONS, uploads))
            assert "he.max_decryptions = 1" in detail.detail
        receipts, c1s = _receipts(uploads), c.c1s(uploads)
        for name in ("bank-a", "bank-b"):
            detail = _refused(
                Refusal.BUDGET_EXHAUSTED,
                lambda name=name: c.banks[name].partial(2, PREDICTIONS, receipts, c1s, ["bank-a", "bank-b"]),
            )
            assert "he.max_decryptions = 1" in detail.detail
        # a new decrypting set for round 1's sum (allowed once, normally) is counted against the budget too
        _refused(
            Refusal.BUDGET_EXHAUSTED,
            lambda: c.banks["bank-a"].partial(1, PREDICTIONS, _receipts(summed), c.c1s(summed), ["bank-a", "bank-c"]),
        )
        # bank-c spent nothing so far: it would serve, which is no use without the key authority's partial
        assert c.banks["bank-c"].decryption_count() == 0
        assert c.authority.ledger.decryption_count() == 1
    finally:
        c.close()


def test_a_node_running_another_policy_is_refused_with_both_digests(consortium):
    """One policy for all: a round opened by an aggregator under another policy, and receipts a bank signed under
    another policy, are refused naming both digests (item 5 of the issue: banks sized DP noise by their own
    quorum while the key authority enforced its own), by the key authority and by every bank."""
    c = consortium
    policy, other = c.policy, Policy(quorum=4)
    with pytest.raises(PolicyError) as opened:
        c.authority.open_round(FEDERATION, 2, secrets.token_hex(16), BANKS, other.digest)
    assert other.digest[:12] in str(opened.value) and policy.digest[:12] in str(opened.value)
    foreign = dataclasses.replace(c.ticket, policy_sha256=other.digest)
    uploads = c.uploads(foreign, PREDICTIONS, values=_values(policy, PREDICTIONS))
    detail = _refused(Refusal.POLICY_MISMATCH, lambda: c.authority_partial(c.ticket, PREDICTIONS, uploads)).detail
    assert other.digest[:12] in detail and policy.digest[:12] in detail
    detail = _refused(Refusal.POLICY_MISMATCH, lambda: c.bank_partials(c.ticket, PREDICTIONS, uploads)).detail
    assert other.digest[:12] in detail and policy.digest[:12] in detail
    # and the aggregator refuses such an upload before adding it
    with pytest.raises(ReceiptError, match="every node must run the same policy file"):
        check_upload(uploads[0], c.keys["bank-a"].public_key(), c.ticket, "bank-a")


def test_the_policy_digest_is_canonical():
    """The same policy read twice gives the same digest; any setting changes it."""
    assert Policy().digest == Policy().digest == Policy.model_validate(Policy().model_dump()).digest
    assert Policy(quorum=4).digest != Policy().digest
    assert Policy(he=Policy().he.model_copy(update={"max_decryptions": 7})).digest != Policy().digest
    assert Policy(quorum=4, he=Policy().he.model_copy(update={"threshold": 3})).digest != Policy(quorum=4).digest
    first = Policy()
    assert first.digest != first.model_copy(update={"quorum": 4}).digest  # never carried over by a copy


# --- 3. coalitions ------------------------------------------------------------------------------------------


def test_a_coalition_of_the_aggregator_the_key_authority_and_t_minus_1_banks_cannot_decrypt_one_upload(consortium):
    """The coalition holds every ciphertext, s_0 (unsealed with the operator secret) and one bank's Shamir share
    (t − 1 = 1). Whatever Lagrange weight it gives that share (any decrypting set, or none), bank-a's upload decodes
    to garbage — off the truth as far as uniformly random residues decode, beyond the wrap-around bound — while the
    collective secret (TEST ONLY) decrypts it."""
    c = consortium
    level = c.authority.level
    values = _values(c.policy, PREDICTIONS)
    layout = c.policy.upload_layout(PREDICTIONS)
    a = c.uploads(c.ticket, PREDICTIONS, values=values)[0]
    c0, c1, scale, size = _polys(c, a.chunks[0])
    s_0 = c.authority_secret()[: len(level.moduli)]

    def decoded(key_part: np.ndarray) -> np.ndarray:
        plain = add_mod(c0, seal_residues.multiply_residues(c.public, level, c1, key_part), level)
        return seal_residues.decode(c.public, level, plain, scale, complex_slots=True)[:size]

    truth = decoded(add_mod(s_0, _banks_part(c, (1, 2)), level))  # the target is real
    assert np.abs(packing.decode_sum(truth, layout, LENGTH, 1) - values["bank-a"]).max() <= layout.step / 2 + 1e-9
    bound = float(np.prod([float(q) for q in level.moduli])) / (2 * scale)
    # slots of uniformly random residues: per part σ = (Q/√12)·√(N/2)/scale = bound·(2/√12)·√(N/2), and the modulus
    # of a complex Gaussian has median 1.18 σ; a wrong key share leaves c1·(its error) uniform modulo Q
    garbage_median = 1.18 * (2 / np.sqrt(12)) * np.sqrt(level.degree / 2) * bound
    authority_part = seal_residues.multiply_residues(c.public, level, c1, s_0)
    for colluder in ("bank-b", "bank-c"):
        party = c.roster.party(colluder)
        share = c.held[colluder].secret
        weights = [shamir.lagrange_factors(level, sorted(chosen))[party] for chosen in ((1, party), (2, 3))]
        for factors in [*weights, (1,) * len(level.moduli)]:
            weighted = shamir.scale_rows(level, share, factors)
            guess = decoded(add_mod(s_0, weighted, level))
            error = np.abs(guess - truth)
            assert np.median(error) > garbage_median / 4, (colluder, factors)
            assert np.median(np.abs(guess)) > bound, (colluder, factors)
            bank_part = seal_residues.multiply_residues(c.public, level, c1, weighted)
            with pytest.raises(CiphertextError, match="beyond the wrap-around bound"):
                fused_values(c.public, c.read(a), [authority_part[None], bank_part[None]], LENGTH, layout, 1)


def test_the_honest_bank_refuses_one_upload_and_sums_made_with_replayed_or_forged_receipts(consortium):
    """Coalition: the aggregator, the key authority and bank-b; bank-a the target; bank-c honest. Bank-c refuses
    bank-a's upload alone and beside the colluder's alone (below the quorum of 3), and once round 1's sum is decrypted,
    any other 'sum' of that round — with a zero bank-b signs now in place of its upload — and bank-a's old receipt in a
    later round."""
    c = consortium
    assert c.policy.quorum == c.policy.he.threshold + 1  # the smallest quorum the policy admits for this t
    values = _values(c.policy, PREDICTIONS)
    uploads = c.uploads(c.ticket, PREDICTIONS, values=values)
    a, b, own = uploads
    honest = c.banks["bank-c"]
    decrypting = ["bank-b", "bank-c"]

    def ask(round_number, parts):
        return honest.partial(round_number, PREDICTIONS, _receipts(parts), c.c1s(parts), decrypting)

    zeros = {"bank-b": np.zeros(LENGTH)}
    forged = c.uploads(c.ticket, PREDICTIONS, senders=("bank-b",), values=zeros)[0]  # the colluder signs a zero
    for parts in ([a], [a, b], [a, forged]):
        detail = _refused(Refusal.BELOW_QUORUM, lambda parts=parts: ask(1, parts)).detail
        assert f"{len(parts)} valid receipts, the quorum is 3" in detail
    _refused(Refusal.BELOW_QUORUM, lambda: c.authority_partial(c.ticket, PREDICTIONS, [a, forged]))
    # round 1's real sum, decrypted by the key authority and bank-b, bank-c
    c.decrypt(c.ticket, PREDICTIONS, uploads=uploads, decrypting=decrypting)
    detail = _refused(Refusal.ALREADY_DECRYPTED, lambda: ask(1, [a, forged, own])).detail
    assert "decrypted for another sum" in detail
    # the real sum again for the same decrypting set: no second reply
    _refused(Refusal.ALREADY_DECRYPTED, lambda: ask(1, uploads))
    # round 2: bank-a's round-1 upload and receipt beside a fresh zero from bank-b and bank-c's fresh upload
    second = c.open(2)
    zero = c.uploads(second, PREDICTIONS, senders=("bank-b",), values=zeros)[0]
    fresh = c.uploads(second, PREDICTIONS, senders=("bank-c",), values=values)[0]
    detail = _refused(Refusal.RECEIPT_MISMATCH, lambda: ask(2, [a, zero, fresh])).detail
    assert "'bank-a' is bound to another round" in detail
    assert honest.decryption_count() == 1


def test_a_coalition_with_t_minus_1_banks_learns_only_a_sum_over_two_honest_banks(consortium):
    """The coalition of the aggregator, the key authority (its share s_0 given outright) and bank-b (t − 1 = 1 bank,
    whose upload is a zero it signed) tries to decrypt bank-a's upload. Any sum the honest decryptors serve has at
    least the quorum (t + 1 = 3) banks in it, so besides the coalition's zero it holds two honest uploads: the best
    the coalition gets is bank-a's and bank-c's sum, never bank-a's upload."""
    c = consortium
    values = _values(c.policy, PREDICTIONS)
    layout = c.policy.upload_layout(PREDICTIONS)
    a = c.uploads(c.ticket, PREDICTIONS, values=values)[0]
    own = c.uploads(c.ticket, PREDICTIONS, senders=("bank-c",), values=values)[0]
    zero = c.uploads(c.ticket, PREDICTIONS, senders=("bank-b",), values={"bank-b": np.zeros(LENGTH)})[0]
    for honest in ("bank-a", "bank-c"):  # whichever honest bank completes the decrypting set with bank-b
        bank = c.banks[honest]
        refusal = _refused(
            Refusal.BELOW_QUORUM,
            lambda bank=bank, honest=honest: bank.partial(
                1, PREDICTIONS, _receipts([a, zero]), c.c1s([a, zero]), ["bank-b", honest]
            ),
        )
        assert "the quorum is 3" in refusal.detail
    parts = [a, zero, own]
    decrypting = ["bank-b", "bank-c"]
    authority = c.coalition_authority_partial(PREDICTIONS, parts)  # from s_0 itself, no rule applied
    colluding = c.banks["bank-b"].partial(1, PREDICTIONS, _receipts(parts), c.c1s(parts), decrypting)
    honest = c.banks["bank-c"].partial(1, PREDICTIONS, _receipts(parts), c.c1s(parts), decrypting)
    fused = c.fuse(PREDICTIONS, parts, [authority, colluding, honest])
    error = len(parts) * layout.step / 2 + 1e-9
    assert np.abs(fused - values["bank-a"] - values["bank-c"]).max() <= error
    assert np.abs(fused - values["bank-a"]).max() > 10 * error  # not bank-a's upload: bank-c's term is in it


def test_the_key_authority_with_t_banks_decrypts_the_sum(consortium):
    """The positive control, same data: the key authority's partial with any t banks' fuses to the packed sum, exactly
    what the quantised terms sum to, within the policy's error of the exact sum."""
    c = consortium
    values = _values(c.policy, PREDICTIONS)
    layout = c.policy.upload_layout(PREDICTIONS)
    uploads = c.uploads(c.ticket, PREDICTIONS, values=values)
    quantised = np.sum([packing.quantise(v, layout) for v in values.values()], axis=0)
    expected = packing.decode_sum(packing.pack(quantised, layout), layout, LENGTH, len(BANKS))
    authority = c.authority_partial(c.ticket, PREDICTIONS, uploads)
    for chosen in (("bank-a", "bank-b"), ("bank-a", "bank-c"), ("bank-b", "bank-c")):
        fused = c.fuse(PREDICTIONS, uploads, [authority, *c.bank_partials(c.ticket, PREDICTIONS, uploads, chosen)])
        np.testing.assert_allclose(fused, expected, rtol=0, atol=1e-9)
        assert np.abs(fused - sum(values.values())).max() <= len(BANKS) * layout.step / 2 + 1e-9


FOUR_BANKS = ("bank-a", "bank-b", "bank-c", "bank-d")


@pytest.fixture(scope="module")
def four_bank_ceremony(tmp_path_factory) -> Ceremony:
    return run_ceremony(tmp_path_factory.mktemp("four-bank-ceremony"), Policy(), FOUR_BANKS)


def test_with_more_banks_than_the_quorum_no_two_sums_of_a_round_over_different_sets_decrypt(
    tmp_path, four_bank_ceremony
):
    """R13. Four banks, quorum 3, t = 2; the coalition: the aggregator, the key authority (its share given outright)
    and bank-d. Without the participant set in the receipts, the honest bank-a would decrypt Σ{a, b, c, d} and the
    honest bank-b Σ{b, c, d} of the same round — each one sum per (round, kind) — and their difference is bank-a's
    upload. Every receipt now names the round's participants and every decryptor needs the sum to hold exactly them:
    a sum over a subset of the named set, or over receipts naming different sets, is refused (``incomplete-sum``),
    so bank-a's upload is in one decryptable sum only."""
    c = Consortium(tmp_path, four_bank_ceremony)
    try:
        values = _values(c.policy, PREDICTIONS) | {"bank-d": np.zeros(LENGTH)}  # the colluder contributes zero
        everyone = c.open(1, FOUR_BANKS)
        uploads = dict(
            zip(FOUR_BANKS, c.uploads(everyone, PREDICTIONS, senders=FOUR_BANKS, values=values), strict=True)
        )

        def ask(bank, parts, decrypting):
            receipts = _receipts(parts)
            return c.banks[bank].partial(1, PREDICTIONS, receipts, c.c1s(parts), list(decrypting))

        whole = list(uploads.values())
        authority = c.coalition_authority_partial(PREDICTIONS, whole)
        partials = [authority, ask("bank-d", whole, ("bank-a", "bank-d")), ask("bank-a", whole, ("bank-a", "bank-d"))]
        layout = c.policy.upload_layout(PREDICTIONS)
        fused = c.fuse(PREDICTIONS, whole, partials)
        assert np.abs(fused - sum(values.values())).max() <= len(whole) * layout.step / 2 + 1e-9  # the round's sum
        # the same round's receipts of b, c, d without a's: the honest bank-b (and the key authority) refuse
        subset = [uploads[name] for name in ("bank-b", "bank-c", "bank-d")]
        detail = _refused(Refusal.INCOMPLETE_SUM, lambda: ask("bank-b", subset, ("bank-b", "bank-d"))).detail
        assert "missing: ['bank-a']" in detail
        _refused(Refusal.INCOMPLETE_SUM, lambda: c.authority_partial(everyone, PREDICTIONS, subset))
        # told {b, c, d} instead, b and c upload under another participant set: a sum beside a's receipt mixes two sets
        told = dataclasses.replace(everyone, participants=("bank-b", "bank-c", "bank-d"))
        others = c.uploads(told, PREDICTIONS, senders=("bank-b", "bank-c", "bank-d"), values=values)
        mixed = [uploads["bank-a"], *others]
        detail = _refused(Refusal.INCOMPLETE_SUM, lambda: ask("bank-c", mixed, ("bank-c", "bank-d"))).detail
        assert "2 different participant sets" in detail
        # the honest banks gave one partial between them: bank-a's, for the round's whole sum
        assert c.banks["bank-b"].decryption_count() == 0 and c.banks["bank-a"].decryption_count() == 1
    finally:
        c.close()


# --- 4. state on disk -------------------------------------------------------------------------------------------


def _pieces(residues: np.ndarray) -> list[bytes]:
    """Substrings a file holding these residues would contain: each row's first 64 bytes, little-endian words."""
    return [np.ascontiguousarray(row, dtype="<u8").tobytes()[:64] for row in residues]


def test_no_state_file_of_any_party_holds_the_collective_secret(consortium, ceremony):
    """The collective secret s = s_0 + Σ_b s_b (TEST ONLY, from s_0 and t Shamir shares; it decrypts an upload on its
    own) is in no file under the key authority's or any bank's state directory, after a ceremony and a round, in
    NTT or in coefficient form; the scan does find a secret where one is (s_0 in its unsealed payload)."""
    c = consortium
    level = c.authority.level
    values = _values(c.policy, PREDICTIONS)
    uploads = c.uploads(c.ticket, PREDICTIONS, values=values)
    c.decrypt(c.ticket, PREDICTIONS, uploads=uploads)
    collective = c.collective_secret((2, 3))
    assert np.array_equal(collective, c.collective_secret((1, 3)))  # any t banks give the same Σ_b s_b
    c0, c1, scale, size = _polys(c, uploads[0].chunks[0])
    plain = add_mod(c0, seal_residues.multiply_residues(c.public, level, c1, collective), level)
    decoded = seal_residues.decode(c.public, level, plain, scale, complex_slots=True)[:size]
    layout = c.policy.upload_layout(PREDICTIONS)
    assert np.abs(packing.decode_sum(decoded, layout, LENGTH, 1) - values["bank-a"]).max() <= layout.step / 2 + 1e-9
    c.close()
    coefficients = seal_residues.from_ntt(c.public, level, collective)
    pieces = _pieces(collective) + _pieces(coefficients)
    roots: list[Path] = [c.root, ceremony.state_dir.parent]  # this round's parties, and the ceremony's
    files = {path: path.read_bytes() for root in roots for path in root.rglob("*") if path.is_file()}
    assert any("partial_decryptions" in path.name for path in files)  # the banks' ledgers are among them
    assert any(path.name == "authority_share.sealed" for path in files)
    for path, data in files.items():
        assert not any(piece in data for piece in pieces), f"the collective secret in {path}"
    sealed = (c.state_dir / "authority_share.sealed").read_bytes()
    payload = unseal_secret_context(sealed, OPERATOR_SECRET)
    assert all(piece in payload for piece in _pieces(c.authority_secret()))
    c._start()  # for the fixture's close
