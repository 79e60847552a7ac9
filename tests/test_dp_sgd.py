"""DP-SGD on a GCN (policy [dp.sgd]): exact ego-net examples, Opacus' clipping checked independently, noise scale,
and the simulation running under a DP-SGD policy with honest accounting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch.func import functional_call, grad, vmap

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError, PolicyError
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.losses import fedgl_loss
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy import dp_sgd
from fedgl_secure.privacy.accounting import DP_SGD, PREDICTIONS
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.graph_sensitivity import affected_rows, bound_degree
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.privacy.release_schedule import planned_ledger
from fedgl_secure.simulation.experiment import run_experiment

POLICIES = Path(__file__).resolve().parents[1] / "policies"
NODES, FEATURES, CLASSES, HIDDEN, MAX_DEGREE = 60, 20, 3, 8, 4


@pytest.fixture(scope="module")
def graph():
    """A random graph bounded to degree 4, sparse features, labels, 15 training nodes and pseudo labels."""
    rng = np.random.default_rng(0)
    upper = sp.triu(sp.random(NODES, NODES, density=0.08, random_state=1), k=1)
    adjacency = ((upper + upper.T) > 0).astype(np.float64)
    adjacency = bound_degree(sp.csr_matrix(adjacency), MAX_DEGREE, rng)
    features = sp.csr_matrix(rng.random((NODES, FEATURES)) * (rng.random((NODES, FEATURES)) < 0.3))
    train = torch.zeros(NODES, dtype=torch.bool)
    train[:15] = True
    return {
        "features": SparseOperator.from_scipy(features),
        "adjacency": SparseOperator.from_scipy(gcn_normalize(adjacency)),
        "labels": torch.as_tensor(rng.integers(0, CLASSES, NODES)),
        "train": train,
        "pseudo": torch.as_tensor(rng.integers(-1, CLASSES, NODES)),
    }


def gcn(seed: int = 0) -> GCN:
    model = GCN(FEATURES, HIDDEN, CLASSES, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model


def examples_of(graph, alpha: float = 0.5):
    return dp_sgd.ego_examples(graph["adjacency"], graph["labels"], graph["train"], graph["pseudo"], alpha, MAX_DEGREE)


def ego_copy(model: GCN) -> dp_sgd.EgoGCN:
    ego = dp_sgd.EgoGCN(FEATURES, HIDDEN, CLASSES, dropout=0.0)
    ego.load_from(model)
    return ego


def independent_per_example_gradients(model: GCN, aggregated, examples) -> dict[str, torch.Tensor]:
    """Per-example gradients with torch.func (vmap over examples), not through Opacus' hooks."""
    ego = ego_copy(model)
    parameters = {name: p.detach() for name, p in ego.named_parameters()}

    def loss(params, rows, weights, target, loss_weight):
        logits = functional_call(ego, params, (rows.unsqueeze(0), weights.unsqueeze(0)))
        return loss_weight * torch.nn.functional.cross_entropy(logits, target.unsqueeze(0))

    return vmap(grad(loss), (None, 0, 0, 0, 0))(
        parameters, aggregated, examples.centre_weights, examples.targets, examples.loss_weights
    )


def test_ego_net_examples_reproduce_the_full_batch_gcn(graph):
    model = gcn()
    examples = examples_of(graph)
    aggregated = dp_sgd.aggregated_rows(graph["features"], graph["adjacency"], examples, 0.0, None)
    ego = ego_copy(model).eval()
    full = model(graph["features"], graph["adjacency"]).logits
    pseudo_nodes = torch.nonzero((graph["pseudo"] >= 0) & ~graph["train"]).flatten()
    centres = torch.cat([torch.nonzero(graph["train"]).flatten(), pseudo_nodes])
    assert len(examples.targets) == 15 + len(pseudo_nodes)
    torch.testing.assert_close(ego(aggregated, examples.centre_weights), full[centres], atol=1e-6, rtol=1e-5)


def test_unclipped_sum_over_training_labels_is_the_gradient_of_eq8(graph):
    model = gcn()
    examples = examples_of(graph, alpha=0.5)
    aggregated = dp_sgd.aggregated_rows(graph["features"], graph["adjacency"], examples, 0.0, None)
    ego = ego_copy(model)
    private = GradSampleModuleFastGradientClipping(ego, loss_reduction="sum", max_grad_norm=1e9)
    summed, _, _ = dp_sgd.clipped_gradient_sum(private, ego, aggregated, examples, None)
    fedgl_loss(
        model(graph["features"], graph["adjacency"]).logits, graph["labels"], graph["train"], graph["pseudo"], 0.5
    ).backward()
    for parameter, total in zip(model.parameters(), summed, strict=True):
        torch.testing.assert_close(total / examples.num_train, parameter.grad, atol=1e-6, rtol=1e-4)


def test_opacus_ghost_clipping_matches_independently_clipped_per_example_gradients(graph):
    model = gcn(seed=3)
    examples = examples_of(graph)
    aggregated = dp_sgd.aggregated_rows(graph["features"], graph["adjacency"], examples, 0.0, None)
    reference = independent_per_example_gradients(model, aggregated, examples)
    norms = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in reference.values()))
    clip = float(norms.median())  # about half the examples are clipped
    ego = ego_copy(model)
    private = GradSampleModuleFastGradientClipping(ego, loss_reduction="sum", max_grad_norm=clip)
    summed, opacus_norms, _ = dp_sgd.clipped_gradient_sum(private, ego, aggregated, examples, None)
    torch.testing.assert_close(opacus_norms, norms, atol=1e-5, rtol=1e-4)
    factors = torch.clamp(clip / (norms + 1e-6), max=1.0)
    assert 0.3 < float((factors < 1).float().mean()) < 0.7
    expected = [torch.einsum("b,b...->...", factors, reference[name]) for name in ("lin0.weight", "lin0.bias")]
    expected += [torch.einsum("b,b...->...", factors, reference[name]) for name in ("lin1.weight", "lin1.bias")]
    expected = [expected[0].T, expected[1], expected[2].T, expected[3]]
    for got, want in zip(summed, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    # and every clipped example contributes at most the clip: the sum's norm is bounded by B·C
    total = torch.sqrt(sum(g.pow(2).sum() for g in summed))
    assert float(total) <= len(examples.targets) * clip + 1e-6


def test_a_node_above_the_degree_bound_is_refused_by_name():
    star = sp.csr_matrix(([1.0] * 6, ([0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0])), shape=(4, 4))
    normalised = gcn_normalize(star)
    with pytest.raises(dp_sgd.DegreeBoundViolation, match="node 0 has 3 neighbours, above dp.graph.max_degree = 2"):
        dp_sgd.closed_neighbourhoods(normalised, np.array([1, 0]), max_degree=2)


def test_noise_has_the_configured_standard_deviation():
    # 40 000 draws: the sample std's relative standard error is 1/sqrt(2n) ≈ 0.35 %, so 2 % is ≈ 6 errors wide
    trainer = dp_sgd.NodeDPSGD(max_grad_norm=0.5, noise_multiplier=3.0, max_degree=2)
    noised = trainer._add_noise(torch.zeros(200, 200))
    assert float(noised.std()) == pytest.approx(1.5, rel=0.02)
    assert abs(float(noised.mean())) < 5 * 1.5 / 200


# --- the policy and the simulation ------------------------------------------------------------


def sgd_policy(local_epochs: int = 2, epsilon: float = 1e6, weights_channel: bool = False):
    dp = {
        "sgd": {"max_grad_norm": 1.0, "noise_multiplier": 5.0, "local_epochs": local_epochs},
        "predictions": {"clip": 1.0, "noise_multiplier": 1.0},
        "graph": {"max_degree": 3},
    }
    if weights_channel:
        dp["weights"] = {"clip": 1.0, "noise_multiplier": 1.0}
    return policy_from_dict(
        {
            "protection": "he",
            "allowed_kinds": ["weights", "predictions", "node_weight"],
            "dp": dp,
            "budget": {"epsilon": epsilon, "delta": 1e-5, "rounds": 10},
        }
    )


def test_dp_sgd_covers_the_weights_and_nothing_else():
    policy = sgd_policy()
    assert policy.dp.protects("weights") and policy.dp.upload_channel("weights") is None
    guarantees = effective_guarantees(policy)
    assert "weights" not in guarantees.released_without_dp
    k = affected_rows(3, 2, "node")
    (sgd,) = [c for c in guarantees.channels if c.channel == DP_SGD]
    assert sgd.accounted_noise_multiplier == pytest.approx(5.0 / (2 * k - 1))
    without_sgd = {
        "protection": "he",
        "allowed_kinds": ["weights", "predictions", "node_weight"],
        "dp": {"predictions": {"clip": 1.0, "noise_multiplier": 1.0}, "graph": {"max_degree": 3}},
        "budget": {"epsilon": 8.0, "rounds": 10},
    }
    with pytest.raises(PolicyError, match=r"dp\.weights.*\[dp\.sgd\], which covers weights"):
        policy_from_dict(without_sgd)


def test_a_simulated_run_trains_with_dp_sgd_and_records_its_steps(monkeypatch):
    calls = []
    original = dp_sgd.NodeDPSGD.train

    def counting(self, trainer, *args):
        calls.append((trainer.client_id, args[-1]))
        return original(self, trainer, *args)

    monkeypatch.setattr(dp_sgd.NodeDPSGD, "train", counting)
    dataset = synthetic_consortium(seed=0)
    config = build_config(
        {"method": "fedgl-no-gpg", "federation": {"max_rounds": 2}, "training": {"local_epochs": 2}, "device": "cpu"}
    )
    privacy = FederationPrivacy(sgd_policy(local_epochs=2))
    plain_models, private_models = [], []
    run_experiment(config, dataset, progress=False, observer=plain_models.append)
    private = run_experiment(config, dataset, progress=False, privacy=privacy, observer=private_models.append)
    assert private.rounds_run == 2 and private.stopped_reason is None
    banks = len(privacy.banks)
    assert sorted(calls) == sorted([(k, 2) for k in range(banks)] * 2)  # every bank, both rounds, 2 steps each
    # the noisy clipped steps changed the global model (accuracies at 2 rounds can both sit at chance)
    for plain_model, private_model in zip(plain_models, private_models, strict=True):
        assert not torch.allclose(plain_model.weights, private_model.weights, atol=1e-3)
    for ledger in privacy.ledgers().values():
        sgd_steps = [r for r in ledger.releases if r.channel == DP_SGD]
        assert [(r.round, r.steps) for r in sgd_steps] == [(1, 2), (2, 2)]
        assert {r.channel for r in ledger.releases} == {DP_SGD, PREDICTIONS}
        assert ledger.epsilon(1e-5) == pytest.approx(planned_ledger(privacy.policy, 2).epsilon(1e-5))


def test_more_local_epochs_than_the_budget_assumes_is_refused():
    config = build_config(
        {"method": "fedgl-no-gpg", "federation": {"max_rounds": 1}, "training": {"local_epochs": 3}, "device": "cpu"}
    )
    with pytest.raises(ConfigError, match=r"trains 3 local epochs per round, but dp\.sgd\.local_epochs = 2"):
        run_experiment(config, synthetic_consortium(seed=0), progress=False, privacy=FederationPrivacy(sgd_policy(2)))


def test_the_shipped_dp_sgd_policy_is_within_its_budget():
    policy = load_policy(POLICIES / "strict-dp-sgd.toml")
    guarantees = effective_guarantees(policy)
    assert guarantees.budget_met and guarantees.epsilon <= 8.0 and guarantees.rounds_within_budget == 100
    assert "embeddings" not in policy.allowed_kinds and policy.dp.sgd_enabled
