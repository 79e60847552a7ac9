"""PyG models as the engine's backbone: the operator as edge weights (FedGL's Eq. 9 included), the PyG
counterparts of the engine's backbones, a bank's declared ``training.backbone = "package.module:ClassName"`` and
its checks, and FedGL trained in the simulation with both."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.nn import SimpleConv

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.model import pyg_backbones
from fedgl_secure.model.adjacency import fuse_pseudo_graph, gcn_normalize
from fedgl_secure.model.backbones import build_backbone
from fedgl_secure.model.dagnn import DAGNN
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.pyg_adapter import PyGBackbone, operator_edges
from fedgl_secure.model.sage import GraphSAGE
from fedgl_secure.model.sgc import SGC
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.simulation.experiment import run_experiment

USER_MODEL = "pyg_user_models:GraphConvHead"


def random_graph(seed: int, n: int = 14, p: float = 0.3) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < p, 1)
    return sp.csr_matrix((upper | upper.T).astype(np.float64))


def fused_operator(seed: int, n: int = 14, beta: float = 0.7) -> sp.csr_matrix:
    """Eq. 9's ``Â' = Â + β · D̄^-1/2 Ā D̄^-1/2`` with a pseudo graph of 3 weighted out-neighbours per row, so the
    fused operator is not symmetric."""
    rng = np.random.default_rng(seed + 100)
    rows = np.repeat(np.arange(n), 3)
    cols = np.concatenate([rng.choice(np.delete(np.arange(n), i), 3, replace=False) for i in range(n)])
    pseudo = sp.csr_matrix((rng.random(rows.size), (rows, cols)), shape=(n, n))
    fused = fuse_pseudo_graph(gcn_normalize(random_graph(seed, n)), pseudo, beta)
    assert abs(fused - fused.T).max() > 1e-3
    return fused


def declared(spec: str, **training) -> dict:
    return {"training": {"backbone": spec, **training}}


def test_operator_edges_make_message_passing_the_operator_product():
    """A sum of ``w · x_j`` messages over the edge list is ``S @ x``, for a non-symmetric S."""
    operator = sp.random(9, 9, density=0.3, random_state=0, format="csr") + sp.identity(9)
    x = torch.rand(9, 4, generator=torch.Generator().manual_seed(0))
    edge_index, edge_weight = operator_edges(SparseOperator.from_scipy(operator))
    expected = torch.as_tensor(operator.toarray(), dtype=torch.float32) @ x
    assert torch.allclose(SimpleConv(aggr="sum")(x, edge_index, edge_weight), expected, atol=1e-6)


def copy_into(pyg_model: torch.nn.Module, engine_model: torch.nn.Module) -> None:
    """The engine model's parameters, laid out as its PyG counterpart's layers hold them."""
    e = {name: p.detach() for name, p in engine_model.named_parameters()}
    p = dict(pyg_model.named_parameters())
    with torch.no_grad():
        if isinstance(engine_model, GCN):
            p["conv0.lin.weight"].copy_(e["weight0"].T), p["conv0.bias"].copy_(e["bias0"])
            p["conv1.lin.weight"].copy_(e["weight1"].T), p["conv1.bias"].copy_(e["bias1"])
        elif isinstance(engine_model, GraphSAGE):
            for layer, width in ((0, engine_model.hidden), (1, engine_model.num_classes)):
                weight = e[f"weight{layer}"]
                p[f"conv{layer}.lin_root.weight"].copy_(weight[:, :width].T)
                p[f"conv{layer}.lin_rel.weight"].copy_(weight[:, width:].T)
                p[f"conv{layer}.lin_rel.bias"].copy_(e[f"bias{layer}"])
        elif isinstance(engine_model, DAGNN):
            p["lin0.weight"].copy_(e["weight0"].T), p["lin0.bias"].copy_(e["bias0"])
            p["lin1.weight"].copy_(e["weight1"].T), p["lin1.bias"].copy_(e["bias1"])
            p["retain.weight"].copy_(e["retain_weight"].view(1, -1)), p["retain.bias"].copy_(e["retain_bias"].view(1))
        else:
            p["lin.weight"].copy_(e["weight"].T), p["bias"].copy_(e["bias"])


@pytest.mark.parametrize(
    "engine, pyg",
    [
        (lambda: GCN(6, 5, 3, dropout=0.0), lambda: pyg_backbones.GCN(6, 5, 3, 0.0)),
        (lambda: GraphSAGE(6, 5, 3, dropout=0.0), lambda: pyg_backbones.GraphSAGE(6, 5, 3, 0.0)),
        (lambda: DAGNN(6, 5, 3, hops=4, dropout=0.0), lambda: pyg_backbones.DAGNN(6, 5, 3, 0.0, hops=4)),
        (lambda: SGC(6, 3, hops=2), lambda: pyg_backbones.SGC(6, 5, 3, 0.0)),
    ],
    ids=["gcn", "sage", "dagnn", "sgc"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_pyg_counterpart_computes_the_engine_backbone_on_the_fused_operator(engine, pyg, seed):
    """Eq. 9's fused Â' reaches the PyG layers as edge weights: with the same parameters, logits, hidden layer and
    gradients equal the engine's own backbone over its sparse operator."""
    operator = SparseOperator.from_scipy(fused_operator(seed))
    features = SparseOperator.from_scipy(sp.random(14, 6, density=0.5, random_state=seed, format="csr"))
    engine_model, pyg_model = engine(), PyGBackbone(pyg())
    engine_model.reset_parameters(torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for parameter in engine_model.parameters():  # non-zero biases, so a misplaced bias shows
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(seed)))
    copy_into(pyg_model.model, engine_model)
    assert pyg_model.flat_parameters().numel() == engine_model.flat_parameters().numel()
    ours, theirs = engine_model(features, operator), pyg_model(features, operator)
    assert torch.allclose(ours.logits, theirs.logits, atol=1e-5)
    assert torch.allclose(ours.hidden, theirs.hidden, atol=1e-5)
    ours.logits.square().sum().backward()
    theirs.logits.square().sum().backward()
    assert torch.allclose(
        torch.cat([g.grad.abs().flatten() for g in engine_model.parameters()]).sort().values,
        torch.cat([g.grad.abs().flatten() for g in pyg_model.parameters()]).sort().values,
        atol=1e-4,
    )


def test_initialisation_and_dropout_come_from_the_callers_stream_and_leave_torchs_own():
    """Every party rebuilds W̄ of round 0 from the run's stream, and each bank's dropout is its own stream's:
    the same seed gives the same draws, another seed others, and torch's global generator is left as it was."""
    operator = SparseOperator.from_scipy(gcn_normalize(random_graph(0)))
    features = torch.rand(14, 6, generator=torch.Generator().manual_seed(0))
    models = [PyGBackbone(pyg_backbones.GCN(6, 8, 3, 0.5)) for _ in range(3)]
    state = torch.random.get_rng_state()
    for model, seed in zip(models, (7, 7, 8), strict=True):
        model.reset_parameters(torch.Generator().manual_seed(seed))
    assert torch.equal(models[0].flat_parameters(), models[1].flat_parameters())
    assert not torch.equal(models[0].flat_parameters(), models[2].flat_parameters())
    first, again, other = (
        models[0](features, operator, torch.Generator().manual_seed(seed)).logits for seed in (1, 1, 2)
    )
    assert torch.equal(first, again) and not torch.allclose(first, other)
    assert torch.equal(torch.random.get_rng_state(), state)


def bag_of_words(seed: int, rows: int = 400, columns: int = 300, density: float = 0.05) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    stored = torch.rand(rows, columns, generator=generator) < density
    return stored * (0.5 + torch.rand(rows, columns, generator=generator))


def test_input_dropout_keeps_zeros_and_scales_the_stored_entries_it_keeps():
    """F.dropout's distribution on a mostly-zero input: a zero stays zero, a stored entry is either dropped or
    scaled by 1 / (1 − p), kept with probability 1 − p (6,000 stored entries: 3 standard deviations are ±0.02)."""
    x, dropout = bag_of_words(0), pyg_backbones.StoredEntryDropout(0.3)
    with torch.random.fork_rng():  # a fixed draw, leaving the other tests' generator as it was
        torch.manual_seed(0)
        dropped, again = dropout(x), dropout(x)
    stored = x != 0
    assert torch.all(dropped[~stored] == 0)
    kept = dropped[stored] != 0
    assert torch.allclose(dropped[stored][kept], x[stored][kept] / 0.7)
    assert abs(kept.float().mean().item() - 0.7) < 0.02
    assert not torch.equal(again, dropped)  # a fresh mask each call


def test_input_dropout_finds_the_stored_entries_of_each_new_input():
    """The stored positions are kept for the tensor they came from only: another input's entries are its own."""
    dropout = pyg_backbones.StoredEntryDropout(0.5)
    first, second = bag_of_words(1), bag_of_words(2)
    dropout(first)
    dropped = dropout(second)
    assert torch.all(dropped[second == 0] == 0) and torch.any(dropped[(first == 0) & (second != 0)] != 0)


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors held in ``value`` directly or inside tuples and lists (not behind weak references)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return []


def test_input_dropout_neither_keeps_its_input_alive_nor_copies_it_with_the_model():
    """The cached positions refer to the input weakly: dropping the features frees them, and a deep copy of a trained
    model (a bank's session snapshot) does not carry a bank's feature matrix."""
    model = pyg_backbones.GCN(num_features=300, hidden=4, num_classes=3)
    x = bag_of_words(4)
    graph = torch.tensor([[0, 1], [1, 0]])
    model(x, graph, torch.ones(2))
    copied = copy.deepcopy(model)
    held = [tensor for value in vars(copied.input_dropout).values() for tensor in tensors_in(value)]
    assert held and not any(tensor.shape == x.shape for tensor in held)  # the positions, not the features
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None


def test_input_dropout_is_the_identity_in_evaluation_and_without_a_rate():
    x = bag_of_words(3)
    assert pyg_backbones.StoredEntryDropout(0.0)(x) is x
    evaluating = pyg_backbones.StoredEntryDropout(0.5).eval()
    assert evaluating(x) is x


def test_weight_decay_follows_the_declared_first_layer_else_every_parameter():
    gcn = PyGBackbone(pyg_backbones.GCN(6, 8, 3, 0.5))
    assert {id(p) for p in gcn.first_layer_parameters()} == {id(p) for p in gcn.model.conv0.parameters()}
    assert {id(p) for p in gcn.second_layer_parameters()} == {id(p) for p in gcn.model.conv1.parameters()}
    sgc = PyGBackbone(pyg_backbones.SGC(6, 8, 3, 0.0))
    assert len(sgc.first_layer_parameters()) == 2 and sgc.second_layer_parameters() == []


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("no_such_package.models:Net", r"cannot be imported: No module named 'no_such_package'"),
        ("pyg_user_models:Missing", r"names nothing: module 'pyg_user_models' has no attribute 'Missing'"),
        ("pyg_user_models:NotAModel", r"is not a torch.nn.Module class"),
        ("pyg_user_models:OtherSignature", r"cannot be constructed as OtherSignature\(num_features=100, hidden=16"),
        ("pyg_user_models:HiddenWidthOutput", r"returns logits of shape \(5, 16\).* agreed on 4 classes"),
        ("fedgl_secure.model.gcn:GCN", r"failed on a 5-node graph with 100 features: forward\(x, edge_index"),
    ],
)
def test_a_bad_declaration_is_refused_at_start_naming_the_field_and_the_problem(spec, problem):
    dataset = synthetic_consortium(seed=0, num_nodes=120, num_val=20, num_test=20)
    config = build_config({"method": "fedgl", "device": "cpu", "federation": {"max_rounds": 1}, **declared(spec)})
    with pytest.raises(ConfigError, match=r"training\.backbone: '" + spec.replace(".", r"\.") + "' " + problem):
        run_experiment(config, dataset, progress=False)


@pytest.mark.parametrize("spec", ["gat", "models:", "my-models:Net", "models.Net", ":Net"])
def test_a_malformed_backbone_is_refused_when_the_configuration_is_read(spec):
    with pytest.raises(ConfigError, match=r"training\.backbone: .*'package\.module:ClassName'"):
        build_config(declared(spec))


def test_a_declared_model_builds_with_the_agreed_shapes_and_a_flat_parameter_vector():
    training = build_config(declared(USER_MODEL, hidden=12)).training
    model = build_backbone(training, 100, 4)
    assert isinstance(model, PyGBackbone) and model.training
    # GraphConv: lin_rel (100x12 + 12), lin_root (100x12); head 12x4 + 4
    assert model.flat_parameters().numel() == 100 * 12 + 12 + 100 * 12 + 12 * 4 + 4
    state = torch.random.get_rng_state()
    again = build_backbone(training, 100, 4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(again.flat_parameters(), model.flat_parameters())


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0, num_nodes=300, num_val=60, num_test=90)


@pytest.mark.parametrize("spec", ["fedgl_secure.model.pyg_backbones:GCN", USER_MODEL])
def test_fedgl_trains_a_pyg_backbone_with_the_pseudo_graph(dataset, spec):
    """FedGL with its pseudo labels and pseudo graph (β > 0, fused into Â' from round 2) on a PyG model: finite and
    better than chance (4 classes)."""
    config = build_config(
        {
            "method": "fedgl",
            "device": "cpu",
            "federation": {"max_rounds": 6, "proportions": [0.5, 0.6, 0.7]},
            "self_supervision": {"beta": 0.5, "threshold": 0.3, "neighbors": 10},
            **declared(spec),
        }
    )
    result = run_experiment(config, dataset, progress=False)
    assert result.rounds_run == 6 and np.isfinite(result.global_test_accuracy)
    assert result.best_val_accuracy > 0.25 + 0.15 and result.global_test_accuracy > 0.25 + 0.15, result
    assert any((record.pseudo_graph_edges or 0) > 0 for record in result.history)


def test_the_benchmark_writes_each_backbones_ratio(tmp_path, monkeypatch):
    """benchmarks/pyg_backbones.py end to end on a small synthetic graph (Cora left out: no data root)."""
    from benchmark_scripts import load_benchmark

    monkeypatch.delenv("FEDGL_DATA", raising=False)
    output = tmp_path / "pyg_backbones.json"
    threads = torch.get_num_threads()
    try:  # the script times on one thread
        load_benchmark("pyg_backbones").main(["--nodes", "1000", "--repeats", "1", "--output", str(output)])
    finally:
        torch.set_num_threads(threads)
    report = json.loads(output.read_text())
    assert "skipped" in report["graphs"]["cora"]
    graph = report["graphs"]["synthetic_1000"]
    assert set(graph["epoch"]) == {"gcn", "sage", "sgc", "dagnn"}
    for timing in [*graph["epoch"].values(), graph["propagation"]]:
        assert timing["engine_cpu_seconds"] > 0 and timing["pyg_cpu_seconds"] > 0
        ratio = timing["pyg_cpu_seconds"] / timing["engine_cpu_seconds"]
        assert timing["ratio_pyg_over_engine"] == pytest.approx(ratio)
    assert graph["to_edges"]["share_of_a_round_of_10_epochs"] > 0
    gcn = graph["epoch"]["gcn"]
    assert gcn["ratio_dense_over_stored_input_dropout"] == pytest.approx(
        gcn["pyg_dense_input_dropout_cpu_seconds"] / gcn["pyg_cpu_seconds"]
    )
