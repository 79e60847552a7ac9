"""The feature posterior of an edge release (``[dp.edges] weighting = "feature-posterior"``,
:mod:`fedgl_secure.privacy.edge_posterior`): per-bin estimates on hand numbers, the all-pairs and sampled
similarity counts, true edges weighted above random ones, and the bank's path (post-processing, ε paid once)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy import edge_mechanisms, edge_posterior
from fedgl_secure.privacy.dp_round import BankPrivacy, FederationPrivacy
from fedgl_secure.simulation.experiment import run_experiment


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


def edge_policy(epsilon: float, weighting: str = "feature-posterior") -> dict:
    return {
        "protection": "he",
        "dp": {
            "unit": "edge",
            "edges": {"mechanism": "randomized-response", "epsilon": epsilon, "weighting": weighting},
        },
        "budget": {"epsilon": epsilon, "rounds": 50},
    }


def clustered_bank(n: int = 240, clusters: int = 4, degree: int = 6, seed: int = 0):
    """Customers in ``clusters`` groups with group-specific features; every link joins two of one group."""
    rng = np.random.default_rng(seed)
    group = np.arange(n) % clusters
    features = rng.random((n, 40)) * 0.2
    features[np.arange(n), group * 10 + rng.integers(0, 10, n)] += 1.0  # a word of the group's vocabulary
    features[:, :40] += np.eye(clusters).repeat(10, axis=1)[group] * 0.5
    rows, cols = [], []
    for i in range(n):
        same = np.flatnonzero((group == group[i]) & (np.arange(n) != i))
        for j in rng.choice(same, size=degree // 2, replace=False):
            rows += [i, j]
            cols += [j, i]
    adjacency = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    adjacency.data[:] = 1.0
    return adjacency, features


def test_the_global_posterior_keeps_one_true_edge_where_a_bin_may_have_none():
    # fewer releases than noise alone gives: a bin's estimate is 0 true edges (weight 0), the whole graph's is
    # floored at one (weight > 0, the formula of the module doc with π = 1/P)
    n, epsilon = 200, 1.0
    pairs, p = n * (n - 1) / 2, edge_mechanisms.flip_probability(1.0)
    too_few = int(0.5 * p * pairs)
    (in_a_bin,) = edge_mechanisms.randomized_response_posteriors(np.array([too_few]), np.array([pairs]), epsilon)
    assert in_a_bin == 0.0
    prior = 1 / pairs
    expected = (1 - p) * prior / ((1 - p) * prior + p * (1 - prior))
    assert edge_mechanisms.randomized_response_posterior(n, too_few, epsilon) == pytest.approx(expected, rel=1e-12)


def test_a_bin_with_fewer_releases_than_noise_alone_would_give_weighs_nothing():
    p = edge_mechanisms.flip_probability(1.0)
    weights = edge_mechanisms.randomized_response_posteriors(
        np.array([0.5 * p * 1000, p * 1000 + 300, 5]), np.array([1000, 1000, 0]), 1.0
    )
    assert weights[0] == 0.0 and weights[2] == 0.0  # below p·P_b: no true edge estimated; no pairs: weight 0
    density = 300 / (1 - 2 * p) / 1000
    assert weights[1] == pytest.approx((1 - p) * density / ((1 - p) * density + p * (1 - density)))


def test_all_pair_similarities_are_the_upper_triangle_of_the_cosine_matrix():
    features = np.random.default_rng(1).random((2_300, 5))  # more rows than one block
    features[7] = 0.0  # a zero row stays at similarity 0
    norms = np.linalg.norm(features, axis=1)
    cosine = (features @ features.T) / np.outer(np.where(norms > 0, norms, 1.0), np.where(norms > 0, norms, 1.0))
    unit = sp.csr_matrix(features / np.where(norms > 0, norms, 1.0)[:, None])
    similarities = edge_posterior.all_pair_similarities(unit)
    np.testing.assert_allclose(similarities, cosine[np.triu_indices(2_300, k=1)], atol=1e-12)
    rows, cols = np.triu_indices(2_300, k=1)
    assert np.all(similarities[(rows == 7) | (cols == 7)] == 0.0)


def test_true_edges_between_similar_customers_weigh_more_than_random_ones_and_sampling_agrees():
    adjacency, features = clustered_bank()
    released = edge_mechanisms.randomized_response_edges(adjacency, 2.0, _random_bytes=seeded_bytes(3))
    exact = edge_posterior.feature_posterior_weights(released, features, 2.0, np.random.default_rng(0))
    sampled = edge_posterior.feature_posterior_weights(
        released, features, 2.0, np.random.default_rng(0), exact_up_to=10, sample_pairs=400_000
    )
    assert (exact != 0).sum() <= released.nnz and abs(exact - exact.T).max() == 0.0  # symmetric, no new edge
    true_released = released.multiply(adjacency)
    on_true = exact.multiply(adjacency).sum() / true_released.nnz
    on_noise = (exact.sum() - exact.multiply(adjacency).sum()) / (released.nnz - true_released.nnz)
    assert on_true > 3 * on_noise
    share = exact.multiply(adjacency).sum() / exact.sum()
    assert share > 2 * true_released.nnz / released.nnz  # more of the weight on true edges than uniform weights give
    # a sample of pairs estimates P_b (and the quantile cuts), so an edge near a cut may change bin; the weight in
    # all and on true edges stays within a few per cent of the all-pairs count's
    assert sampled.sum() == pytest.approx(exact.sum(), rel=0.05)
    assert sampled.multiply(adjacency).sum() == pytest.approx(exact.multiply(adjacency).sum(), rel=0.05)


def test_a_bank_weights_its_release_by_the_feature_posterior_and_pays_epsilon_once():
    adjacency, features = clustered_bank()
    bank = BankPrivacy("bank-0", policy_from_dict(edge_policy(2.0)), 1.0, random_bytes=seeded_bytes(0))
    prepared = bank.prepare_adjacency(adjacency, np.random.default_rng(0), lambda: features)
    released = edge_mechanisms.randomized_response_edges(adjacency, 2.0, _random_bytes=seeded_bytes(0))
    expected = edge_posterior.feature_posterior_weights(released, features, 2.0, np.random.default_rng(0))
    np.testing.assert_array_equal(prepared.toarray(), expected.toarray())
    assert np.unique(prepared.data).size > 1  # one weight per similarity bin, not one for all
    assert len(bank.ledger.releases) == 1 and bank.ledger.epsilon(1e-5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="needs the bank's features"):
        BankPrivacy("bank-1", policy_from_dict(edge_policy(2.0)), 1.0).prepare_adjacency(
            adjacency, np.random.default_rng(0)
        )


def test_the_policy_names_an_unknown_weighting():
    with pytest.raises(PolicyError, match="weighting"):
        policy_from_dict(edge_policy(2.0, weighting="similarity"))


@pytest.fixture(scope="module")
def small():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)


def test_a_federation_trains_on_the_feature_weighted_release(small):
    def final(weighting: str):
        privacy = FederationPrivacy(policy_from_dict(edge_policy(2.0, weighting)), random_bytes=seeded_bytes(4))
        config = build_config({"device": "cpu", "training": {"local_epochs": 2}, "federation": {"max_rounds": 2}})
        seen: list = []
        run_experiment(config, small, progress=False, privacy=privacy, observer=seen.append)
        return seen[-1].weights, privacy

    weighted, privacy = final("feature-posterior")
    uniform, _ = final("posterior")  # the same release (one seeded byte source), weighted otherwise
    assert torch.isfinite(weighted).all() and not torch.allclose(weighted, uniform)
    for ledger in privacy.ledgers().values():
        assert len(ledger.releases) == 1 and ledger.epsilon(1e-5) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "weighting, phrase",
    [("posterior", "from n, the released count and ε only"), ("feature-posterior", "the bank's features")],
)
def test_the_guarantees_say_what_the_weighting_reads(weighting, phrase):
    from fedgl_secure.privacy.guarantees import effective_guarantees

    assumptions = effective_guarantees(policy_from_dict(edge_policy(2.0, weighting))).assumptions
    (edge,) = [line for line in assumptions if line.startswith("Edge DP")]
    assert phrase in edge and "post-processing" in edge


def test_only_the_feature_posterior_reads_the_features():
    adjacency, _ = clustered_bank()

    def unread():
        raise AssertionError("features read by a weighting that does not use them")

    for weighting in ("posterior", "none"):
        bank = BankPrivacy("bank-0", policy_from_dict(edge_policy(2.0, weighting)), 1.0, random_bytes=seeded_bytes(0))
        assert bank.prepare_adjacency(adjacency, np.random.default_rng(0), unread).nnz > 0
