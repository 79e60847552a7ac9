"""Key authority rules, receipts, sealed storage and the audit chain (DESIGN §5.3 step 4)."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks, ring_mask
from fedgl_secure.crypto.audit import AuditChainError, AuditLog, verify_audit_chain
from fedgl_secure.crypto.key_authority import AGGREGATOR, HE_PARAMETERS, KeyAuthority, Refusal
from fedgl_secure.crypto.masking import mask_sum, masked_decryption, unmask
from fedgl_secure.crypto.receipts import ReceiptFields, canonical_bytes, sign_receipt, verify_receipt
from fedgl_secure.crypto.sealing import MAGIC, seal_secret_context, unseal_secret_context
from fedgl_secure.crypto.upload import RoundTicket, check_c1_digest, check_upload, make_upload, upload_c1
from fedgl_secure.errors import ContextError, DecryptionRefused, PolicyError, ReceiptError, SealError
from fedgl_secure.policy.schema import HEParameters, policy_from_dict
from fedgl_secure.privacy.dp_round import noise_std

OPERATOR_SECRET = "correct horse battery staple"
FEDERATION = "fed-test"
BANKS = ("bank-a", "bank-b", "bank-c")
LENGTH = 50


class Consortium:
    """A key authority, three enrolled banks, and helpers to run a round against it."""

    def __init__(self, state_dir, policy):
        self.state_dir, self.policy = state_dir, policy
        self.authority = KeyAuthority(state_dir, policy, OPERATOR_SECRET)
        self.public = ckks.load_public_context(self.authority.public_context)
        self.keys = {name: Ed25519PrivateKey.generate() for name in BANKS}
        for name, key in self.keys.items():
            self.authority.register_bank(name, key.public_key())
        self.values = {name: np.full(LENGTH, float(i + 1)) for i, name in enumerate(BANKS)}

    def restart(self):
        self.authority.close()
        self.authority = KeyAuthority(self.state_dir, self.policy, OPERATOR_SECRET)

    def open(self, round_number, participants=BANKS):
        digest = self.policy.digest
        ticket = RoundTicket(
            FEDERATION, round_number, secrets.token_hex(16), len(participants), self.authority.fingerprint, digest
        )
        self.authority.open_round(FEDERATION, round_number, ticket.nonce, participants, digest)
        return ticket

    def uploads(self, ticket, kind="weights", senders=BANKS):
        return [
            make_upload(self.public, self.policy.he, ticket, name, self.keys[name], kind, self.values[name])
            for name in senders
        ]

    def decrypt(
        self, ticket, kind="weights", uploads=None, role=AGGREGATOR, fingerprint=None, receipts=None, length=LENGTH
    ):
        """The aggregator's whole side: add, pad, have the authority decrypt, unpad and decode."""
        uploads = self.uploads(ticket, kind) if uploads is None else uploads
        summed = ckks.add_serialized(self.public, [u.chunks for u in uploads])

        def key_authority(padded: list[bytes], slots: int) -> np.ndarray:
            return self.authority.decrypt_sum(
                role,
                FEDERATION,
                ticket.round,
                kind,
                padded,
                [u.receipt for u in uploads] if receipts is None else receipts,
                fingerprint or self.authority.fingerprint,
                slots,
                [upload_c1(self.public, u.chunks) for u in uploads],
            )

        layout = self.policy.upload_layout(kind)
        return masked_decryption(self.public, summed, length, layout, len(uploads), key_authority)


@pytest.fixture
def consortium(tmp_path, small_policy):
    consortium = Consortium(tmp_path / "ka", small_policy)
    yield consortium
    consortium.authority.close()


def _refused(reason, call):
    with pytest.raises(DecryptionRefused) as caught:
        call()
    assert caught.value.reason == reason.value, caught.value
    return caught.value


def test_valid_request_decrypts_the_sum(consortium):
    total = consortium.decrypt(consortium.open(1))
    np.testing.assert_allclose(total, np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION)


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
    # after all that, a valid request is still served
    np.testing.assert_allclose(c.decrypt(ticket), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION)


def test_stale_round_and_non_participant_are_refused(consortium):
    c = consortium
    first = c.open(1)
    old_uploads = c.uploads(first)
    second = c.open(2, participants=("bank-a", "bank-b"))
    _refused(Refusal.STALE_ROUND, lambda: c.decrypt(first, uploads=old_uploads))
    # receipts of round 1 replayed into round 2: bound to another round and nonce
    replay = replace(first, round=2)
    _refused(Refusal.RECEIPT_MISMATCH, lambda: c.decrypt(replay, uploads=old_uploads))
    _refused(Refusal.NOT_PARTICIPANT, lambda: c.decrypt(second, uploads=c.uploads(second)))
    np.testing.assert_allclose(
        c.decrypt(second, uploads=c.uploads(second, senders=("bank-a", "bank-b"))),
        np.full(LENGTH, 3.0),
        atol=HEParameters.UNPACKED_PRECISION,
    )


def test_each_round_and_kind_is_decrypted_once_even_across_restarts(consortium):
    c = consortium
    ticket = c.open(1)
    c.decrypt(ticket, kind="weights")
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(ticket, kind="weights"))
    c.restart()
    assert c.authority.fingerprint == ckks.fingerprint(c.authority.public_context)
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(ticket, kind="weights"))
    # a reopened round (fresh nonce) cannot be used to decrypt the same kind again either
    reopened = c.open(1)
    _refused(Refusal.ALREADY_DECRYPTED, lambda: c.decrypt(reopened, kind="weights"))
    np.testing.assert_allclose(
        c.decrypt(reopened, kind="predictions"), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION
    )
    assert verify_audit_chain(c.state_dir / "audit.jsonl").ok


def test_restart_under_other_he_parameters_is_refused(consortium, small_policy):
    consortium.authority.close()
    other = small_policy.model_copy(update={"he": HEParameters()})
    with pytest.raises(ContextError, match="the key pair was made for HE parameters"):
        KeyAuthority(consortium.state_dir, other, OPERATOR_SECRET)
    consortium.restart()


def test_parameters_recorded_with_the_retired_mask_bits_still_match(consortium, small_policy):
    """A state directory from before the ring pad recorded ``mask_bits``; the keys never depended on it."""
    recorded = json.loads(consortium.authority.ledger.get_meta(HE_PARAMETERS))
    consortium.authority.ledger.set_meta(HE_PARAMETERS, json.dumps({**recorded, "mask_bits": 0}))
    consortium.restart()
    np.testing.assert_allclose(
        consortium.decrypt(consortium.open(1)), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION
    )


def test_unpadded_foreign_or_rescaled_ciphertexts_are_bad_ciphertext_and_consume_nothing(consortium):
    c = consortium
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    summed = ckks.add_serialized(c.public, [u.chunks for u in uploads])
    receipts = [u.receipt for u in uploads]

    def ask(chunks, length=LENGTH):
        return c.authority.decrypt_sum(
            AGGREGATOR, FEDERATION, 1, "weights", chunks, receipts, c.authority.fingerprint, length, c1s(c, uploads)
        )

    # the TenSEAL sum itself (no pad, not SEAL's format) is refused: the authority decrypts padded sums only
    assert "no SEAL header" in _refused(Refusal.BAD_CIPHERTEXT, lambda: ask(summed)).detail
    assert "have 1" in _refused(Refusal.WRONG_SHAPE, lambda: ask(summed * 2)).detail
    # a ciphertext at another scale than the policy gives the kind (here 2^20, not 2^36)
    rescaled = ckks.add_serialized(
        c.public, [ckks.encrypt_vector(c.public, c.values[u.receipt.sender], 20) for u in uploads]
    )
    padded = mask_sum(c.public, rescaled, LENGTH)
    assert "scale 2^20" in _refused(Refusal.BAD_CIPHERTEXT, lambda: ask(padded.chunks)).detail
    # nothing was consumed
    np.testing.assert_allclose(
        c.decrypt(ticket, uploads=uploads), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION
    )


def test_the_key_authority_returns_residues_not_values(consortium):
    c = consortium
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    padded = mask_sum(c.public, ckks.add_serialized(c.public, [u.chunks for u in uploads]), LENGTH)
    view = c.authority.decrypt_sum(
        AGGREGATOR,
        FEDERATION,
        1,
        "weights",
        padded.chunks,
        [u.receipt for u in uploads],
        c.authority.fingerprint,
        LENGTH,
        c1s(c, uploads),
    )
    assert view.dtype == np.uint64 and view.shape == (1, *c.authority.level.shape)
    assert np.all(view < c.authority.level.column())


def c1s(consortium, uploads):
    """What the aggregator sends beside a sum: each receipted upload's c1 polynomials."""
    return [upload_c1(consortium.public, u.chunks) for u in uploads]


def _solve_for_key(reply: np.ndarray, padded: bytes, secret, level) -> list[int]:
    """What an aggregator would try: it knows the ciphertext (c0 + r, c1) it sent, and c0 + r + c1·s is linear
    in s, so s = (reply − c0 − r) / c1 point by point in NTT form (first data prime)."""
    ciphertext = ring_mask.load_ciphertext(secret, padded, level, "padded")
    words = ciphertext.dyn_array()
    prime, n = level.moduli[0], level.degree
    c0, c1 = [int(words[i]) for i in range(n)], [int(words[n * len(level.moduli) + i]) for i in range(n)]
    return [(int(reply[0, i]) - c0[i]) * pow(c1[i], -1, prime) % prime for i in range(n)]


def test_a_reply_does_not_hand_the_aggregator_the_secret_key(consortium):
    """An exact decryption of a known ciphertext gives the key away; each reply carries fresh flooding noise, so
    solving as above yields garbage."""
    c = consortium
    secret, level = c.authority._secret_context, c.authority.level
    key = secret.secret_key().data.data()
    key_residues = [key.data(i) for i in range(level.degree)]  # the key's NTT form modulo the data prime
    ticket = c.open(1)
    uploads = c.uploads(ticket)
    padded = mask_sum(c.public, ckks.add_serialized(c.public, [u.chunks for u in uploads]), LENGTH)
    exact = ring_mask.decrypt(secret, ring_mask.load_ciphertext(secret, padded.chunks[0], level, "p"), level)
    assert _solve_for_key(exact, padded.chunks[0], secret, level) == key_residues  # why the error is needed
    reply = c.authority.decrypt_sum(
        AGGREGATOR,
        FEDERATION,
        1,
        "weights",
        padded.chunks,
        [u.receipt for u in uploads],
        c.authority.fingerprint,
        LENGTH,
        c1s(c, uploads),
    )
    solved = _solve_for_key(reply[0], padded.chunks[0], secret, level)
    assert sum(a == b for a, b in zip(solved, key_residues, strict=True)) < level.degree // 100
    np.testing.assert_allclose(
        unmask(c.public, padded, reply), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION
    )


def test_open_round_refusals(consortium):
    c = consortium
    with pytest.raises(PolicyError, match="quorum"):
        c.open(1, participants=("bank-a",))
    with pytest.raises(PolicyError, match="not registered"):
        c.open(1, participants=("bank-a", "bank-x"))
    c.open(3)
    with pytest.raises(PolicyError, match="older than the open round 3"):
        c.open(2)
    with pytest.raises(ReceiptError, match="different signing key"):
        c.authority.register_bank("bank-a", Ed25519PrivateKey.generate().public_key())


def test_disallowed_kind_is_refused(tmp_path, small_policy):
    policy = small_policy.model_copy(update={"allowed_kinds": ("weights",)})
    c = Consortium(tmp_path / "ka", policy)
    _refused(Refusal.KIND_NOT_ALLOWED, lambda: c.decrypt(c.open(1), kind="embeddings"))
    c.authority.close()


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
    lines = path.read_text().splitlines(keepends=True)
    # altering a line's content is pinned to that line
    altered = lines.copy()
    altered[2] = altered[2].replace('"decision":"allowed"', '"decision":"refused"')
    path.write_text("".join(altered))
    report = verify_audit_chain(path)
    assert not report.ok and report.broken_line == 3 and "altered" in report.problem
    # removing a line breaks the next link
    path.write_text("".join(lines[:2] + lines[3:]))
    report = verify_audit_chain(path)
    assert report.broken_line == 3 and "prev" in report.problem
    # cutting the tail is caught at the next start against the head kept in the ledger
    path.write_text("".join(lines[:-1]))
    c.authority.close()
    with pytest.raises(AuditChainError, match="cut from the end"):
        KeyAuthority(c.state_dir, c.policy, OPERATOR_SECRET)
    path.write_text("".join(lines))
    c.restart()


def test_audit_log_appends_across_reopen(tmp_path):
    log = AuditLog(tmp_path / "a.jsonl")
    log.append({"event": "x"})
    again = AuditLog(tmp_path / "a.jsonl", expected_head=log.head)
    again.append({"event": "y"})
    report = verify_audit_chain(tmp_path / "a.jsonl", expected_head=again.head)
    assert report.ok and report.lines == 2


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
    # the key authority's key file is sealed; restarting with the wrong secret fails clearly
    authority = KeyAuthority(tmp_path / "ka", small_policy, OPERATOR_SECRET)
    authority.close()
    assert (tmp_path / "ka" / "secret_context.sealed").read_bytes().startswith(MAGIC)
    with pytest.raises(SealError, match="wrong operator secret"):
        KeyAuthority(tmp_path / "ka", small_policy, "not the operator secret at all")


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
    )
    receipt = sign_receipt(key, fields)
    verify_receipt(key.public_key(), receipt)
    assert canonical_bytes(fields).endswith(b'"values":10}')  # sorted keys
    changes = [("round", 2), ("kind", "predictions"), ("sender", "bank-b"), ("nonce", "cd" * 16), ("values", 11)]
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
    # a receipt whose c1 digest is not its chunks' (signed by the bank itself): refused here, alone, before the key
    # authority would refuse the whole sum
    fields = upload.receipt.fields().model_copy(update={"c1_sha256": "7" * 64})
    wrong_c1 = replace(upload, receipt=sign_receipt(c.keys["bank-a"], fields))
    check_upload(wrong_c1, c.keys["bank-a"].public_key(), ticket, "bank-a")  # signed, bound: only the c1 differs
    check_c1_digest(c.public, upload, "bank-a")
    with pytest.raises(ReceiptError, match="c1 does not match"):
        check_c1_digest(c.public, wrong_c1, "bank-a")


def test_a_key_authority_pinned_to_a_federation_refuses_others(tmp_path, small_policy):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedgl_secure.crypto.key_authority import AGGREGATOR, KeyAuthority
    from fedgl_secure.errors import DecryptionRefused, PolicyError

    authority = KeyAuthority(tmp_path, small_policy, b"operator-secret-0123456789", federation="ours")
    try:
        for bank in ("a", "b"):
            authority.register_bank(bank, Ed25519PrivateKey.generate().public_key())
        with pytest.raises(PolicyError, match="serves federation 'ours' only"):
            authority.open_round("theirs", 1, "ab" * 16, ["a", "b"], small_policy.digest)
        authority.open_round("ours", 1, "ab" * 16, ["a", "b"], small_policy.digest)
        with pytest.raises(DecryptionRefused) as refusal:
            authority.decrypt_sum(AGGREGATOR, "theirs", 1, "weights", [b"x"], [], authority.fingerprint, 1, [])
        assert refusal.value.reason == "foreign-federation"
    finally:
        authority.close()


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


def test_central_noise_is_added_to_what_the_key_authority_decrypts_and_audited(tmp_path, small_he):
    """The aggregator's view (s + r from the key authority, minus r) is s + N(0, σ²), Σŵ_k exact; audited."""
    policy = central_noise_policy(small_he)
    c = Consortium(tmp_path / "ka", policy)
    n = 4000  # two chunks at N = 4096
    c.values = {name: np.linspace(-1.0, 1.0, n) * (i + 1) for i, name in enumerate(BANKS)}
    exact = sum(c.values.values())
    ticket = c.open(1)
    observed = {}
    for kind in ("weights", "predictions", "node_weight"):
        observed[kind] = c.decrypt(ticket, kind, length=n) - exact
    c.authority.close()

    # CKKS error at scale 2^36 stays far below 1e-3 (the pad adds none); the noise is σ ≥ 2
    weights, predictions, node_weight = observed["weights"], observed["predictions"], observed["node_weight"]
    assert abs(weights[-1]) < 1e-3  # Σ ŵ_k: public, never noised
    assert np.max(np.abs(node_weight)) < 1e-3  # no DP channel: exact
    for kind, noise in (("weights", weights[:-1]), ("predictions", predictions)):
        sigma = noise_std(policy, kind)
        # n ≈ 4000 i.i.d. N(0, σ²): the sample std is within 6/√(2n) ≈ 6.7 % of σ and the mean within 6σ/√n
        # except with probability < 1e-8 each; bank shares on top (σ²/q per bank) would push the std past 1.2σ
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


def test_without_a_central_channel_the_key_authority_adds_no_noise(tmp_path, small_he):
    channel = {"clip": 1.0, "noise_multiplier": 1.0, "noise": "distributed"}
    policy = policy_from_dict(
        {
            "he": small_he.model_dump(),
            "allowed_kinds": ["weights", "node_weight"],
            "dp": {"weights": channel},
            "budget": {"epsilon": 1000.0, "delta": 1e-5, "rounds": 10},
        }
    )
    c = Consortium(tmp_path / "ka", policy)
    assert c.authority.central_noise_std == {}
    np.testing.assert_allclose(c.decrypt(c.open(1)), np.full(LENGTH, 6.0), atol=HEParameters.UNPACKED_PRECISION)
    c.authority.close()


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
        KeyAuthority(tmp_path / "ka", policy, OPERATOR_SECRET)
    assert not (tmp_path / "ka").exists()  # refused before any key was made
