"""GAP node-level DP (privacy/gap.py, methods/gap.py): degree bound and sensitivity, calibration against Opacus,
the policy's refusals, and a small federation end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError, PolicyError
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.methods.gap import GAP, apply_gap_policy, bounded_adjacency, check_gap_policy
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy import gap
from fedgl_secure.privacy.accounting import gaussian_epsilon
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.tomlio import read_toml

POLICY = "policies/node-dp-gap.toml"


def _graph_tensors(adjacency: sp.csr_matrix) -> GraphTensors:
    n = adjacency.shape[0]
    zeros = np.zeros(n, dtype=bool)
    from fedgl_secure.model.sparse import SparseOperator

    return GraphTensors(
        features=SparseOperator.from_scipy(sp.identity(n, format="csr"), "cpu"),
        labels=torch.zeros(n, dtype=torch.int64),
        train_mask=torch.as_tensor(zeros),
        val_mask=torch.as_tensor(zeros),
        test_mask=torch.as_tensor(zeros),
        positions=np.arange(n),
        num_global_nodes=n,
        base_adjacency=gcn_normalize(adjacency),
        num_classes=2,
        device=torch.device("cpu"),
    )


def _hub_graph() -> sp.csr_matrix:
    """A star of 40 leaves around node 0 plus a random sparse part: node 0 is far over any small bound."""
    rng = np.random.default_rng(3)
    rows = [0] * 40 + list(rng.integers(1, 60, 80))
    cols = list(range(1, 41)) + list(rng.integers(1, 60, 80))
    matrix = sp.coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(60, 60)).tocsr()
    matrix = ((matrix + matrix.T) > 0).astype(np.float64)
    matrix.setdiag(0)
    matrix.eliminate_zeros()
    return sp.csr_matrix(matrix)


def test_degree_bound_holds_after_the_projection_and_bounds_the_hop_sensitivity():
    raw = _hub_graph()
    assert raw.sum(axis=1).max() > 5
    bounded = bounded_adjacency(_graph_tensors(raw), 5, seed=0, purpose=0).to_dense().numpy()
    degrees = bounded.sum(axis=1)
    assert degrees.max() <= 5  # in- and out-degree alike: the matrix is symmetric
    assert np.array_equal(bounded, bounded.T) and np.all(np.diag(bounded) == 0)
    # Eq. A2: removing any node v moves the other rows of A x by at most √D in Frobenius norm
    x = gap.normalise_rows(torch.randn(60, 4, generator=torch.Generator().manual_seed(0))).numpy()
    for v in range(60):
        without = bounded.copy()
        without[v, :] = 0
        without[:, v] = 0
        keep = np.arange(60) != v
        moved = np.linalg.norm((bounded @ x - without @ x)[keep])
        assert moved <= gap.aggregation_sensitivity(5) + 1e-9


def test_calibrated_noise_spends_the_target_epsilon_by_opacus_accountant():
    settings = gap.GAPSettings(encoder_rounds=2, classifier_rounds=3, local_steps=2, sample_rate=0.5, hops=2)
    noise = gap.calibrate(settings, 4.0, 1e-5)
    # the library's accountant on the three releases, composed: at most the target and close to it
    spent = gaussian_epsilon(gap.releases(settings, noise), 1e-5)
    assert 0.9 * 4.0 <= spent <= 4.0
    # each module alone, at its multiplier, spends less than the whole (composition adds)
    for release in gap.releases(settings, noise):
        assert gaussian_epsilon([release], 1e-5) < spent
    # the aggregation multiplier is σ / √D: doubling D at the same σ halves it
    assert noise.aggregation > 0 and gap.calibrate(settings, math.inf, 1e-5) == gap.NO_NOISE


def _gap_policy(**changes) -> dict:
    values = read_toml(POLICY, "policy file", PolicyError)
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        target = values
        for parent in parents:
            target = target.setdefault(parent, {})
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return values


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"dp.unit": "edge", "dp.edges": {"mechanism": "randomized-response", "epsilon": 1.0}}, "dp.node_mechanism"),
        ({"dp.gap": None}, "dp.gap"),
        ({"dp.node_mechanism": None}, "dp.gap"),
        ({"dp.sgd": {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "local_epochs": 1}}, "dp.node_mechanism"),
        ({"dp.gap.max_degree": 0}, "dp.gap.max_degree"),
        ({"dp.gap.epsilon_split": [0.5, 0.5, 0.5]}, "dp.gap.epsilon_split"),
        ({"budget.rounds": 3}, "budget.rounds"),
        ({"allowed_kinds": ["weights", "predictions", "node_weight"]}, "allowed_kinds"),
    ],
)
def test_policy_refuses_invalid_gap_combinations_naming_the_field(changes, field):
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        policy_from_dict(_gap_policy(**changes), source="gap-test")


def test_shipped_gap_policy_states_a_node_guarantee_within_budget():
    guarantees = effective_guarantees(load_policy(POLICY))
    assert guarantees.unit == "node" and guarantees.status == "dp"
    assert guarantees.epsilon <= guarantees.budget_epsilon
    assert {c.channel for c in guarantees.channels} == {gap.ENCODER, gap.AGGREGATION, gap.CLASSIFIER}
    assert any("√D" in line for line in guarantees.assumptions)


def test_gap_policy_runs_in_the_services_and_is_refused_with_another_method():
    policy = load_policy(POLICY)
    # the services apply the policy's GAP settings first (methods.apply_in_method_policy); a bank keeps its hops
    check_consortium(policy, apply_gap_policy(build_config({"method": "gap"}), policy))  # test_gap_consortium.py
    with pytest.raises(ConfigError, match="method 'fedgl'"):
        check_gap_policy(policy, build_config({"method": "fedgl"}))
    strict = load_policy("policies/strict-dp.toml")
    from fedgl_secure.methods.privacy_checks import check_runnable

    with pytest.raises(ConfigError, match="its own node-level DP"):
        check_runnable(strict, build_config({"method": "gap"}))


def test_a_small_gap_federation_beats_chance_at_a_large_epsilon():
    dataset = synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)
    values = _gap_policy(**{"budget.epsilon": 1e4, "dp.gap.encoder_rounds": 8, "dp.gap.classifier_rounds": 8})
    values["budget"]["rounds"] = 16
    policy = policy_from_dict(values, source="gap-large-eps")
    config = build_config(
        {"method": "gap", "seed": 0, "device": "cpu", "federation": {"max_rounds": 16, "patience": 16}}
    )
    privacy = FederationPrivacy(policy)
    result = run_experiment(config, dataset, progress=False, privacy=privacy)
    num_classes = dataset.num_classes
    assert result.config["gap"]["epsilon"] == 1e4  # the policy's ε, not the config's default (no DP)
    assert result.global_test_accuracy > 1.0 / num_classes + 0.1
    # every bank kept a ledger of the schedule it ran: ε spent = the policy's guarantee
    spent = [ledger.epsilon(1e-5) for ledger in privacy.ledgers().values()]
    assert len(spent) == 6 and spent == pytest.approx([effective_guarantees(policy).epsilon] * 6)


def test_round_releases_of_the_schedule_compose_to_the_planned_guarantee():
    settings = gap.GAPSettings(encoder_rounds=2, classifier_rounds=2, local_steps=3, hops=2)
    noise = gap.GAPNoise(5.0, 4.0, 6.0)
    recorded = [r for n in range(1, settings.rounds + 3) for r in gap.round_releases(settings, noise, n)]
    assert [(r.round, r.channel) for r in recorded] == [
        (1, gap.ENCODER),
        (2, gap.ENCODER),
        (3, gap.AGGREGATION),
        (3, gap.CLASSIFIER),
        (4, gap.CLASSIFIER),
    ]  # nothing after the schedule
    assert gaussian_epsilon(recorded, 1e-5) == pytest.approx(gap.composed_epsilon(settings, noise, 1e-5))


def test_perturbed_hops_follow_eq_a1_with_given_draws_and_fresh_draws_differ():
    adjacency = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    embeddings = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])
    noise = (torch.tensor([[0.5, 0.0], [0.0, 0.5], [0.1, 0.1]]), torch.zeros(3, 2))
    hops = gap.perturbed_hops(embeddings, adjacency, 2, 1.0, noise=noise)
    x0 = embeddings / embeddings.norm(dim=1, keepdim=True)
    x1 = adjacency @ x0 + noise[0]
    x1 = x1 / x1.norm(dim=1, keepdim=True)
    assert torch.allclose(hops[0], x0) and torch.allclose(hops[1], x1)
    assert torch.allclose(hops[2].norm(dim=1), torch.ones(3))  # every release is row-normalised
    fresh = [gap.perturbed_hops(embeddings, adjacency, 1, 1.0)[1] for _ in range(2)]
    assert not torch.allclose(*fresh)  # σ > 0: the CSPRNG draws anew


def test_a_bank_records_the_hops_in_the_round_that_draws_them_and_never_draws_kept_hops_again(monkeypatch):
    # what a bank service records (GAP.bank_releases) and keeps across restarts (kept_release)
    dataset = synthetic_consortium(seed=0, num_nodes=120, num_features=40, num_val=20, num_test=20)
    values = _gap_policy(**{"dp.gap.encoder_rounds": 2, "dp.gap.classifier_rounds": 2, "dp.gap.local_steps": 1})
    values["budget"]["rounds"] = 4
    policy = policy_from_dict(values, source="gap-bank")
    config = apply_gap_policy(build_config({"method": "gap", "seed": 0, "device": "cpu"}), policy)

    def trainer_of(method: GAP) -> LocalTrainer:
        graph = GraphTensors.from_graph(dataset, np.arange(dataset.num_nodes), dataset.num_nodes, "cpu", True)
        return LocalTrainer(0, graph, config.training, 0, method.build_model(graph.features.shape[1], 4))

    method = GAP(config)
    trainer = trainer_of(method)
    weights = trainer.model.flat_parameters()
    recorded = []
    for training_round in range(1, 6):  # the schedule, and one round after it
        method.client_contribution(trainer, Broadcast(training_round - 1, weights))
        recorded += [(r.round, r.channel) for r in method.bank_releases(trainer, training_round)]
    assert recorded == [
        (1, gap.ENCODER),
        (2, gap.ENCODER),
        (3, gap.AGGREGATION),
        (3, gap.CLASSIFIER),
        (4, gap.CLASSIFIER),
    ]
    kept = method.kept_release(trainer)
    assert set(kept) == {"hops"} and kept["hops"].shape == (dataset.num_nodes, 3 * config.gap.encoder_dim)

    # a restarted bank: a new method instance takes the hops back; drawing them again fails the test
    restarted = GAP(config)
    again = trainer_of(restarted)
    restarted.restore_kept_release(again, kept)

    def no_second_draw(*args, **kwargs):
        raise AssertionError("a restarted bank drew its hops again")

    monkeypatch.setattr(gap, "perturbed_hops", no_second_draw)
    restarted.client_contribution(again, Broadcast(3, weights))
    assert [(r.round, r.channel) for r in restarted.bank_releases(again, 4)] == [(4, gap.CLASSIFIER)]
    with pytest.raises(ConfigError, match="kept GAP hops of shape"):
        restarted.restore_kept_release(again, {"hops": kept["hops"][:, :5]})


def test_a_bank_service_records_kept_hops_once_and_refuses_to_start_without_them(tmp_path):
    # a bank's restore of GAP's hops (consortium/bank_releases.py): a file the ledger does not record yet (stopped
    # between the two writes) is recorded once; a ledger that records hops whose file is gone refuses to start
    from fedgl_secure.consortium.bank_releases import BankReleases
    from fedgl_secure.consortium.bank_state import LEDGER_FILE, METHOD_RELEASE_FILE
    from fedgl_secure.consortium.kept_release import keep_release
    from fedgl_secure.log import get_logger
    from fedgl_secure.privacy.accounting import PrivacyLedger
    from fedgl_secure.privacy.dp_round import BankPrivacy

    dataset = synthetic_consortium(seed=0, num_nodes=120, num_features=40, num_val=20, num_test=20)
    policy = load_policy(POLICY)
    config = apply_gap_policy(build_config({"method": "gap", "seed": 0, "device": "cpu"}), policy)
    method = GAP(config)
    graph = GraphTensors.from_graph(dataset, np.arange(dataset.num_nodes), dataset.num_nodes, "cpu", True)
    trainer = LocalTrainer(0, graph, config.training, 0, method.build_model(graph.features.shape[1], 4))
    hops = np.random.default_rng(0).random((dataset.num_nodes, 3 * config.gap.encoder_dim)).astype(np.float32)
    keep_release(tmp_path / METHOD_RELEASE_FILE, method.kept_release_settings(), round=np.array(7), hops=hops)

    worker = BankReleases(
        name="bank-a",
        client_index=0,
        config=config,
        policy=policy,
        method=method,
        state_dir=tmp_path,
        random_bytes=None,
        log=get_logger(node="bank-a", role="bank"),
    )
    channels = (gap.ENCODER, gap.AGGREGATION, gap.CLASSIFIER)
    worker.privacy.banks[0] = BankPrivacy("bank-a", policy, 1.0, ledger=PrivacyLedger("bank-a", channels=channels))
    for _ in range(2):  # recorded once, whatever the restarts
        worker.restore_method_release(trainer)
    ledger = PrivacyLedger.load(tmp_path / LEDGER_FILE)
    assert [(r.round, r.channel) for r in ledger.releases] == [(7, gap.AGGREGATION)]
    assert torch.equal(method.kept_release(trainer)["hops"], torch.from_numpy(hops))

    # hops drawn under other GAP settings (here D) are never taken back
    worker.method = GAP(config.model_copy(update={"gap": config.gap.model_copy(update={"max_degree": 3})}))
    with pytest.raises(
        ConfigError, match=r"privacy-method-release\.npz: a gap release made under gap = .*'max_degree': 5"
    ):
        worker.restore_method_release(trainer)
    worker.method = method

    (tmp_path / METHOD_RELEASE_FILE).unlink()
    with pytest.raises(ConfigError, match=r"privacy-method-release\.npz: missing.*second release"):
        worker.restore_method_release(trainer)
