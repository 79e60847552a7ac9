"""The encryption pool: terms encrypted on worker processes decrypt to what was given, errors come back as the
caller's own, and the pool starts only for batches large enough to repay it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.encryption_pool import EncryptionPool, term_chunks
from fedgl_secure.crypto.receipts import c1_digest, ciphertext_digest, verify_receipt
from fedgl_secure.crypto.secure_summation import QuantisedSummation, SecureSummation
from fedgl_secure.crypto.upload import RoundTicket, sign_upload, upload_c1
from fedgl_secure.errors import CiphertextError, PackingOverflow
from fedgl_secure.policy.schema import Policy


@pytest.fixture(scope="module")
def pool(small_context, small_he):
    with_pool = EncryptionPool(ckks.public_context_bytes(small_context), small_he, workers=2, min_chunks=0)
    yield with_pool
    with_pool.close()


def test_a_term_encrypted_on_a_worker_decrypts_to_the_term(pool, small_context):
    values = np.random.default_rng(0).uniform(-3, 3, 5000)  # three chunks of 2,048 slots
    encrypted = pool.submit("weights", values, None, participants=3).result()
    assert len(encrypted.chunks) == 3 and encrypted.seconds > 0
    np.testing.assert_allclose(ckks.decrypt_vector(small_context, encrypted.chunks, values.size), values, atol=1e-4)


def test_errors_on_a_worker_come_back_as_the_callers_own(pool):
    layout = Policy().he.layout("weights")
    with pytest.raises(CiphertextError, match="weights: values in .* leave the packed range"):
        pool.submit("weights", np.full(10, 100.0), layout, participants=3).result()
    with pytest.raises(PackingOverflow, match="he.max_banks"):
        pool.submit("weights", np.zeros(10), layout, participants=layout.max_banks + 1).result()
    # the pool survives a refused term
    assert len(pool.submit("weights", np.zeros(10), None, participants=3).result().chunks) == 1


def test_the_pool_starts_only_for_a_large_batch(small_context, small_he):
    public = ckks.public_context_bytes(small_context)
    assert not EncryptionPool(public, small_he, workers=1, min_chunks=0).use_for(1000)  # one worker: in-process
    lazy = EncryptionPool(public, small_he, workers=2, min_chunks=4)
    try:
        assert not lazy.use_for(3) and not lazy.started
        assert lazy.use_for(4) and lazy.started
        assert lazy.use_for(1)  # once started, every batch goes to the workers
    finally:
        lazy.close()
    assert term_chunks(small_he, None, 2048) == 1 and term_chunks(small_he, None, 2049) == 2


def test_a_round_encrypted_on_the_pool_equals_the_quantised_plaintext_sum():
    policy = Policy()  # the default policy: packed
    rng = np.random.default_rng(5)
    contributions = {
        k: {
            "weights": torch.from_numpy(rng.uniform(-1, 1, 3000)).float(),
            "predictions": torch.from_numpy(rng.uniform(0, 1, (500, 3))).float(),
        }
        for k in range(3)
    }
    summation = SecureSummation(policy, encrypt_workers=2, pool_min_chunks=0)
    try:
        secure = summation(1, contributions)
        assert summation.encryption.started
        receipts = summation.accepted_receipts
    finally:
        summation.close()
    plain = QuantisedSummation(policy)(1, contributions)
    for kind, tensor in plain.items():
        torch.testing.assert_close(secure[kind], tensor, rtol=0, atol=0)
    assert len(receipts) == 2 * 3 and {r.sender for r in receipts} == {"bank-0", "bank-1", "bank-2"}


def test_the_receipt_signed_by_the_caller_covers_the_workers_chunks(pool):
    key = Ed25519PrivateKey.generate()
    banks = ("bank-a", "bank-b", "bank-c")
    ticket = RoundTicket("fed", 4, "ab" * 16, banks, ckks.fingerprint(pool.public_context), "0" * 64)
    encrypted = pool.submit("predictions", np.linspace(0, 1, 300), None, participants=3).result()
    upload = sign_upload(
        ckks.load_public_context(pool.public_context), ticket, "bank-a", key, "predictions", encrypted.chunks, 300
    )
    verify_receipt(key.public_key(), upload.receipt)
    assert upload.receipt.ciphertext_sha256 == ciphertext_digest(encrypted.chunks)
    # the c1 digest the worker read back from its chunks is the one the caller would read
    context = ckks.load_public_context(pool.public_context)
    assert encrypted.c1_sha256 == upload.receipt.c1_sha256 == c1_digest(upload_c1(context, encrypted.chunks))
    handed = sign_upload(context, ticket, "bank-a", key, "predictions", encrypted.chunks, 300, encrypted.c1_sha256)
    assert handed.receipt.c1_sha256 == upload.receipt.c1_sha256
    assert (upload.length, upload.kind, upload.receipt.round) == (300, "predictions", 4)
