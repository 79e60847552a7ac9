"""Units of privacy (dp.unit): edge / label mechanisms at the source, their accounting and validation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from scipy.stats import binomtest

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import PolicyError
from fedgl_secure.methods.base import WEIGHTS
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy import edge_mechanisms, label_mechanisms, secure_noise
from fedgl_secure.privacy.dp_round import BankPrivacy, FederationPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.privacy.label_dp import forward_corrected_loss
from fedgl_secure.privacy.release_schedule import planned_ledger
from fedgl_secure.simulation.experiment import run_experiment

POLICIES = Path(__file__).resolve().parents[1] / "policies"


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


def edge_policy(epsilon: float = 4.0, **dp) -> dict:
    return {
        "protection": "he",
        "dp": {"unit": "edge", "edges": {"mechanism": "randomized-response", "epsilon": epsilon}, **dp},
        "budget": {"epsilon": epsilon, "rounds": 50},
    }


def label_policy(epsilon: float = 2.0, mechanism: str = "randomized-response") -> dict:
    return {
        "protection": "he",
        "dp": {"unit": "label", "labels": {"mechanism": mechanism, "epsilon": epsilon}},
        "budget": {"epsilon": epsilon, "rounds": 50},
    }


# --- mechanisms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "classes"), [(0.5, 7), (2.0, 7), (1.0, 2)])
def test_label_randomised_response_keeps_and_flips_at_the_stated_rates(epsilon, classes):
    labels = np.random.default_rng(1).integers(0, classes, 20_000)
    released = label_mechanisms.randomized_response_labels(labels, epsilon, classes, _random_bytes=seeded_bytes(2))
    keep = math.exp(epsilon) / (math.exp(epsilon) + classes - 1)
    assert label_mechanisms.label_keep_probability(epsilon, classes) == pytest.approx(keep)
    kept = int((released == labels).sum())
    assert binomtest(kept, labels.size, keep).pvalue > 1e-3
    # a flipped label lands on each of the other classes uniformly: class 0's flips
    flipped_from_0 = released[(labels == 0) & (released != 0)]
    counts = np.bincount(flipped_from_0, minlength=classes)[1:]
    assert counts.min() > 0 and np.all(np.abs(counts / counts.sum() - 1 / (classes - 1)) < 0.05)
    assert released.min() >= 0 and released.max() < classes


def test_label_randomised_response_touches_only_the_masked_labelled_nodes():
    labels = np.array([0, 1, 2, -1, 1, 0] * 500)
    mask = np.tile([True, True, False, True, False, True], 500)
    released = label_mechanisms.randomized_response_labels(labels, 0.1, 3, mask, _random_bytes=seeded_bytes(0))
    assert np.array_equal(released[~mask], labels[~mask])
    assert np.all(released[labels == -1] == -1)
    assert (released[mask & (labels >= 0)] != labels[mask & (labels >= 0)]).any()


def test_label_noise_matrix_rows_are_distributions_with_the_ratio_e_to_the_epsilon():
    matrix = label_mechanisms.label_noise_matrix(1.5, 5)
    assert np.allclose(matrix.sum(axis=1), 1.0)
    assert matrix.max() / matrix.min() == pytest.approx(math.exp(1.5))


def test_laplace_noise_has_the_mechanism_scale():
    scale = secure_noise.laplace_scale(0.5)  # b = 1/ε
    assert scale == 2.0
    noise = secure_noise.secure_laplace(200_000, scale, _random_bytes=seeded_bytes(3))
    assert abs(noise.mean()) < 0.03
    assert np.abs(noise).mean() == pytest.approx(scale, rel=0.02)  # E|X| = b
    assert noise.var() == pytest.approx(2 * scale**2, rel=0.03)  # Var = 2b²


def test_laplace_edge_weights_perturbs_existing_edges_only_and_stays_symmetric():
    rng = np.random.default_rng(0)
    upper = sp.triu(sp.random(60, 60, 0.1, random_state=rng, data_rvs=np.ones), k=1)
    adjacency = ((upper + upper.T) > 0).astype(np.float64)
    released = edge_mechanisms.laplace_edge_weights(adjacency, 1.0, _random_bytes=seeded_bytes(1))
    assert (abs(released - released.T)).max() == 0
    new_pairs = (released != 0).astype(int) - (released != 0).multiply(adjacency != 0)
    assert new_pairs.nnz == 0  # no new pairs: an edge's existence is not hidden
    assert released.min() >= 0 and released.nnz < adjacency.nnz  # some weights clamped to 0 and dropped


# --- policy: units and their validation ---------------------------------------------------------


def test_every_shipped_policy_names_its_unit():
    for path in sorted(POLICIES.glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        assert "\n[dp]\n" in text and "\nunit = " in text, path.name
        policy = load_policy(path)
        assert policy.dp.unit == effective_guarantees(policy).unit


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dp": {"unit": "edge"}}, "dp.unit"),  # edge unit without its mechanism
        ({"dp": {"unit": "edge", "edges": {"mechanism": "laplace", "epsilon": 1.0}}}, "dp.unit"),
        ({"dp": {"unit": "label", "labels": {"mechanism": "randomized-response"}}}, "dp.labels.epsilon"),
        ({"dp": {"unit": "label", "labels": {"mechanism": "flip", "epsilon": 1.0}}}, "dp.labels.mechanism"),
        ({"dp": {"unit": "galaxy"}}, "dp.unit"),
        (
            {
                "allowed_kinds": ["weights", "predictions", "node_weight"],
                "dp": {"unit": "bank", "weights": {"clip": 1.0, "noise_multiplier": 2.0}},
            },
            "allowed_kinds",
        ),
        (
            {
                "dp": {
                    "unit": "edge",
                    "edges": {"mechanism": "randomized-response", "epsilon": 1.0},
                    "labels": {"mechanism": "randomized-response", "epsilon": 1.0},
                }
            },
            "dp.unit",
        ),
    ],
)
def test_a_unit_without_its_mechanism_is_refused_naming_the_field(change, field):
    values = {"protection": "he", "budget": {"epsilon": 4.0, "rounds": 10}, **change}
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        policy_from_dict(values)


@pytest.mark.parametrize(
    ("values", "field"), [(edge_policy(4.0), "dp.edges.epsilon"), (label_policy(2.0), "dp.labels.epsilon")]
)
def test_a_one_off_release_over_the_budget_is_refused_naming_its_epsilon(values, field):
    values["budget"]["epsilon"] = values["budget"]["epsilon"] / 2  # the release alone would spend twice the budget
    with pytest.raises(PolicyError, match=field.replace(".", r"\.") + ".*exceeds budget.epsilon"):
        policy_from_dict(values)
    values["budget"]["epsilon"] *= 2  # equal: within budget, accepted
    assert effective_guarantees(policy_from_dict(values)).budget_met


def test_a_source_only_unit_needs_no_channel_per_upload_kind():
    policy = policy_from_dict(edge_policy())
    assert policy.dp.source_only and policy.dp.effective_unit == "edge"
    released = effective_guarantees(policy).released_without_dp
    assert "node_weight" in released and not {"weights", "predictions", "embeddings"} & set(released)


# --- accounting per unit -----------------------------------------------------------------------


@pytest.mark.parametrize("values", [edge_policy(4.0), label_policy(2.0)])
def test_edge_and_label_epsilon_is_paid_once_and_does_not_grow_with_rounds(values):
    policy = policy_from_dict(values)
    budget = values["budget"]["epsilon"]
    spent = [planned_ledger(policy, rounds).epsilon(1e-5) for rounds in (1, 10, 300)]
    assert spent == [budget, budget, budget]
    guarantees = effective_guarantees(policy)
    assert guarantees.epsilon == budget and guarantees.budget_met and guarantees.rounds_within_budget == 50
    assert guarantees.unit == values["dp"]["unit"] and "not" not in guarantees.protects[:3]


def test_node_unit_still_composes_per_round():
    policy = load_policy(POLICIES / "strict-dp.toml")
    assert policy.dp.unit == "node"
    assert planned_ledger(policy, 10).epsilon(1e-5) > planned_ledger(policy, 1).epsilon(1e-5)


def test_an_edge_unit_bank_uploads_its_terms_normalised_and_records_nothing_per_round():
    policy = policy_from_dict(edge_policy(4.0))
    bank = BankPrivacy("bank-0", policy, normaliser=200.0, random_bytes=seeded_bytes(0))
    adjacency = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float))
    bank.prepare_adjacency(adjacency, np.random.default_rng(0))
    contribution = {WEIGHTS: torch.tensor([100.0, 50.0, 100.0]), "predictions": torch.ones(3, 2) * 100.0}
    for round_number in (1, 2, 3):
        released = bank.protect(round_number, contribution, torch.zeros(2), 100.0)
        assert torch.equal(released[WEIGHTS], torch.tensor([0.5, 0.25, 0.5]))
        assert torch.equal(released["predictions"], torch.full((3, 2), 0.5))
    assert [r.channel for r in bank.ledger.releases] == ["edges"]
    assert bank.ledger.epsilon(1e-5) == 4.0


def test_forward_corrected_loss_is_cross_entropy_without_noise_and_fits_the_noisy_distribution():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]])
    labels = torch.tensor([0, 2])
    assert forward_corrected_loss(logits, labels, torch.eye(3)) == pytest.approx(float(F.cross_entropy(logits, labels)))
    matrix = torch.as_tensor(label_mechanisms.label_noise_matrix(1.0, 3), dtype=torch.float32)
    noisy = torch.softmax(logits, 1) @ matrix
    expected = -(torch.log(noisy[0, 0]) + torch.log(noisy[1, 2])) / 2
    assert forward_corrected_loss(logits, labels, matrix) == pytest.approx(float(expected))


@pytest.fixture(scope="module")
def small():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)


CONFIG = {
    "method": "fedgl",
    "device": "cpu",
    "training": {"local_epochs": 2},
    "federation": {"max_rounds": 2, "proportions": [0.6, 0.7, 0.5]},  # three banks: the default quorum
}


def final_weights(small, privacy=None) -> tuple[object, dict]:
    seen = {}
    config = build_config(CONFIG)
    result = run_experiment(
        config, small, progress=False, privacy=privacy, observer=lambda b: seen.update({b.round_number: b})
    )
    return result, seen


@pytest.mark.parametrize("values", [edge_policy(3.0), label_policy(1.0), label_policy(1.0, "rr-with-prior")])
def test_a_source_only_run_spends_its_epsilon_once_and_trains_on_the_released_data(small, values):
    privacy = FederationPrivacy(policy_from_dict(values), random_bytes=seeded_bytes(0))
    result, seen = final_weights(small, privacy)
    assert result.rounds_run == 2 and result.stopped_reason is None and set(seen) == {1, 2}
    for ledger in privacy.ledgers().values():
        assert len(ledger.releases) == 1 and ledger.epsilon(1e-5) == values["budget"]["epsilon"]
    _, plain = final_weights(small)
    assert not torch.equal(seen[2].weights, plain[2].weights)  # the graph / labels it trained on changed


def test_an_edge_unit_run_with_negligible_flips_is_the_plain_run(small):
    """At ε = 700 randomised response flips nothing (p ≈ e^-700): the post-processing path adds nothing else."""
    privacy = FederationPrivacy(policy_from_dict(edge_policy(700.0)), random_bytes=seeded_bytes(0))
    _, private = final_weights(small, privacy)
    _, plain = final_weights(small)
    assert torch.equal(private[2].weights, plain[2].weights)
    assert torch.equal(private[2].pseudo_labels, plain[2].pseudo_labels)


def test_the_released_graph_is_weighted_by_the_posterior_of_a_true_edge():
    n, pairs = 1900, 1900 * 1899 // 2
    for epsilon, true_edges in ((8.0, 2600), (1.0, 2600)):
        p = edge_mechanisms.flip_probability(epsilon)
        released = round((1 - p) * true_edges + p * (pairs - true_edges))
        prior = true_edges / pairs
        expected = (1 - p) * prior / ((1 - p) * prior + p * (1 - prior))
        assert edge_mechanisms.randomized_response_posterior(n, released, epsilon) == pytest.approx(expected, rel=1e-3)
    assert edge_mechanisms.randomized_response_posterior(n, 3203, 8.0) > 0.7
    assert edge_mechanisms.randomized_response_posterior(n, 486_385, 1.0) < 0.01
    bank = BankPrivacy("bank-0", policy_from_dict(edge_policy(2.0)), 1.0, random_bytes=seeded_bytes(0))
    ring = sp.csr_matrix(sp.diags([np.ones(199), np.ones(199)], [1, -1], shape=(200, 200)))
    released = bank.prepare_adjacency(ring, np.random.default_rng(0))
    weights = np.unique(released.data)
    assert weights.size == 1 and weights[0] == pytest.approx(
        edge_mechanisms.randomized_response_posterior(200, released.nnz // 2, 2.0)
    )
    unweighted = BankPrivacy(
        "bank-1",
        policy_from_dict(
            edge_policy(2.0, edges={"mechanism": "randomized-response", "epsilon": 2.0, "weighting": "none"})
        ),
        1.0,
        random_bytes=seeded_bytes(0),
    )
    assert np.all(unweighted.prepare_adjacency(ring, np.random.default_rng(0)).data == 1.0)


def test_a_consortium_accepts_the_edge_unit_and_a_label_unit_released_by_each_bank():
    from fedgl_secure.methods.privacy_checks import check_consortium

    config = build_config({"method": "fedgl"})
    check_consortium(policy_from_dict(label_policy(2.0)), config)  # the consortium prior: test_bank_label_release
    check_consortium(load_policy(POLICIES / "strict-edge-dp.toml"), config)
    # under a source-only unit the bank service uploads P_k and H_k of its trained model, as the simulation
    assert not FederationPrivacy(load_policy(POLICIES / "strict-edge-dp.toml")).recomputes_node_terms
    assert FederationPrivacy(load_policy(POLICIES / "strict-dp.toml")).recomputes_node_terms


@pytest.mark.parametrize(
    ("name", "unit", "epsilon"), [("strict-edge-dp.toml", "edge", "8"), ("label-dp.toml", "label", "2")]
)
def test_policy_check_prints_the_unit_epsilon_delta_and_what_is_and_is_not_protected(name, unit, epsilon):
    from typer.testing import CliRunner

    from fedgl_secure.cli import app

    result = CliRunner().invoke(app, ["policy", "check", str(POLICIES / name)])
    assert result.exit_code == 0, result.output
    assert f"unit of privacy: {unit}" in result.output
    assert f"epsilon: {epsilon}, delta: 1e-05" in result.output
    assert "\nprotected: " in result.output and "\nnot protected: " in result.output
    assert "does not grow with rounds" in result.output
