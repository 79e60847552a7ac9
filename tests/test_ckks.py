"""CKKS packing: public contexts hold no secret, sums decrypt exactly enough, bad bytes fail typed."""

from __future__ import annotations

import numpy as np
import pytest

from fedgl_secure.crypto import ckks, packing
from fedgl_secure.crypto.upload import check_magnitude
from fedgl_secure.errors import CiphertextError, ContextError
from fedgl_secure.policy.he import HEParameters


@pytest.fixture(scope="module")
def public(small_context):
    return ckks.load_public_context(ckks.public_context_bytes(small_context))


@pytest.fixture(scope="module")
def default_context():
    return ckks.create_secret_context(HEParameters())


def test_public_context_has_no_secret_and_no_evaluation_keys(small_context, public):
    assert ckks.has_secret_key(small_context)
    assert not ckks.has_secret_key(public)
    assert not public.has_galois_keys() and not public.has_relin_keys() and public.has_public_key()
    data = ckks.public_context_bytes(small_context)
    assert ckks.fingerprint(data) == ckks.fingerprint(ckks.public_context_bytes(public))
    assert len(ckks.fingerprint(data)) == 64


def test_load_public_context_refuses_secret_or_extra_keys(small_context):
    with pytest.raises(ContextError, match="secret key"):
        ckks.load_public_context(ckks.secret_context_bytes(small_context))
    with pytest.raises(ContextError, match="Galois/relinearisation"):
        ckks.load_public_context(small_context.serialize(save_secret_key=False, save_relin_keys=True))
    with pytest.raises(ContextError, match="not a serialised TenSEAL context"):
        ckks.load_public_context(b"definitely not a context")


def test_public_context_cannot_decrypt(small_context, public):
    chunks = ckks.encrypt_vector(public, np.ones(3))
    with pytest.raises(ContextError, match="secret context"):
        ckks.decrypt_vector(public, chunks, 3)
    np.testing.assert_allclose(ckks.decrypt_vector(small_context, chunks, 3), np.ones(3), atol=1e-6)


@pytest.mark.parametrize("length", [1, 2047, 2048, 5000])
def test_encrypt_add_decrypt_matches_plaintext_sum_across_chunks(small_context, public, length):
    rng = np.random.default_rng(length)
    terms = [rng.uniform(-60, 60, length) for _ in range(3)]  # encoding range: 2^(72 - 62 - 2)
    uploads = [ckks.encrypt_vector(public, term) for term in terms]
    assert len(uploads[0]) == ckks.chunk_count(length, 2048)
    total = ckks.decrypt_vector(small_context, ckks.add_serialized(public, uploads), length)
    assert np.abs(total - np.sum(terms, axis=0)).max() < 1e-4


def test_default_parameters_precision_at_engine_magnitudes(default_context):
    """Six banks sending ŵ_k·W_k with |W| up to 3 (ŵ_k normalised, as banks send them): error within the unpacked
    precision the policy states (CKKS noise plus the decryption's flooding, which SEAL's plain decryption here
    does not add: it only grows the error, so this checks the encryption side)."""
    public = ckks.load_public_context(ckks.public_context_bytes(default_context))
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(6))
    terms = [w * rng.uniform(-3, 3, 6000) for w in weights]
    summed = ckks.add_serialized(public, [ckks.encrypt_vector(public, t) for t in terms])
    error = np.abs(ckks.decrypt_vector(default_context, summed, 6000) - np.sum(terms, axis=0)).max()
    assert error < HEParameters.UNPACKED_PRECISION, error


def test_default_parameters_fit_the_wire_budget(default_context):
    """The design's budget for threshold decryption, ≤ 20 bytes per value, for every kind the default packs, measured
    on a real ciphertext (a full chunk), and under a quarter of what the common N = 8192, [60, 40, 40, 60] context
    spends on one float per slot."""
    he = HEParameters()
    bytes_per_slot = ckks.bytes_per_value(default_context)
    common = ckks.create_secret_context(HEParameters(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60)))
    for kind in ("weights", "predictions", "embeddings", "node_weight", "meta_gradients"):
        packed = packing.bytes_per_value(he.layout(kind), bytes_per_slot)
        assert packed <= 20 and packed < ckks.bytes_per_value(common) / 4, kind


def test_truncated_and_garbage_ciphertexts_are_typed_errors(public):
    good = ckks.encrypt_vector(public, np.arange(10.0))
    for bad in (good[0][: len(good[0]) // 2], b"garbage", b""):
        with pytest.raises(CiphertextError, match="contribution 1, chunk 0"):
            ckks.add_serialized(public, [good, [bad]])
    with pytest.raises(CiphertextError, match="expected ciphertext bytes"):
        ckks.add_serialized(public, [good, ["not bytes"]])


def test_foreign_context_ciphertext_is_refused(public):
    foreign = ckks.create_secret_context(
        HEParameters(poly_modulus_degree=4096, coeff_mod_bit_sizes=(35, 36, 37), global_scale_bits=60)
    )
    good = ckks.encrypt_vector(public, np.arange(10.0))
    alien = ckks.encrypt_vector(foreign, np.arange(10.0))
    with pytest.raises(CiphertextError, match="other parameters"):
        ckks.add_serialized(public, [good, alien])


def test_mismatched_uploads_are_refused(small_context, public):
    short = ckks.encrypt_vector(public, np.arange(10.0))
    longer = ckks.encrypt_vector(public, np.arange(11.0))
    two_chunks = ckks.encrypt_vector(public, np.zeros(3000))
    with pytest.raises(CiphertextError, match="11 values, expected 10"):
        ckks.add_serialized(public, [short, longer])
    with pytest.raises(CiphertextError, match="chunk counts"):
        ckks.add_serialized(public, [short, two_chunks])
    with pytest.raises(CiphertextError, match="no contribution"):
        ckks.add_serialized(public, [])
    with pytest.raises(CiphertextError, match="cannot hold"):
        ckks.decrypt_vector(small_context, two_chunks, 10)
    with pytest.raises(CiphertextError, match="expected 12"):
        ckks.decrypt_vector(small_context, short, 12)


def test_non_finite_and_oversized_values_are_refused(public, small_he):
    with pytest.raises(CiphertextError, match="NaN"):
        ckks.encrypt_vector(public, np.array([1.0, np.nan]))
    with pytest.raises(CiphertextError, match="cannot encode"):
        ckks.encrypt_vector(public, np.array([1e9]))
    with pytest.raises(CiphertextError, match="empty"):
        ckks.encrypt_vector(public, np.zeros(0))
    # terms may fill half of the 2^9 sum range (72 data bits - scale 62 - 1): 2^8 / 3 ≈ 85.3
    check_magnitude(np.array([85.0]), 3, small_he, "weights")
    with pytest.raises(CiphertextError, match="weights: .*per-bank bound for 3 banks"):
        check_magnitude(np.array([86.0]), 3, small_he, "weights")
