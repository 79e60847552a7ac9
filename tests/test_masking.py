"""The aggregator's one-time pad over the plaintext ring: the key authority's view is uniform whatever the sum,
the aggregator recovers the sum, and a wrong pad is refused rather than decoded into garbage."""

from __future__ import annotations

import numpy as np
import pytest

from fedgl_secure.crypto import ckks, ring_mask
from fedgl_secure.crypto.masking import mask_sum, masked_decryption, unmask
from fedgl_secure.errors import CiphertextError
from fedgl_secure.policy.schema import HEParameters
from tests.test_ring_mask import P_VALUE, uniformity_p_value

LENGTH = 3000  # two chunks at N = 4096


@pytest.fixture(scope="module")
def parties(small_context, small_he):
    """The key authority's secret context, the aggregator's public one, and a key authority as a function."""
    public = ckks.load_public_context(ckks.public_context_bytes(small_context))
    level = ring_mask.data_level(small_context)

    def key_authority(padded: list[bytes], slots: int) -> np.ndarray:
        views = [ring_mask.load_ciphertext(small_context, c, level, "chunk") for c in padded]
        flooding = small_he.flooding_std()
        return np.stack([ring_mask.decrypt_flooded(small_context, view, level, flooding) for view in views])

    return small_context, public, level, key_authority


def summed(public, terms):
    return ckks.add_serialized(public, [ckks.encrypt_vector(public, term) for term in terms])


def test_the_key_authority_decrypts_exactly_the_sum_plus_the_pad(parties, small_he):
    """The direct argument: the padded ciphertext decrypts to Dec(sum) + r exactly, r uniform; the reply adds only
    fresh flooding noise on top (its slots are within 8 σ√(N/2) / scale)."""
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
    scale = 2.0**small_he.global_scale_bits
    reply_error = np.concatenate([ring_mask.decode(public, level, e, scale) for e in error])
    flooding = 8 * small_he.flooding_std() * np.sqrt(level.degree / 2) / scale
    assert np.abs(reply_error).max() < flooding  # ... and within the flooding's bound
    np.testing.assert_allclose(unmask(public, padded, view), np.sum(terms, axis=0), atol=small_he.UNPACKED_PRECISION)


def test_the_key_authoritys_views_of_different_sums_are_both_uniform(parties):
    """Perfect hiding, checked statistically: the views of a constant sum and of a ramp pass the same uniformity
    test, and decoding a view (what a curious key authority would do) says nothing about the sum."""
    _, public, level, key_authority = parties
    prime = level.moduli[0]
    sums = {"zeros": np.zeros(LENGTH), "ramp": np.linspace(-100.0, 100.0, LENGTH)}  # within 2^(72 - 62 - 2)
    views = {}
    for name, values in sums.items():
        padded = mask_sum(public, summed(public, [values]), LENGTH)
        views[name] = key_authority(padded.chunks, LENGTH)
        assert uniformity_p_value(views[name][:, 0].reshape(-1), prime) > P_VALUE, name  # residues mod q_0
        decoded = np.concatenate([ring_mask.decode(public, level, v, 2.0**36) for v in views[name]])[:LENGTH]
        assert np.median(np.abs(decoded)) > 1000 * 100.0  # nowhere near either sum (|values| ≤ 100)
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
    np.testing.assert_allclose(values, np.sum(terms, axis=0), atol=HEParameters.UNPACKED_PRECISION)


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
        poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), global_scale_bits=60, packing="none"
    )
    secret = ckks.create_secret_context(he)
    public = ckks.load_public_context(ckks.public_context_bytes(secret))
    level = ring_mask.data_level(secret)
    assert [q.bit_length() for q in level.moduli] == [60, 40, 40]

    def key_authority(padded: list[bytes], slots: int) -> np.ndarray:
        views = [ring_mask.load_ciphertext(secret, c, level, "chunk") for c in padded]
        return np.stack([ring_mask.decrypt_flooded(secret, view, level, he.flooding_std()) for view in views])

    terms = [np.random.default_rng(20 + i).uniform(-1e6, 1e6, 5000) for i in range(2)]
    values = masked_decryption(public, summed(public, terms), 5000, None, 2, key_authority)
    np.testing.assert_allclose(values, np.sum(terms, axis=0), atol=he.UNPACKED_PRECISION)
