"""The aggregator's one-time masks: the key authority decrypts s + r, the aggregator recovers s."""

from __future__ import annotations

import numpy as np

from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.masking import draw_mask, mask_bound, mask_sum, unmask


def test_masks_are_uniform_fresh_and_bounded():
    first, second = draw_mask(20_000, 10.0), draw_mask(20_000, 10.0)
    assert np.all(np.abs(first) <= 10.0)
    assert not np.array_equal(first, second)
    # uniform on [-10, 10): mean 0 (sd of the mean 0.04) and variance 100/3 (sd ≈ 0.4); 5-sigma bounds
    assert abs(first.mean()) < 0.2
    assert abs(first.var() - 100 / 3) < 2.0


def test_the_key_authority_sees_a_masked_sum_and_the_aggregator_recovers_it(small_context, small_he):
    public = ckks.load_public_context(ckks.public_context_bytes(small_context))
    rng = np.random.default_rng(1)
    terms = [rng.uniform(-50, 50, 3000) for _ in range(3)]
    summed = ckks.add_serialized(public, [ckks.encrypt_vector(public, term) for term in terms])
    bound = mask_bound(small_he.coeff_mod_bit_sizes, small_he.global_scale_bits)
    masked, mask = mask_sum(public, summed, 3000, bound)
    seen_by_key_authority = ckks.decrypt_vector(small_context, masked, 3000)
    truth = np.sum(terms, axis=0)
    # what the key authority decrypts is far from the sum (the mask dominates) ...
    assert np.median(np.abs(seen_by_key_authority - truth)) > bound / 10
    # ... and the aggregator gets the sum back to CKKS precision
    assert np.max(np.abs(unmask(seen_by_key_authority, mask) - truth)) < 1e-4
