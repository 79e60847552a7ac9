"""The aggregator's one-time pad over the plaintext ring: the key authority's view is uniform whatever the sum,
the aggregator recovers the sum, and a wrong pad is refused rather than decoded into garbage."""

from __future__ import annotations

import numpy as np
import pytest

from fedgl_secure.crypto import ckks, ring_mask
from fedgl_secure.crypto.masking import mask_sum, masked_decryption, unmask
from fedgl_secure.errors import CiphertextError
from tests.test_ring_mask import P_VALUE, uniformity_p_value

LENGTH = 3000  # two chunks at N = 4096


@pytest.fixture(scope="module")
def parties(small_context):
    """The key authority's secret context, the aggregator's public one, and a key authority as a function."""
    public = ckks.load_public_context(ckks.public_context_bytes(small_context))
    level = ring_mask.data_level(small_context)

    def key_authority(padded: list[bytes], slots: int) -> np.ndarray:
        views = [ring_mask.load_ciphertext(small_context, c, level, "chunk") for c in padded]
        return np.stack([ring_mask.decrypt_rerandomised(small_context, view, level) for view in views])

    return small_context, public, level, key_authority


def summed(public, terms):
    return ckks.add_serialized(public, [ckks.encrypt_vector(public, term) for term in terms])


def test_the_key_authority_decrypts_exactly_the_sum_plus_the_pad(parties):
    """The direct argument: the padded ciphertext decrypts to Dec(sum) + r exactly, r uniform; the reply adds only
    a fresh small RLWE error on top (its slots are within 8 σ√(N/2) / scale)."""
    secret, public, level, key_authority = parties
    terms = [np.random.default_rng(i).uniform(-50, 50, LENGTH) for i in range(3)]
    total = summed(public, terms)
    padded = mask_sum(public, total, LENGTH)
    unpadded = np.stack(
        [ring_mask.decrypt(secret, ring_mask.tenseal_ciphertext(public, chunk, "sum")[0], level) for chunk in total]
    )
    exact = np.stack(
        [ring_mask.decrypt(secret, ring_mask.load_ciphertext(secret, c, level, "c"), level) for c in padded.chunks]
    )
    np.testing.assert_array_equal(ring_mask.sub_mod(exact, padded.pads, level), unpadded)
    view = key_authority(padded.chunks, LENGTH)
    error = ring_mask.sub_mod(view, exact, level)
    assert np.count_nonzero(error) > level.size  # fresh in every chunk...
    reply_error = np.concatenate([ring_mask.decode(public, level, e, 2.0**36) for e in error])
    assert np.abs(reply_error).max() < 8 * 3.2 * np.sqrt(level.degree / 2) / 2.0**36  # ... and small
    np.testing.assert_allclose(unmask(public, padded, view), np.sum(terms, axis=0), atol=1e-5)


def test_the_key_authoritys_views_of_different_sums_are_both_uniform(parties):
    """Perfect hiding, checked statistically: the views of a constant sum and of a ramp pass the same uniformity
    test, and decoding a view (what a curious key authority would do) says nothing about the sum."""
    _, public, level, key_authority = parties
    prime = level.moduli[0]
    sums = {"zeros": np.zeros(LENGTH), "ramp": np.linspace(-1000.0, 1000.0, LENGTH)}
    views = {}
    for name, values in sums.items():
        padded = mask_sum(public, summed(public, [values]), LENGTH)
        views[name] = key_authority(padded.chunks, LENGTH)
        assert uniformity_p_value(views[name].reshape(-1), prime) > P_VALUE, name
        decoded = np.concatenate([ring_mask.decode(public, level, v, 2.0**36) for v in views[name]])[:LENGTH]
        assert np.median(np.abs(decoded)) > 100 * 1000.0  # nowhere near either sum (|values| ≤ 1000)
        if name == "ramp":
            assert abs(np.corrcoef(decoded, values)[0, 1]) < 6 / np.sqrt(LENGTH)
    assert stats_same_distribution(views["zeros"].reshape(-1), views["ramp"].reshape(-1))


def stats_same_distribution(first: np.ndarray, second: np.ndarray) -> bool:
    from scipy import stats

    return float(stats.ks_2samp(first.astype(np.float64), second.astype(np.float64)).pvalue) > P_VALUE


def test_pads_are_fresh_for_every_sum(parties):
    _, public, _, _ = parties
    total = summed(public, [np.ones(10)])
    first, second = mask_sum(public, total, 10), mask_sum(public, total, 10)
    assert not np.array_equal(first.pads, second.pads)
    assert first.chunks != second.chunks


def test_the_aggregator_recovers_the_sum_through_masked_decryption(parties):
    _, public, _, key_authority = parties
    terms = [np.random.default_rng(10 + i).uniform(-100, 100, LENGTH) for i in range(4)]
    values = masked_decryption(public, summed(public, terms), LENGTH, None, 4, key_authority)
    np.testing.assert_allclose(values, np.sum(terms, axis=0), atol=1e-5)


def test_a_wrong_pad_or_a_forged_reply_is_refused_not_decoded(parties):
    _, public, level, key_authority = parties
    padded = mask_sum(public, summed(public, [np.ones(LENGTH)]), LENGTH)
    view = key_authority(padded.chunks, LENGTH)
    wrong = mask_sum(public, summed(public, [np.ones(LENGTH)]), LENGTH)  # another sum's pads
    with pytest.raises(CiphertextError, match="wrap-around bound"):
        unmask(public, wrong, view)
    with pytest.raises(CiphertextError, match="expected 2 ciphertexts"):
        unmask(public, padded, view[:1])
    with pytest.raises(CiphertextError, match="must be uint64"):
        unmask(public, padded, view.astype(np.float64))
    unreduced = view.copy()
    unreduced[0, 0, 0] = level.moduli[0]
    with pytest.raises(CiphertextError, match="at or above their prime"):
        unmask(public, padded, unreduced)


def test_a_sum_that_does_not_fill_its_chunks_is_refused(parties):
    _, public, _, _ = parties
    total = summed(public, [np.ones(LENGTH)])
    with pytest.raises(CiphertextError, match="cannot hold"):
        mask_sum(public, total, 10)
    with pytest.raises(CiphertextError, match="holds 952 values, expected 900"):
        mask_sum(public, total, 2948)


def test_several_data_primes_pad_and_decode_per_prime():
    """Under [60, 40, 40, 60] the data level has three primes: one uniform residue vector each, same recovery."""
    from fedgl_secure.policy.schema import HEParameters

    he = HEParameters(
        poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), global_scale_bits=40, packing="none"
    )
    secret = ckks.create_secret_context(he)
    public = ckks.load_public_context(ckks.public_context_bytes(secret))
    level = ring_mask.data_level(secret)
    assert [q.bit_length() for q in level.moduli] == [60, 40, 40]

    def key_authority(padded: list[bytes], slots: int) -> np.ndarray:
        views = [ring_mask.load_ciphertext(secret, c, level, "chunk") for c in padded]
        return np.stack([ring_mask.decrypt_rerandomised(secret, view, level) for view in views])

    terms = [np.random.default_rng(20 + i).uniform(-1e6, 1e6, 5000) for i in range(2)]
    values = masked_decryption(public, summed(public, terms), 5000, None, 2, key_authority)
    np.testing.assert_allclose(values, np.sum(terms, axis=0), atol=1e-4)
