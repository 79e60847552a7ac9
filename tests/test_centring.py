"""Weights uploads centred on the broadcast W̄: the packed range bounds one round's update, not the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedgl_secure.crypto.centring import centre_term, restore_sum
from fedgl_secure.crypto.secure_summation import QuantisedSummation, SecureSummation
from fedgl_secure.errors import CiphertextError
from fedgl_secure.policy.schema import Policy


def weights_terms(rng: np.random.Generator, reference: np.ndarray, banks: int, spread: float) -> dict[int, dict]:
    """Each bank's ``cat(ŵ_k·W_k, [ŵ_k])`` for W_k = W̄ + a small update."""
    terms = {}
    for k in range(banks):
        share = float(rng.uniform(0.3, 1.0))
        update = rng.uniform(-spread, spread, reference.size)
        terms[k] = {"weights": torch.from_numpy(np.append(share * (reference + update), share)).float()}
    return terms


def test_centring_then_summing_then_restoring_gives_the_plain_sum():
    rng = np.random.default_rng(0)
    reference = rng.normal(0, 30, 200)
    terms = [np.append(w * rng.normal(0, 30, 200), w) for w in rng.uniform(0.1, 1, 4)]
    centred = [centre_term("weights", term, reference) for term in terms]
    # what travels is the update ŵ_k·(W_k − W̄), with ŵ_k itself unchanged
    for term, sent in zip(terms, centred, strict=True):
        np.testing.assert_allclose(sent[:-1], term[:-1] - term[-1] * reference, rtol=1e-12, atol=1e-9)
        assert sent[-1] == term[-1]
    np.testing.assert_allclose(restore_sum("weights", np.sum(centred, axis=0), reference), np.sum(terms, axis=0))
    # other kinds, and a round without a reference, pass through
    np.testing.assert_array_equal(centre_term("predictions", terms[0], reference), terms[0])
    np.testing.assert_array_equal(restore_sum("weights", terms[0], None), terms[0])


def test_a_term_of_another_length_than_the_broadcast_is_refused():
    with pytest.raises(CiphertextError, match="cannot be centred on a broadcast of 5 weights"):
        centre_term("weights", np.ones(5), np.zeros(5))


def test_weights_beyond_the_packed_range_still_sum_when_the_round_moved_them_little():
    """The long-federation stall: weights that have grown past the packed range (±2.25 for weights by default)
    are refused as whole values, but a round's update around the public W̄ fits, and decodes to the sum."""
    policy = Policy()
    upper = policy.he.layout("weights").upper
    rng = np.random.default_rng(1)
    reference = rng.choice([-1.0, 1.0], 1500) * rng.uniform(1.5 * upper, 3 * upper, 1500)
    contributions = weights_terms(rng, reference, banks=3, spread=0.05)
    summation = SecureSummation(policy, encrypt_workers=1)
    try:
        with pytest.raises(CiphertextError, match="weights"):
            summation(1, contributions)  # whole weights: out of range, refused (fail closed)
        secure = summation(2, contributions, reference=torch.from_numpy(reference))
    finally:
        summation.close()
    exact = sum(c["weights"].double() for c in contributions.values())
    # float32 W̄ and float32 sums on top of the packed decoding error
    tolerance = policy.he.layout("weights").error_bound + 3 * float(np.abs(reference).max()) * 2**-23
    assert float((secure["weights"].double() - exact).abs().max()) <= tolerance
    quantised = QuantisedSummation(policy)(2, contributions, reference=torch.from_numpy(reference))
    torch.testing.assert_close(secure["weights"], quantised["weights"], rtol=0, atol=0)
