"""The engine's backbones (``training.backbone``): GraphSAGE's mean aggregator, DAGNN's adaptive hops, and
their use by every method that trains the engine's model, in plaintext and under the secure summation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.crypto.secure_summation import SecureSummation
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import CiphertextError, ConfigError
from fedgl_secure.methods.rooted_tree import grafted_propagation
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.model.backbones import build_backbone
from fedgl_secure.model.dagnn import DAGNN
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.sage import GraphSAGE, mean_aggregation
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.simulation.experiment import run_experiment

BASELINE = Path(__file__).resolve().parents[1] / "policies" / "baseline.toml"
BACKBONES = ("gcn", "sage", "dagnn")


def random_graph(seed: int, n: int = 12, p: float = 0.3) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < p, 1)
    return sp.csr_matrix((upper | upper.T).astype(np.float64))


def model_for(backbone: str, features: int, classes: int, hidden: int = 8, hops: int = 3, dropout: float = 0.5):
    training = build_config({"training": {"backbone": backbone, "hidden": hidden, "dagnn_hops": hops}}).training
    return build_backbone(training, features, classes, dropout)


@pytest.mark.parametrize("seed", [0, 1])
def test_mean_aggregation_is_the_neighbour_mean_of_a_plain_graph(seed):
    adjacency = random_graph(seed).tolil()
    adjacency[0, :] = 0  # an isolated node: its aggregate is 0
    adjacency[:, 0] = 0
    adjacency = adjacency.tocsr()
    mean = mean_aggregation(SparseOperator.from_scipy(gcn_normalize(adjacency))).to_dense().double().numpy()
    dense = adjacency.toarray()
    degree = dense.sum(axis=1, keepdims=True)
    expected = np.divide(dense, degree, out=np.zeros_like(dense), where=degree > 0)
    assert np.allclose(mean, expected, atol=1e-6)
    assert np.allclose(mean[0], 0.0) and np.allclose(mean.sum(axis=1)[degree.ravel() > 0], 1.0, atol=1e-6)


def test_mean_aggregation_counts_a_grafted_node_for_the_neighbours_it_stands_for():
    """Fed²GNN's grafted operator (Appendix A): a node standing for m foreign neighbours weighs m in the mean."""
    local = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=np.float64))
    # node 0 has 2 local + 3 foreign neighbours, grafted as one mean node (index 3) standing for all 3
    operator = grafted_propagation(local, np.array([5.0, 1.0, 1.0]), np.array([0]), np.array([3.0]), np.array([4.0]))
    mean = mean_aggregation(SparseOperator.from_scipy(operator)).to_dense().double().numpy()
    assert np.allclose(mean[0], [0.0, 1 / 5, 1 / 5, 3 / 5], atol=1e-6)
    assert np.allclose(mean[3], [1.0, 0.0, 0.0, 0.0], atol=1e-6)  # the grafted node hears its parent


def test_mean_aggregation_refuses_an_operator_without_self_loops():
    with pytest.raises(ValueError, match="self-loop"):
        mean_aggregation(SparseOperator.from_scipy(random_graph(0)))


def test_sage_layer_is_self_plus_neighbour_mean():
    """Hamilton et al.'s mean aggregator: h_i = σ(W_s x_i + W_n mean_{j∈N(i)} x_j + b), then the same again."""
    adjacency = random_graph(2)
    features = torch.rand(12, 5, generator=torch.Generator().manual_seed(0))
    model = GraphSAGE(5, 4, 3, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.bias0.uniform_(-1, 1)
        output = model(features, SparseOperator.from_scipy(gcn_normalize(adjacency)))
    dense = torch.as_tensor(adjacency.toarray(), dtype=torch.float32)
    mean = dense / dense.sum(dim=1, keepdim=True).clamp(min=1)
    w0, w1 = model.weight0.detach(), model.weight1.detach()
    hidden = torch.relu(features @ w0[:, :4] + mean @ features @ w0[:, 4:] + model.bias0.detach())
    logits = hidden @ w1[:, :3] + mean @ hidden @ w1[:, 3:] + model.bias1.detach()
    assert torch.allclose(output.hidden, hidden, atol=1e-5) and torch.allclose(output.logits, logits, atol=1e-5)


def test_dagnn_combines_the_hops_with_per_node_retainment_scores():
    adjacency = gcn_normalize(random_graph(3))
    features = torch.rand(12, 5, generator=torch.Generator().manual_seed(0))
    model = DAGNN(5, 6, 3, hops=4, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = model(features, SparseOperator.from_scipy(adjacency))
        z, _ = model.mlp(features)
    a_hat = torch.as_tensor(adjacency.toarray(), dtype=torch.float32)
    expected = torch.zeros_like(z)
    for k in range(5):
        h_k = torch.linalg.matrix_power(a_hat, k) @ z
        expected += torch.sigmoid(h_k @ model.retain_weight.detach() + model.retain_bias.detach())[:, None] * h_k
    assert torch.allclose(output.logits, expected, atol=1e-5)


def test_dagnn_without_hops_is_the_mlp_up_to_a_positive_per_node_scale():
    """K = 0: out = sigmoid(Z w + b) ⊙ Z — the MLP's logits scaled per node by a score in (0, 1), so the same
    predictions; the graph is not read at all."""
    features = torch.rand(12, 5, generator=torch.Generator().manual_seed(0))
    model = DAGNN(5, 6, 3, hops=0, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():
        z, _ = model.mlp(features)
        on_graph = model(features, SparseOperator.from_scipy(gcn_normalize(random_graph(4)))).logits
        without_edges = model(features, SparseOperator.from_scipy(sp.identity(12, format="csr"))).logits
    scale = on_graph / z
    assert torch.allclose(on_graph, without_edges)
    assert torch.allclose(scale, scale[:, :1].expand_as(scale), atol=1e-5)
    assert bool(((scale > 0) & (scale < 1)).all()) and torch.equal(on_graph.argmax(1), z.argmax(1))


@pytest.mark.parametrize("backbone", BACKBONES)
def test_shapes_and_flat_parameter_round_trip(backbone):
    adjacency = SparseOperator.from_scipy(gcn_normalize(random_graph(0)))
    features = SparseOperator.from_scipy(sp.random(12, 7, density=0.4, random_state=0, format="csr"))
    model, other = model_for(backbone, 7, 3), model_for(backbone, 7, 3)
    model.reset_parameters(torch.Generator().manual_seed(0))
    other.reset_parameters(torch.Generator().manual_seed(1))
    model.eval()
    output = model(features, adjacency)
    assert output.logits.shape == (12, 3) and output.hidden.shape == (12, 8)
    flat = model.flat_parameters()
    assert flat.shape == (sum(p.numel() for p in model.parameters()),)
    assert not torch.equal(other.flat_parameters(), flat)
    other.load_flat_parameters(flat)
    other.eval()
    assert torch.equal(other.flat_parameters(), flat)
    assert torch.equal(other(features, adjacency).logits, output.logits)
    with pytest.raises(ValueError, match="values"):
        other.load_flat_parameters(flat[:-1])


@pytest.mark.parametrize("backbone", BACKBONES)
def test_each_backbone_learns_a_tiny_separable_graph(backbone):
    """Two communities whose labels are told apart only through the features of half their nodes."""
    rng = np.random.default_rng(0)
    n, half = 40, 20
    labels = np.repeat([0, 1], half)
    dense = np.zeros((n, n))
    for block in (range(half), range(half, n)):
        block = np.asarray(block)
        for i in block:
            for j in rng.choice(block, 4, replace=False):
                if i != j:
                    dense[i, j] = dense[j, i] = 1.0
    features = np.zeros((n, 4), dtype=np.float32)
    features[np.arange(n), labels] = 1.0
    features[::2] = 0.0  # every other node has no signal of its own: its neighbours carry it
    features[:, 2:] = rng.random((n, 2))
    adjacency = SparseOperator.from_scipy(gcn_normalize(sp.csr_matrix(dense)))
    x, y = torch.as_tensor(features), torch.as_tensor(labels)
    model = model_for(backbone, 4, 2, hidden=8, hops=3, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x, adjacency).logits, y).backward()
        optimizer.step()
    model.eval()
    accuracy = float((model(x, adjacency).logits.argmax(1) == y).float().mean())
    assert accuracy >= 0.95, accuracy


def test_the_backbone_option_is_validated_at_the_edge():
    with pytest.raises(ConfigError, match=r"training\.backbone"):
        build_config({"training": {"backbone": "gat"}})
    with pytest.raises(ConfigError, match=r"training\.dagnn_hops"):
        build_config({"training": {"backbone": "dagnn", "dagnn_hops": -1}})
    with pytest.raises(ConfigError, match=r"training\.backbone: 'sage' is not used by method 'graphfl'"):
        build_config({"method": "graphfl", "training": {"backbone": "sage"}})
    assert build_config({"training": {"backbone": "dagnn"}}).training.receptive_field == 5
    assert build_config({"training": {"backbone": "sage"}}).training.receptive_field == 2


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0, num_nodes=300, num_val=60, num_test=90)


@pytest.mark.parametrize("backbone", BACKBONES)
def test_simulate_trains_the_backbone(dataset, backbone):
    """FedAvg and Central train the chosen model: W̄ has its length, and it learns something in 3 rounds."""
    sizes = {}
    for method in ("federated", "centralized"):
        config = build_config(
            {
                "method": method,
                "device": "cpu",
                "training": {"backbone": backbone, "dagnn_hops": 3},
                "federation": {"max_rounds": 3},
            }
        )
        observed: list[int] = []
        record = observed.append
        result = run_experiment(
            config, dataset, progress=False, observer=lambda broadcast, record=record: record(broadcast.weights.numel())
        )
        assert result.rounds_run == 3 and result.best_val_accuracy > 1.0 / 4 + 0.05, (method, result.best_val_accuracy)
        sizes[method] = observed
    expected = model_for(backbone, dataset.num_features, dataset.num_classes, hidden=16).flat_parameters().numel()
    assert set(sizes["federated"]) == {expected}


@pytest.mark.parametrize("backbone", ["sage", "dagnn"])
def test_fed2gnn_and_fedavg_full_run_with_the_backbone(dataset, backbone):
    results = {}
    for method in ("fed2gnn", "fedavg-full"):
        config = build_config(
            {
                "method": method,
                "device": "cpu",
                "training": {"backbone": backbone, "dagnn_hops": 3},
                "federation": {"partition": "louvain", "num_clients": 3, "max_rounds": 2},
                "fed2gnn": {"reconstruction": "mean", "projection_dim": 0},
            }
        )
        results[method] = run_experiment(config, dataset, progress=False)
    assert all(r.rounds_run == 2 and 0.0 <= r.global_test_accuracy <= 1.0 for r in results.values())


@pytest.mark.parametrize("backbone", ["sage", "dagnn"])
def test_secure_simulation_with_the_baseline_policy_runs_the_backbone(dataset, backbone):
    """The baseline packs W_k − W̄ into a fixed range: the new models' updates fit it, and a run under CKKS
    gives the plaintext run's validation accuracies; updates that leave the range are refused by name."""
    values = {
        "method": "federated",
        "device": "cpu",
        "training": {"backbone": backbone},
        "federation": {"max_rounds": 2},
    }
    config = build_config(values)
    plain = run_experiment(config, dataset, progress=False)
    summation = SecureSummation(load_policy(BASELINE))
    try:
        secure = run_experiment(config, dataset, progress=False, summation=summation)
    finally:
        summation.close()
    assert [h.val_accuracy for h in secure.history] == pytest.approx([h.val_accuracy for h in plain.history], abs=0.02)
    wild = build_config({**values, "training": {"backbone": backbone, "learning_rate": 20.0}})
    summation = SecureSummation(load_policy(BASELINE))
    try:
        with pytest.raises(CiphertextError, match=r"weights: values in .* leave the packed range \[-2.25, 2.25\]"):
            run_experiment(wild, dataset, progress=False, summation=summation)
    finally:
        summation.close()


def test_gcn_backbone_is_the_engines_gcn():
    model = model_for("gcn", 7, 3)
    assert type(model) is GCN


def test_dp_sgd_refuses_a_backbone_it_does_not_bound():
    from fedgl_secure.methods.privacy_checks import check_runnable

    policy = load_policy(BASELINE.parent / "strict-dp-sgd.toml")
    config = {"method": "federated", "self_supervision": {"beta": 0.0}}
    check_runnable(policy, build_config(config))
    with pytest.raises(ConfigError, match=r"training\.backbone: 'dagnn' under DP-SGD"):
        check_runnable(policy, build_config({**config, "training": {"backbone": "dagnn"}}))


def test_table_of_a_backbone_shows_its_paper_row_and_the_command_refuses_unknown_backbones(tmp_path):
    from typer.testing import CliRunner

    from fedgl_secure.cli import app
    from fedgl_secure.simulation.fed2gnn_reproduce import render_markdown, summarize, table1_specs

    def run(method, accuracy):
        config = {"training": {"backbone": "dagnn"}}
        return {"dataset": "cora", "method": method, "seed": 0, "global_test_accuracy": accuracy, "config": config}

    results = [(10, run("fed2gnn", 0.85)), (0, run("centralized", 0.88))]
    for _, result in results:
        result.update(best_val_accuracy=0.5, best_round=3)
    table = summarize(results)
    assert table["cora"]["fed2gnn"]["10"]["paper"] == 86.78 and table["cora"]["centralized"]["0"]["paper"] == 88.15
    assert "Table 2, DAGNN" in render_markdown(table, "dagnn")
    specs = table1_specs("cora", [10], 1, None, backbone="sage")
    assert {spec.config.training.backbone for _, spec in specs} == {"sage"}
    result = CliRunner().invoke(app, ["reproduce", "fed2gnn", "--backbones", "gcn,gat", "--output-dir", str(tmp_path)])
    assert result.exit_code != 0 and "--backbones" in result.output and "gat" in result.output
