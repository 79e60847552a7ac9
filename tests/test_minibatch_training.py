"""Mini-batch local training (``training.batch_size``): neighbour sampling, batch composition, layer-wise
inference, accuracy against full-batch training on a small graph, and the configuration it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from benchmark_scripts import load_benchmark

from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import TrainingConfig, build_config
from fedgl_secure.engine.graph_tensors import GraphTensors, accuracy
from fedgl_secure.engine.minibatch import epoch_batches, layerwise_inference
from fedgl_secure.errors import ConfigError
from fedgl_secure.model.neighbor_sampling import csr_rows, sample_batch, sample_layer
from fedgl_secure.model.sage import GraphSAGE
from fedgl_secure.seeding import torch_stream


def planted_graph(n: int = 1200, classes: int = 3, seed: int = 0) -> GraphDataset:
    """Homophilous planted partition (edges mostly within a class, a few hubs) with weakly informative features."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    source = rng.integers(0, n, 6 * n)
    same = rng.random(6 * n) < 0.8
    pool = [np.flatnonzero(labels == c) for c in range(classes)]
    target = np.where(same, [rng.choice(pool[labels[s]]) for s in source], rng.integers(0, n, 6 * n))
    hubs = rng.integers(0, n, 8)  # a few nodes with far more neighbours than any fan-out
    source = np.concatenate([source, np.repeat(hubs, 60)])
    target = np.concatenate([target, rng.integers(0, n, 8 * 60)])
    keep = source != target
    adjacency = sp.coo_matrix((np.ones(keep.sum()), (source[keep], target[keep])), shape=(n, n)).tocsr()
    adjacency = ((adjacency + adjacency.T) > 0).tocoo()
    features = rng.random((n, 12)) < 0.2
    features[np.arange(n), labels] |= rng.random(n) < 0.3
    split = rng.random(n)
    return GraphDataset(
        name="planted",
        features=sp.csr_matrix(features.astype(np.float32)),
        labels=labels.astype(np.int64),
        edge_index=np.vstack([adjacency.row, adjacency.col]).astype(np.int64),
        train_mask=split < 0.1,
        val_mask=(split >= 0.1) & (split < 0.3),
        test_mask=split >= 0.5,
        num_classes=classes,
        node_ids=np.arange(n),
    )


@pytest.fixture(scope="module")
def graph() -> GraphTensors:
    data = planted_graph()
    return GraphTensors.from_graph(data, np.arange(data.num_nodes), data.num_nodes, torch.device("cpu"))


def test_a_sampled_row_keeps_short_rows_whole_and_caps_long_ones(graph):
    operator = graph.base_adjacency
    degree = np.diff(operator.indptr) - 1  # off-diagonal entries (every row of Â has its self-loop)
    targets = np.concatenate([np.flatnonzero(degree <= 4)[:20], np.flatnonzero(degree > 30)[:5]])
    layer = sample_layer(operator, targets, 4, np.random.default_rng(0))
    assert np.array_equal(layer.sources[: targets.size], targets)
    sampled = layer.operator.toarray()
    for row, node in enumerate(targets):
        full_row = operator[node].toarray().ravel()
        row_values = np.zeros(operator.shape[1])
        np.add.at(row_values, layer.sources, sampled[row])
        if degree[node] <= 4:
            np.testing.assert_allclose(row_values, full_row, rtol=1e-6)
        else:
            assert np.count_nonzero(row_values) == 5  # the self-loop and 4 neighbours
            assert row_values[node] == pytest.approx(full_row[node])
            kept = np.flatnonzero(row_values)
            kept = kept[kept != node]
            np.testing.assert_allclose(row_values[kept], full_row[kept] * degree[node] / 4, rtol=1e-6)


def test_sampled_rows_are_unbiased(graph):
    operator = graph.base_adjacency
    hub = int(np.argmax(np.diff(operator.indptr)))
    rng = np.random.default_rng(1)
    total = np.zeros(operator.shape[1])
    draws = 3000
    for _ in range(draws):
        layer = sample_layer(operator, np.array([hub]), 5, rng)
        np.add.at(total, layer.sources, layer.operator.toarray()[0])
    full_row = operator[hub].toarray().ravel()
    assert np.abs(total / draws - full_row).sum() < 0.1 * full_row.sum()


@pytest.mark.parametrize("fanout", [1, 4, 60])
def test_the_sampler_draws_exactly_what_the_sort_based_reference_draws(graph, fanout):
    """Same stream, same sample: the marks and partial ranking change the cost, not one kept entry or value
    (the reference is benchmarks/neighbor_sampling.py's, which times the two side by side)."""
    reference_sample_layer = load_benchmark("neighbor_sampling").reference_sample_layer
    operator = graph.base_adjacency
    rng = np.random.default_rng(5)
    for _ in range(4):
        targets = rng.choice(operator.shape[0], size=300, replace=False)
        state = rng.bit_generator.state
        layer = sample_layer(operator, targets, fanout, rng)
        rng.bit_generator.state = state
        sources, matrix = reference_sample_layer(operator, targets, fanout, rng)
        assert np.array_equal(layer.sources, sources)
        assert np.array_equal(layer.operator.indptr, matrix.indptr)
        assert np.array_equal(layer.operator.indices, matrix.indices)
        assert np.array_equal(layer.operator.data, matrix.data)


def test_a_batch_touches_at_most_its_fanout_bound(graph):
    seeds = np.arange(0, 1200, 7)
    batch = sample_batch(graph.base_adjacency, seeds, (3, 5), np.random.default_rng(2))
    hidden, inputs = batch.layers[1].sources, batch.input_nodes
    assert np.array_equal(batch.layers[1].targets, seeds)
    assert np.array_equal(batch.layers[0].targets, hidden)
    assert hidden.size <= seeds.size * (1 + 5)
    assert inputs.size <= hidden.size * (1 + 3)
    assert np.unique(inputs).size == inputs.size
    row_entries = np.diff(batch.layers[0].operator.indptr)
    assert row_entries.max() <= 1 + 3 and np.diff(batch.layers[1].operator.indptr).max() <= 1 + 5


def test_epoch_batches_cover_every_loss_node_once_in_proportion():
    rng = np.random.default_rng(3)
    train, pseudo = np.arange(0, 300), np.arange(1000, 1900)
    batches = epoch_batches(train, pseudo, 64, rng)
    assert all(len(batch) <= 64 for batch in batches) and len(batches) == int(np.ceil(1200 / 64))
    together = np.concatenate(batches)
    assert np.array_equal(np.sort(together), np.concatenate([train, pseudo]))
    for batch in batches:
        assert abs((batch < 1000).sum() - len(batch) * 0.25) <= 2
    assert not np.array_equal(np.concatenate(epoch_batches(train, pseudo, 64, rng)), together)


def test_csr_rows_equals_scipy_row_indexing(graph):
    rows = np.array([5, 0, 77, 5, 1199])
    np.testing.assert_array_equal(csr_rows(graph.base_adjacency, rows).toarray(), graph.base_adjacency[rows].toarray())


def test_layerwise_inference_equals_the_full_forward(graph):
    trainer = LocalTrainer(0, graph, TrainingConfig(), seed=0)
    trainer.model.reset_parameters(torch_stream(0, "init"))
    trainer.model.eval()
    adjacency = graph.adjacency(None, 0.0, False)
    with torch.no_grad():
        full = trainer.model(graph.features, adjacency)
    layered = layerwise_inference(trainer.model, graph.features, adjacency, rows=250)
    torch.testing.assert_close(layered.logits, full.logits)
    torch.testing.assert_close(layered.hidden, full.hidden)


def train_and_score(graph: GraphTensors, config: TrainingConfig, seed: int = 0) -> tuple[float, torch.Tensor]:
    trainer = LocalTrainer(0, graph, config, seed)
    trainer.model.reset_parameters(torch_stream(seed, "init"))
    adjacency = graph.adjacency(None, 0.0, False)
    for _ in range(3):
        trainer.train(adjacency, None)
    logits = trainer.infer(adjacency).logits
    correct, total = accuracy(logits, graph.labels, graph.test_mask)
    return correct / total, trainer.model.flat_parameters()


def test_minibatch_training_learns_as_well_as_full_batch(graph):
    full, _ = train_and_score(graph, TrainingConfig())
    mini, parameters = train_and_score(graph, TrainingConfig(batch_size=48, fanouts=(4, 4)))
    chance = 1 / graph.num_classes
    assert full > chance + 0.2  # the graph is learnable at all
    assert mini > full - 0.05
    _, again = train_and_score(graph, TrainingConfig(batch_size=48, fanouts=(4, 4)))
    assert torch.equal(parameters, again)  # the batches and samples come from the seed's streams


def test_minibatch_training_uses_pseudo_labels(graph):
    pseudo = torch.where(graph.train_mask, -1, graph.labels)  # every non-training node, correctly labelled
    adjacency = graph.adjacency(None, 0.0, False)
    scores = {}
    for alpha in (0.0, 0.5):
        trainer = LocalTrainer(0, graph, TrainingConfig(batch_size=256, local_epochs=5), seed=0)
        trainer.model.reset_parameters(torch_stream(0, "init"))
        train, pseudo_nodes = trainer.mini_batches.loss_nodes(pseudo, alpha)
        assert np.array_equal(train, np.flatnonzero(graph.train_mask.numpy()))
        assert pseudo_nodes.size == (graph.num_nodes - train.size if alpha > 0 else 0)
        trainer.train(adjacency, None, pseudo, alpha)
        correct, total = accuracy(trainer.infer(adjacency).logits, graph.labels, graph.test_mask)
        scores[alpha] = correct / total
    assert scores[0.5] > scores[0.0] + 0.15  # what labels on nearly every node buy


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"batch_size": 0}, "training.batch_size"),
        ({"batch_size": "many"}, "training.batch_size"),
        ({"batch_size": 64, "backbone": "sage"}, "training.batch_size: mini-batch training samples"),
        ({"batch_size": 64, "fanouts": [10]}, "training.fanouts: the 2-layer GCN needs two fan-outs"),
        ({"batch_size": 64, "fanouts": [0, 10]}, "training.fanouts"),
        ({"inference_rows": 0}, "training.inference_rows"),
    ],
)
def test_bad_minibatch_settings_are_refused(training, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"training": training})


def test_a_method_model_other_than_the_gcn_is_refused(graph):
    model = GraphSAGE(graph.features.shape[1], 8, graph.num_classes)
    with pytest.raises(ConfigError, match="training.batch_size: .*GraphSAGE"):
        LocalTrainer(0, graph, TrainingConfig(batch_size=64), seed=0, model=model)
