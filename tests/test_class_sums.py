"""Node-level DP by private class sums (privacy/class_sums.py, model/centroids.py, methods/centroids.py): the
sensitivity claim, calibration against Opacus, the scores and their propagation, the policy's refusals, and a
small federation end to end (plaintext and CKKS)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError, PolicyError
from fedgl_secure.methods.centroids import apply_centroids_policy
from fedgl_secure.methods.privacy_checks import check_consortium, check_runnable
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.model.centroids import centroid_scores, propagate
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy import class_sums
from fedgl_secure.privacy.accounting import gaussian_epsilon
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.tomlio import read_toml

POLICY = "policies/node-dp-centroids.toml"


def _customers(seed: int = 0, n: int = 50, f: int = 12, c: int = 3):
    rng = np.random.default_rng(seed)
    features = rng.random((n, f)) * (rng.random((n, f)) < 0.4)
    labels = rng.integers(0, c, n)
    training = rng.random(n) < 0.5
    return features, labels, training


def test_removing_one_customer_moves_the_class_sums_by_at_most_its_own_unit_row():
    features, labels, training = _customers()
    rows = class_sums.unit_rows(features)
    full = class_sums.class_sums(rows, labels, training, 3)
    for v in range(features.shape[0]):
        keep = np.arange(features.shape[0]) != v
        without = class_sums.class_sums(class_sums.unit_rows(features[keep]), labels[keep], training[keep], 3)
        moved = np.linalg.norm(full - without)
        # Eq. C2: exactly the row's norm (1, or 0 for an all-zero row) for a training customer, 0 otherwise
        expected = np.linalg.norm(rows[v]) if training[v] else 0.0
        assert moved == pytest.approx(expected, abs=1e-12)
        assert moved <= class_sums.SENSITIVITY + 1e-12


def test_class_sums_are_the_per_class_sums_of_unit_rows_and_refuse_foreign_labels():
    features, labels, training = _customers(seed=1)
    rows = class_sums.unit_rows(features)
    sums = class_sums.class_sums(rows, labels, np.flatnonzero(training), 3)
    for c in range(3):
        assert np.allclose(sums[c], rows[training & (labels == c)].sum(axis=0))
    norms = np.linalg.norm(rows, axis=1)
    assert np.allclose(norms[norms > 0], 1.0)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        class_sums.class_sums(rows, labels, training, 2)


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_calibrated_multiplier_spends_the_target_epsilon_by_opacus_accountant(epsilon):
    z = class_sums.noise_multiplier(epsilon, 1e-5)
    spent = gaussian_epsilon(class_sums.releases(z), 1e-5)
    assert spent <= epsilon
    assert spent >= 0.97 * epsilon  # not needlessly noisy
    assert class_sums.noise_multiplier(math.inf, 1e-5) == 0.0
    assert class_sums.releases(0.0) == []


def test_release_adds_noise_of_the_calibrated_std_and_leaves_the_input_alone():
    sums = np.zeros((40, 500))
    noisy = class_sums.release(sums, 0.8)
    assert np.all(sums == 0)
    assert np.std(noisy) == pytest.approx(0.8, rel=0.03)
    assert np.array_equal(class_sums.release(sums + 1.0, 0.0), sums + 1.0)


def test_scores_are_cosines_to_the_clipped_class_directions_and_propagation_follows_eq_c4():
    rng = np.random.default_rng(2)
    features = rng.random((6, 4))
    sums = rng.normal(size=(3, 4))
    scores = centroid_scores(torch.tensor(features, dtype=torch.float32), torch.tensor(sums), nonnegative=True)
    clipped = np.maximum(sums, 0)
    expected = (features / np.linalg.norm(features, axis=1, keepdims=True)) @ (
        clipped / np.linalg.norm(clipped, axis=1, keepdims=True)
    ).T
    assert np.allclose(scores.numpy(), expected, atol=1e-6)
    sparse_scores = centroid_scores(
        SparseOperator.from_scipy(sp.csr_matrix(features), "cpu"), torch.tensor(sums), nonnegative=True
    )
    assert torch.allclose(sparse_scores, scores, atol=1e-6)

    edges = sp.csr_matrix(np.array([[0, 1, 0, 0, 0, 1], [1, 0, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0]] + [[0] * 6] * 3))
    adjacency = gcn_normalize(((edges + edges.T) > 0).astype(float))
    operator = SparseOperator.from_scipy(adjacency, "cpu")
    dense = adjacency.toarray()
    z, s = expected.copy(), expected.copy()
    for _ in range(3):
        z = 0.8 * dense @ z + 0.2 * s
    assert np.allclose(propagate(torch.tensor(s, dtype=torch.float32), operator, 3, 0.2).numpy(), z, atol=1e-5)
    assert torch.equal(propagate(scores, operator, 0, 0.2), scores)


def _policy(**changes) -> dict:
    values = read_toml(POLICY, "policy file", PolicyError)
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        target = values
        for parent in parents:
            target = target.setdefault(parent, {})
        target[key] = value
    return values


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"dp.unit": "edge", "dp.edges": {"mechanism": "randomized-response", "epsilon": 1.0}}, "dp.node_mechanism"),
        ({"dp.weights": {"clip": 1.0, "noise_multiplier": 1.0}}, "dp.node_mechanism"),
        ({"allowed_kinds": ["weights", "embeddings", "node_weight"]}, "allowed_kinds"),
    ],
)
def test_policy_refuses_invalid_centroid_combinations_naming_the_field(changes, field):
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        policy_from_dict(_policy(**changes), source="centroids-test")


def test_shipped_policy_states_a_node_guarantee_without_degree_bound_within_budget():
    guarantees = effective_guarantees(load_policy(POLICY))
    assert guarantees.unit == "node" and guarantees.status == "dp"
    assert guarantees.epsilon <= guarantees.budget_epsilon == 8.0
    (channel,) = guarantees.channels
    assert channel.channel == class_sums.CLASS_SUMS and channel.sensitivity == 1.0
    assert "whatever its degree" in guarantees.protects


def test_centroid_policy_is_refused_by_other_methods_and_vice_versa_and_with_local_noise_by_the_services():
    policy = load_policy(POLICY)
    check_consortium(policy, build_config({"method": "centroids"}))  # central noise: the key authority's, once
    local = policy_from_dict(_policy(**{"dp.centroids": {"noise": "local"}}), source="local")
    with pytest.raises(ConfigError, match="noise = 'local' runs in the simulation only"):
        check_consortium(local, build_config({"method": "centroids"}))
    with pytest.raises(ConfigError, match="method 'fedgl' has none"):
        apply_centroids_policy(build_config({"method": "fedgl"}), policy)
    with pytest.raises(ConfigError, match="he.packing"):
        apply_centroids_policy(
            build_config({"method": "centroids"}),
            policy_from_dict(_policy(**{"he.packing": "quantised"}), source="packed"),
        )
    with pytest.raises(ConfigError, match="method 'federated' has none"):
        check_runnable(policy, build_config({"method": "federated"}))
    with pytest.raises(ConfigError, match="its own node-level DP"):
        check_runnable(load_policy("policies/strict-dp.toml"), build_config({"method": "centroids"}))


def _dataset():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)


@pytest.mark.parametrize("noise", ["central", "local"])
def test_a_federation_under_the_policy_records_one_release_per_bank_and_beats_chance(noise):
    dataset = _dataset()
    policy = policy_from_dict(_policy(**{"budget.epsilon": 50.0, "dp.centroids.noise": noise}), source="eps50")
    config = build_config({"method": "centroids", "seed": 0, "device": "cpu", "federation": {"max_rounds": 4}})
    privacy = FederationPrivacy(policy)
    result = run_experiment(config, dataset, progress=False, privacy=privacy)
    assert result.config["centroids"]["epsilon"] == 50.0  # the policy's ε, not the config's default (no DP)
    assert result.config["centroids"]["noise"] == noise
    assert result.rounds_run == 1  # one release: the policy's run has one round
    assert result.global_test_accuracy > 1.0 / dataset.num_classes + 0.15
    ledgers = privacy.ledgers()
    assert len(ledgers) == 6
    for ledger in ledgers.values():
        assert [(r.round, r.channel) for r in ledger.releases] == [(1, class_sums.CLASS_SUMS)]
        assert ledger.epsilon(1e-5) == pytest.approx(effective_guarantees(policy).epsilon)


def _summed(config_values: dict, policy=None) -> torch.Tensor:
    broadcasts = []
    privacy = FederationPrivacy(policy) if policy is not None else None
    run_experiment(build_config(config_values), _dataset(), progress=False, privacy=privacy, observer=broadcasts.append)
    return broadcasts[0].weights.to(torch.float64) * 6  # W̄ = Σ_k S_k (+ noise) over the six banks, each weighted 1


@pytest.mark.parametrize(("noise", "total_std_factor"), [("central", 1.0), ("local", math.sqrt(6))])
def test_the_sum_carries_z_with_central_noise_and_sqrt_k_z_with_local_noise(noise, total_std_factor):
    values = {"method": "centroids", "seed": 0, "device": "cpu", "federation": {"max_rounds": 1}}
    exact = _summed(values)  # no policy, ε = inf: the exact Σ_k S_k of the same banks
    policy = policy_from_dict(_policy(**{"budget.epsilon": 2.0, "dp.centroids.noise": noise}), source="eps2")
    noisy = _summed(values, policy)
    z = class_sums.noise_multiplier(2.0, 1e-5)
    difference = (noisy - exact).numpy()
    assert difference.size > 100
    assert np.std(difference) == pytest.approx(z * total_std_factor, rel=0.3)


def test_central_noise_without_a_key_authority_that_adds_it_is_refused():
    config = build_config({"method": "centroids", "device": "cpu", "centroids": {"noise": "central", "epsilon": 8.0}})
    with pytest.raises(ConfigError, match="centroids.noise = 'central'"):
        run_experiment(config, _dataset(), progress=False)


def test_without_a_policy_later_rounds_re_send_the_one_release():
    broadcasts = []
    config = build_config(
        {
            "method": "centroids",
            "seed": 0,
            "device": "cpu",
            "federation": {"max_rounds": 3, "patience": 3},
            "centroids": {"epsilon": 8.0},
        }
    )
    run_experiment(config, _dataset(), progress=False, observer=broadcasts.append)
    assert len(broadcasts) == 3 and all(torch.equal(b.weights, broadcasts[0].weights) for b in broadcasts[1:])


def test_without_noise_the_secure_sum_gives_the_plaintext_model():
    from fedgl_secure.crypto.secure_summation import SecureSummation

    dataset = _dataset()
    config = build_config({"method": "centroids", "seed": 0, "device": "cpu", "federation": {"max_rounds": 1}})
    plain, secure = [], []
    run_experiment(config, dataset, progress=False, observer=plain.append)
    values = read_toml(POLICY, "policy file", PolicyError)
    del values["dp"], values["budget"]  # the shipped HE settings (packing none), no DP
    policy = policy_from_dict(values, source="centroids-no-dp")
    summation = SecureSummation(policy)
    run_experiment(config, dataset, progress=False, observer=secure.append, summation=summation)
    # one decrypted sum: within the error the policy states (CKKS noise and the decryption's flooding)
    assert torch.allclose(plain[0].weights, secure[0].weights, atol=policy.he.unpacked_error())
    assert plain[0].weights.abs().max() > 0.01  # the sums are real, not zeros


def test_negative_features_are_refused_while_the_sums_are_clipped_at_zero():
    dataset = _dataset()
    negative = dataset.features.copy().tolil()
    negative[0, 0] = -0.01  # one small negative value in a row that stays positive overall
    negative[0, 1] = 5.0
    import dataclasses

    shifted = dataclasses.replace(dataset, features=sp.csr_matrix(negative))
    config = build_config({"method": "centroids", "seed": 0, "device": "cpu", "federation": {"max_rounds": 1}})
    with pytest.raises(ConfigError, match="centroids.nonnegative"):
        run_experiment(config, shifted, progress=False)
    unclipped = build_config({**config.model_dump(mode="json"), "centroids": {"nonnegative": False}})
    assert run_experiment(unclipped, shifted, progress=False).rounds_run == 1


def test_membership_inference_attacks_the_class_sums_model_itself():
    from fedgl_secure.audit.attacks import global_model_membership, membership_inference_auc
    from fedgl_secure.model.centroids import CentroidPropagation
    from fedgl_secure.simulation.experiment import Federation

    dataset = _dataset()
    config = build_config({"method": "centroids", "seed": 0, "device": "cpu", "federation": {"max_rounds": 1}})
    broadcasts = []
    run_experiment(config, dataset, progress=False, observer=broadcasts.append)
    merged = Federation.build(dataset, config, torch.device("cpu")).merged
    result = global_model_membership(config, broadcasts[0].weights, merged, round_number=1, seed=0)
    model = CentroidPropagation(merged.features.shape[1], merged.num_classes, 20, 0.1, True)
    model.load_flat_parameters(broadcasts[0].weights)
    expected = membership_inference_auc(model, merged, seed=0)  # the plain Â: the method's evaluation graph
    assert result.auc == expected.auc and result.members == expected.members > 0
    # the class sums contain every training row: without noise the attack finds the members
    assert result.auc > 0.55


def test_every_in_method_node_mechanism_of_the_schema_has_its_methods_hooks():
    from typing import get_args

    from fedgl_secure.method_registry import in_method_mechanisms
    from fedgl_secure.methods import in_method_mechanism
    from fedgl_secure.policy.dp import DPSettings

    schema_mechanisms = set(get_args(DPSettings.model_fields["node_mechanism"].annotation)) - {"channels"}
    assert set(in_method_mechanisms()) == schema_mechanisms  # the registry's owners are the schema's choices
    for name in in_method_mechanisms():
        policy = SimpleNamespace(dp=SimpleNamespace(node_mechanism=name))
        mechanism = in_method_mechanism(policy)
        assert mechanism is not None, name
        assert callable(mechanism.apply_policy) and callable(mechanism.releases)
    assert in_method_mechanism(SimpleNamespace(dp=SimpleNamespace(node_mechanism="channels"))) is None


def test_a_bank_service_records_the_class_sums_release_once_even_when_it_re_sends_the_round():
    from fedgl_secure.methods import apply_in_method_policy
    from fedgl_secure.methods.centroids import centroids_releases
    from fedgl_secure.privacy.accounting import PrivacyLedger
    from fedgl_secure.privacy.dp_round import BankPrivacy

    policy = load_policy(POLICY)
    config = apply_in_method_policy(build_config({"method": "centroids"}), policy)
    channels, releases_of_round = centroids_releases(config)
    bank = BankPrivacy("bank-a", policy, 4.0, ledger=PrivacyLedger("bank-a", channels=channels))
    contribution = {"weights": torch.full((5,), 2.0)}
    first = bank.release_in_method(1, contribution, releases_of_round(1))
    assert torch.equal(first["weights"], torch.full((5,), 0.5))  # normalised by w_max only: no noise of the bank's
    assert bank.release_in_method(1, contribution, releases_of_round(1)) is not None  # a restarted bank re-sends
    assert bank.ledger.releases == tuple(releases_of_round(1))  # ... and pays once
    assert bank.release_in_method(2, contribution, releases_of_round(2)) is not None and not releases_of_round(2)
    # a ledger that already spent the budget elsewhere (e.g. another federation's release) refuses a new one
    spent = PrivacyLedger("bank-a", channels=channels)
    spent.extend(releases_of_round(1))
    other = BankPrivacy("bank-a", policy, 4.0, ledger=spent)
    assert other.release_in_method(1, contribution, [releases_of_round(1)[0].model_copy(update={"round": 2})]) is None
