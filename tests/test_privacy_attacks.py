"""Empirical privacy attacks: ROC AUC, membership inference on W̄, link inference from Ā.

Statistical tolerances use the null distribution of the Mann–Whitney AUC: with ``n⁺`` positives
and ``n⁻`` negatives drawn independently of the scores, ``sd(AUC) = sqrt((n⁺ + n⁻ + 1) /
(12 n⁺ n⁻))`` without ties (ties only shrink it). Every check below sits ~4 sd away from the
threshold, and every draw is seeded, so the tests are deterministic.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedgl_secure.audit.attacks import (
    MEMBERSHIP_ATTACKS,
    attack_broadcast,
    auc_standard_error,
    link_inference_auc,
    membership_inference_auc,
    roc_auc,
    sample_non_edges,
    true_edge_index,
)
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.model.gcn import GCN
from fedgl_secure.seeding import numpy_stream, torch_stream
from fedgl_secure.simulation.experiment import Federation, run_experiment

CPU = torch.device("cpu")


def _null_sd(n_pos: int, n_neg: int) -> float:
    return math.sqrt((n_pos + n_neg + 1) / (12 * n_pos * n_neg))


def _whole_graph(dataset) -> GraphTensors:
    return GraphTensors.from_graph(dataset, np.arange(dataset.num_nodes), dataset.num_nodes, CPU)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These graphs are tiny: one intra-op thread is as fast idle and far steadier on a busy host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0)


@pytest.fixture(scope="module")
def graph(dataset):
    return _whole_graph(dataset)


# ---------------------------------------------------------------------------------------------
# roc_auc


def test_roc_auc_hand_computed_example_with_a_tie():
    # Pairs (member, non-member): 0.9>0.8, 0.9>0.3, 0.8=0.8 (½), 0.8>0.3, 0.4<0.8, 0.4>0.3 → 4.5 / 6
    assert roc_auc([0.9, 0.8, 0.4], [0.8, 0.3]) == pytest.approx(0.75)


def test_roc_auc_extremes_and_ties():
    assert roc_auc([3, 4, 5], [0, 1, 2]) == 1.0
    assert roc_auc([0, 1, 2], [3, 4, 5]) == 0.0
    assert roc_auc([1, 1, 1], [1, 1]) == 0.5  # identical scores carry no information
    assert roc_auc(torch.tensor([2.0, 0.0]), np.array([1.0])) == 0.5  # tensors and arrays alike


def test_roc_auc_equals_pairwise_count_with_many_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        pos, neg = rng.integers(0, 5, size=37), rng.integers(0, 5, size=23)
        diff = pos[:, None] - neg[None, :]
        brute = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
        assert roc_auc(pos, neg) == pytest.approx(brute)
        assert roc_auc(neg, pos) == pytest.approx(1.0 - brute)  # swapping the sides mirrors the AUC


def test_auc_standard_error_matches_the_null_sd_and_vanishes_at_perfect_separation():
    assert auc_standard_error(0.5, 400, 400) == pytest.approx(_null_sd(400, 400), rel=1e-2)
    assert auc_standard_error(1.0, 50, 50) == 0.0
    assert auc_standard_error(0.8, 80, 80) < auc_standard_error(0.8, 20, 20)


def test_roc_auc_rejects_empty_and_nan():
    with pytest.raises(ValueError, match="at least one score"):
        roc_auc([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([float("nan")], [1.0])


# ---------------------------------------------------------------------------------------------
# Membership inference


def test_membership_detects_an_overfit_model(graph):
    """No dropout, no weight decay, 150 epochs on 80 labelled nodes: training loss → ~0."""
    model = GCN(graph.features.shape[1], 16, graph.num_classes, dropout=0.0)
    model.reset_parameters(torch_stream(0, "test", "overfit"))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    adjacency = graph.adjacency(None, 0.0, False)
    for _ in range(150):
        optimizer.zero_grad()
        logits = model(graph.features, adjacency).logits
        F.cross_entropy(logits[graph.train_mask], graph.labels[graph.train_mask]).backward()
        optimizer.step()
    # From the flat vector, as the audit sees W̄ (the hidden width is inferred from its length).
    result = membership_inference_auc(model.flat_parameters(), graph, seed=0)
    assert result.members == result.nonmembers == int(graph.train_mask.sum()) == 80
    assert set(result.variants) == set(MEMBERSHIP_ATTACKS)
    assert result.auc == max(result.variants.values()) and result.variants[result.attack] == result.auc
    # Null sd at 80 vs 80 is 0.046: 0.7 is > 4 sd above chance (measured: ≈ 0.79).
    assert result.auc > 0.7
    assert result.variants["loss"] > 0.7
    assert 0.0 < result.auc_stderr < 0.06
    assert membership_inference_auc(model, graph, seed=0) == result  # deterministic, GCN or vector


def test_membership_is_chance_for_untrained_models():
    """A model that never saw a label cannot tell members apart: each variant ≈ 0.5.

    400 members vs 400 non-members: null sd = 0.020, so ±0.08 is ≈ 4 sd (scores of neighbouring
    nodes are correlated through Â, which widens the spread a little; measured max deviation
    over 8 inits: 0.026).
    """
    dataset = synthetic_consortium(seed=1, train_per_class=100, num_val=100, num_test=600)
    graph = _whole_graph(dataset)
    assert 0.08 > 3.9 * _null_sd(400, 400)
    for init in range(3):
        model = GCN(dataset.num_features, 16, dataset.num_classes)
        model.reset_parameters(torch_stream(init, "init"))
        result = membership_inference_auc(model, graph, seed=init)
        assert result.members == result.nonmembers == 400
        for name, auc in result.variants.items():
            assert abs(auc - 0.5) < 0.08, (init, name, auc)


def test_membership_validates_its_inputs(graph):
    model = GCN(graph.features.shape[1], 16, graph.num_classes)
    model.reset_parameters(torch_stream(0, "init"))
    with pytest.raises(ValueError, match="overlap"):
        membership_inference_auc(model, graph, nonmember_mask=graph.train_mask)
    with pytest.raises(ValueError, match="no 2-layer GCN"):
        membership_inference_auc(model.flat_parameters()[:-1], graph)
    with pytest.raises(ValueError, match="hidden width 32"):
        membership_inference_auc(model.flat_parameters(), graph, hidden=32)
    nothing = torch.zeros_like(graph.test_mask)
    with pytest.raises(ValueError, match="needs members and non-members"):
        membership_inference_auc(model, graph, nonmember_mask=nothing)


# ---------------------------------------------------------------------------------------------
# Link inference


def _pseudo_graph_of_edges(edge_index: np.ndarray, num_nodes: int) -> PseudoGraph:
    """Ā = rownorm(A) as a fixed-width list: each node's true neighbours, padded with weight 0."""
    neighbours = [[] for _ in range(num_nodes)]
    for u, v in edge_index.T:
        neighbours[u].append(v)
    width = max(len(n) for n in neighbours)
    rows = np.empty((num_nodes, width), dtype=np.int64)
    weights = np.zeros((num_nodes, width), dtype=np.float32)
    for i, found in enumerate(neighbours):
        rows[i] = (i + 1) % num_nodes  # padding: a non-self node with weight 0 (not an edge)
        rows[i, : len(found)] = found
        weights[i, : len(found)] = 1.0 / len(found) if found else 0.0
    return PseudoGraph(torch.as_tensor(rows), torch.as_tensor(weights))


def _random_pseudo_graph(num_nodes: int, width: int, seed: int) -> PseudoGraph:
    rng = numpy_stream(seed, "test", "random-pseudo-graph")
    rows = (np.arange(num_nodes)[:, None] + rng.integers(1, num_nodes, size=(num_nodes, width))) % num_nodes
    weights = rng.random((num_nodes, width)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    return PseudoGraph(torch.as_tensor(rows), torch.as_tensor(weights))


def test_pseudo_graph_of_the_true_edges_reveals_them_all(dataset):
    n = dataset.num_nodes
    result = link_inference_auc(_pseudo_graph_of_edges(dataset.edge_index, n), dataset.edge_index, n, seed=0)
    assert result.positives == result.negatives == dataset.num_undirected_edges
    assert result.auc == 1.0 and result.attack == "pseudo-graph"  # every edge scores > 0, every non-edge 0


def test_random_pseudo_graph_and_random_embeddings_reveal_nothing(dataset):
    """~4200 pairs a side: null sd ≤ 0.0063, so ±0.03 is ≈ 4.7 sd."""
    n = dataset.num_nodes
    assert 0.03 > 4.5 * _null_sd(dataset.num_undirected_edges, dataset.num_undirected_edges)
    embeddings = torch.randn(n, 8, generator=torch_stream(0, "test", "embeddings"))
    result = link_inference_auc(_random_pseudo_graph(n, 10, 0), dataset.edge_index, n, seed=0, embeddings=embeddings)
    assert set(result.variants) == {"pseudo-graph", "embedding-cosine"}
    for name, auc in result.variants.items():
        assert abs(auc - 0.5) < 0.03, (name, auc)


def test_embedding_cosine_sees_homophily(dataset):
    """Embeddings = one-hot class: cosine is 1 within a class, 0 across. With edge homophily h ≈ 0.72
    and 4 balanced classes (a random pair is same-class w.p. ≈ 0.25) the AUC is ≈ ½ + (h − ¼)/2 ≈ 0.73."""
    n = dataset.num_nodes
    one_hot = F.one_hot(torch.as_tensor(dataset.labels), dataset.num_classes).float()
    result = link_inference_auc(_random_pseudo_graph(n, 10, 1), dataset.edge_index, n, seed=0, embeddings=one_hot)
    assert result.attack == "embedding-cosine"
    assert 0.68 < result.variants["embedding-cosine"] < 0.78


def test_non_edges_are_distinct_non_edges_and_seeded(dataset):
    n = dataset.num_nodes
    src, dst = dataset.edge_index
    edge_keys = np.unique(np.minimum(src, dst) * n + np.maximum(src, dst))
    drawn = sample_non_edges(edge_keys, n, 5000, numpy_stream(3, "test"))
    assert drawn.size == np.unique(drawn).size == 5000
    assert not np.isin(drawn, edge_keys).any()
    assert (drawn // n < drawn % n).all()  # u < v: no self-pairs, one key per unordered pair
    assert np.array_equal(drawn, sample_non_edges(edge_keys, n, 5000, numpy_stream(3, "test")))


def test_link_inference_validates_shapes(dataset):
    n = dataset.num_nodes
    pseudo = _random_pseudo_graph(n, 4, 0)
    with pytest.raises(ValueError, match="rows"):
        link_inference_auc(pseudo, dataset.edge_index, n + 1)
    with pytest.raises(ValueError, match="outside"):
        link_inference_auc(pseudo, dataset.edge_index + n, n)
    with pytest.raises(ValueError, match="at least one true edge"):
        link_inference_auc(pseudo, np.zeros((2, 0), dtype=np.int64), n)


# ---------------------------------------------------------------------------------------------
# End to end


def test_attacks_on_the_final_broadcast_of_a_fedgl_run(dataset):
    config = build_config({"method": "fedgl", "seed": 0, "device": "cpu", "federation": {"max_rounds": 3}})
    broadcasts = []
    run_experiment(config, dataset, progress=False, observer=broadcasts.append)
    final = broadcasts[-1]
    assert final.round_number == 3 and final.pseudo_graph is not None
    merged = Federation.build(dataset, config, CPU).merged  # deterministic: the run's own merged graph
    edges = true_edge_index(merged)
    assert edges.shape[1] == merged.base_adjacency.nnz - merged.num_nodes  # Â = A + I pattern, minus I

    report = attack_broadcast(final, merged, seed=0)
    membership, link = report.membership, report.link
    assert membership.members == membership.nonmembers == int(merged.train_mask.sum())
    assert link is not None and link.positives == link.negatives == edges.shape[1] // 2
    assert set(link.variants) == {"pseudo-graph", "embedding-cosine"}  # cosine on the fused predictions
    for auc in [*membership.variants.values(), *link.variants.values(), membership.auc, link.auc]:
        assert math.isfinite(auc) and 0.0 <= auc <= 1.0
    encoded = json.loads(json.dumps(report.to_dict()))
    assert encoded["membership"]["auc"] == membership.auc and encoded["link"]["attack"] == link.attack
    assert attack_broadcast(final, merged, seed=0) == report
