"""Label DP with a prior: RRWithPrior (Ghazi et al., NeurIPS 2021) and the multi-stage release inside a bank."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy import label_mechanisms, label_release
from fedgl_secure.privacy.accounting import LABELS
from fedgl_secure.privacy.dp_round import BankPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.privacy.release_schedule import planned_ledger


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


def prior_policy(epsilon: float = 2.0, **labels) -> dict:
    return {
        "protection": "he",
        "dp": {"unit": "label", "labels": {"mechanism": "rr-with-prior", "epsilon": epsilon, **labels}},
        "budget": {"epsilon": epsilon, "rounds": 50},
    }


PRIORS = [
    np.array([0.5, 0.3, 0.1, 0.05, 0.05, 0.0, 0.0]),
    np.array([0.97, 0.01, 0.01, 0.01]),
    np.full(5, 0.2),
    np.array([0.4, 0.4, 0.1, 0.1]),
    np.random.default_rng(3).dirichlet(np.ones(6)),
]


# --- RRWithPrior --------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 6.0])
def test_rr_with_prior_picks_the_k_that_maximises_the_expected_kept_mass(epsilon):
    priors = np.random.default_rng(0).dirichlet(np.full(7, 0.4), size=200)
    order, k = label_mechanisms.rr_with_prior_top_k(priors, epsilon)
    for row, prior in enumerate(priors):
        ranked = np.sort(prior)[::-1]
        objective = [math.exp(epsilon) / (math.exp(epsilon) + j - 1) * ranked[:j].sum() for j in range(1, 8)]
        assert objective[k[row] - 1] == pytest.approx(max(objective), rel=1e-12)
        assert np.allclose(prior[order[row, : k[row]]], ranked[: k[row]])


@pytest.mark.parametrize(("prior", "epsilon"), list(itertools.product(PRIORS, [0.1, 1.0, 2.0, 4.0])))
def test_rr_with_prior_is_epsilon_label_dp_in_closed_form(prior, epsilon):
    matrix = label_mechanisms.rr_with_prior_matrix(prior, epsilon)
    assert np.allclose(matrix.sum(axis=1), 1.0)
    released = matrix.sum(axis=0) > 0
    # every output the mechanism can give has positive probability under every true label …
    assert (matrix[:, released] > 0).all() and (matrix[:, ~released] == 0).all()
    # … and the likelihood ratio between any two true labels is at most e^ε
    ratio = matrix[:, released].max(axis=0) / matrix[:, released].min(axis=0)
    assert (ratio <= math.exp(epsilon) * (1 + 1e-12)).all()


def test_a_uniform_prior_gives_plain_randomised_response():
    assert np.allclose(
        label_mechanisms.rr_with_prior_matrix(np.full(6, 1 / 6), 1.5), label_mechanisms.label_noise_matrix(1.5, 6)
    )
    _, k = label_mechanisms.rr_with_prior_top_k(np.zeros((1, 4)), 1.0)
    assert k[0] == 4


@pytest.mark.parametrize("prior", PRIORS[:2] + PRIORS[3:])
def test_rr_with_prior_draws_from_its_closed_form_distribution(prior):
    epsilon, per_class = 2.0, 4_000
    classes = prior.size
    labels = np.repeat(np.arange(classes), per_class)
    released = label_mechanisms.rr_with_prior_labels(
        labels, np.tile(prior, (labels.size, 1)), epsilon, _random_bytes=seeded_bytes(5)
    )
    counts = np.zeros((classes, classes))
    np.add.at(counts, (labels, released), 1)
    expected = label_mechanisms.rr_with_prior_matrix(prior, epsilon)
    # each cell is a binomial proportion: 5 standard errors (≈ 6e-7 two-sided per cell)
    tolerance = 5 * np.sqrt(expected * (1 - expected) / per_class) + 1e-12
    assert (np.abs(counts / per_class - expected) <= tolerance).all()


def test_rr_with_prior_likelihood_is_the_matrix_column_of_what_was_released():
    priors = np.random.default_rng(1).dirichlet(np.ones(5), size=50)
    labels = np.random.default_rng(2).integers(0, 5, 50)
    released = label_mechanisms.rr_with_prior_labels(labels, priors, 1.0, _random_bytes=seeded_bytes(0))
    likelihood = label_mechanisms.rr_with_prior_likelihood(priors, released, 1.0)
    for row in range(50):
        assert np.allclose(likelihood[row], label_mechanisms.rr_with_prior_matrix(priors[row], 1.0)[:, released[row]])


def test_rr_with_prior_touches_only_the_masked_labelled_nodes():
    labels = np.array([0, 1, 2, -1, 1, 0] * 200)
    mask = np.tile([True, True, False, True, False, True], 200)
    priors = np.tile([0.1, 0.1, 0.8], (labels.size, 1))
    released = label_mechanisms.rr_with_prior_labels(labels, priors, 0.5, mask, _random_bytes=seeded_bytes(0))
    assert np.array_equal(released[~mask], labels[~mask])
    assert np.all(released[labels == -1] == -1)
    assert (released[mask & (labels >= 0)] != labels[mask & (labels >= 0)]).any()


# --- the multi-stage release --------------------------------------------------------------------


def planted_bank(nodes: int = 600, classes: int = 4, seed: int = 0):
    """A homophilous graph (p_in = 0.03, p_out = 0.002) whose features are noisy class indicators."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, nodes)
    same = labels[:, None] == labels[None, :]
    upper = np.triu(rng.random((nodes, nodes)) < np.where(same, 0.03, 0.002), k=1)
    adjacency = sp.csr_matrix(upper | upper.T, dtype=np.float64)
    features = np.eye(classes)[labels] * 0.6 + rng.random((nodes, classes))
    features /= features.sum(axis=1, keepdims=True)
    train = np.zeros(nodes, dtype=bool)
    train[: nodes // 4] = True
    val = np.zeros(nodes, dtype=bool)
    val[nodes // 4 : nodes // 2] = True
    return labels, adjacency, features, train, val


def test_stages_are_disjoint_cover_the_labelled_nodes_and_put_training_last_when_asked():
    labels, _, _, train, val = planted_bank()
    for order in ("random", "validation-first"):
        stage = label_release.release_stages(train, val, 3, order, _random_bytes=seeded_bytes(1))
        assert np.array_equal(stage >= 0, train | val)
        assert set(np.unique(stage[stage >= 0])) == {0, 1, 2}
    assert (stage[train] == 2).all() and (stage[val] < 2).all()


@pytest.mark.parametrize("prior", label_release.PRIORS)
def test_a_prior_never_reads_the_labels_it_will_release(prior):
    """RRWithPrior is ε-label-DP only for a prior independent of the label: changing the released labels of
    nodes outside ``known`` must not move any prior."""
    labels, adjacency, features, train, val = planted_bank()
    estimate = label_release._prior_estimator(prior, adjacency, features, 4, 1.0)
    likelihood = label_mechanisms.label_noise_matrix(1.0, 4)[:, labels].T
    other = (labels + 1) % 4
    changed = np.where(train, other, labels)
    changed_likelihood = label_mechanisms.label_noise_matrix(1.0, 4)[:, changed].T
    assert np.array_equal(estimate(labels, likelihood, val), estimate(changed, changed_likelihood, val))
    assert not np.array_equal(
        estimate(labels, likelihood, val | train), estimate(changed, changed_likelihood, val | train)
    )


@pytest.mark.parametrize("prior", label_release.PRIORS)
def test_the_multi_stage_release_gets_more_labels_right_than_randomised_response(prior):
    labels, adjacency, features, train, val = planted_bank()
    right_rr, right_staged = 0, 0
    for seed in range(4):
        source = seeded_bytes(seed)
        rr = label_mechanisms.randomized_response_labels(labels, 1.0, 4, train | val, _random_bytes=source)
        staged, likelihood = label_release.multi_stage_release(
            labels, train, val, adjacency, 4, 1.0, 2, "validation-first", prior, features, _random_bytes=source
        )
        # each released label's likelihood row is its transition column: randomised response's for stage 1
        rr_column = label_mechanisms.label_noise_matrix(1.0, 4)[:, staged[val]].T
        assert np.allclose(likelihood[val], rr_column)
        assert np.allclose(likelihood[train, staged[train]], likelihood[train].max(axis=1))
        assert np.array_equal(staged[~(train | val)], labels[~(train | val)])
        right_rr += int((rr[train] == labels[train]).sum())
        right_staged += int((staged[train] == labels[train]).sum())
    # RR keeps e/(e + 3) ≈ 0.48 of 600 training labels; the staged release must do clearly better
    assert right_staged > right_rr + 60


@pytest.mark.parametrize("prior", label_release.PRIORS)
def test_a_bank_without_validation_labels_releases_its_training_labels_by_plain_randomised_response(prior):
    labels, adjacency, features, train, val = planted_bank()
    released, likelihood = label_release.multi_stage_release(
        labels,
        train,
        np.zeros_like(val),
        adjacency,
        4,
        1.0,
        2,
        "validation-first",
        prior,
        features,
        _random_bytes=seeded_bytes(0),
    )
    assert np.allclose(likelihood[train], label_mechanisms.label_noise_matrix(1.0, 4)[:, released[train]].T)


# --- policy, ledger, guarantees -----------------------------------------------------------------


def test_rr_with_prior_is_recorded_as_one_release_of_epsilon():
    policy = policy_from_dict(prior_policy(2.0, stages=3, stage_order="validation-first"), source="test")
    labels, adjacency, features, train, val = planted_bank()
    bank = BankPrivacy("bank-0", policy, 1.0, random_bytes=seeded_bytes(0))
    released = bank.prepare_labels(labels, train, val, 4, adjacency, features)
    assert [(r.channel, r.epsilon) for r in bank.ledger.releases] == [(LABELS, 2.0)]
    assert (released[train | val] != labels[train | val]).any()
    assert planned_ledger(policy, 200).epsilon(1e-5, "rdp") == pytest.approx(2.0)
    text = " ".join(effective_guarantees(policy).assumptions)
    assert "rr-with-prior" in text and "3 stages" in text and "validation-first" in text


@pytest.mark.parametrize("field", ["stages", "stage_order", "prior"])
def test_stage_settings_are_refused_without_rr_with_prior(field):
    values = prior_policy(2.0, **{field: {"stages": 2, "stage_order": "random", "prior": "sgc"}[field]})
    values["dp"]["labels"]["mechanism"] = "randomized-response"
    with pytest.raises(PolicyError, match=f"dp.labels.{field}"):
        policy_from_dict(values, source="test")


def test_rr_with_prior_needs_at_least_two_stages():
    with pytest.raises(PolicyError, match="stages"):
        policy_from_dict(prior_policy(2.0, stages=1), source="test")


def test_the_forward_correction_under_rr_with_prior_trains_with_each_nodes_own_transition():
    from fedgl_secure.privacy.dp_round import FederationPrivacy

    policy = policy_from_dict(prior_policy(2.0, correction="forward", stage_order="validation-first"), source="test")
    labels, adjacency, features, train, val = planted_bank()
    privacy = FederationPrivacy(policy, random_bytes=seeded_bytes(0))
    privacy.setup_bank(0, "bank-0", 1.0, adjacency, np.random.default_rng(0))
    released = privacy.banks[0].prepare_labels(labels, train, val, 4, adjacency, features)

    class Trainer:  # what attach_training reads of a LocalTrainer
        graph = type("Graph", (), {"num_classes": 4, "labels": torch.as_tensor(released)})()
        private_training = None

    trainer = Trainer()
    privacy.attach_training(0, trainer)
    expected = privacy.banks[0].label_likelihood
    assert np.allclose(trainer.private_training.likelihood.numpy(), expected, atol=1e-7)
    # RRWithPrior's rows are not randomised response's: the training labels had a prior
    rr_rows = label_mechanisms.label_noise_matrix(2.0, 4)[:, released].T
    assert not np.allclose(expected[train], rr_rows[train])
