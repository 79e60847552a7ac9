"""Simulated institutions: client sampling, overlap mode, participation, global index, merged graph."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fedgl_secure.data.global_index import GlobalIndex, merge_client_graphs
from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.sampling import make_clients, sample_client_nodes, select_participants
from fedgl_secure.errors import ConfigError


def _ring_graph(n: int = 200, seed: int = 0) -> GraphDataset:
    rng = np.random.default_rng(seed)
    rows = np.arange(n)
    edge_index = canonical_edge_index(np.concatenate([rows, rows]), np.concatenate([(rows + 1) % n, (rows + 7) % n]), n)
    labels = rng.integers(0, 3, size=n)
    split = rng.permutation(n)
    masks = [np.zeros(n, bool) for _ in range(3)]
    masks[0][split[:20]] = masks[1][split[20:60]] = masks[2][split[60:120]] = True
    return GraphDataset(
        "ring",
        sp.csr_matrix(rng.random((n, 5)).astype(np.float32)),
        labels,
        edge_index,
        *masks,
        num_classes=3,
        node_ids=np.arange(n) + 1000,
    )


def test_client_sizes_are_rounded_proportions_and_sets_are_unique():
    sets = sample_client_nodes(1000, [0.3, 0.45, 0.5], seed=3)
    assert [len(s) for s in sets] == [300, 450, 500]
    for s in sets:
        assert len(np.unique(s)) == len(s) and np.all(np.diff(s) > 0)


def test_sampling_is_deterministic_and_independent_per_client():
    a = sample_client_nodes(500, [0.3, 0.6], seed=1)
    b = sample_client_nodes(500, [0.3, 0.6, 0.4], seed=1)
    # client k's draw depends only on (seed, k): adding a client changes nobody else's nodes
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    c = sample_client_nodes(500, [0.3, 0.6], seed=2)
    assert not np.array_equal(a[0], c[0])


def test_independent_sampling_overlap_matches_expectation():
    # P(node held by both) = p1 * p2 for independent uniform draws.
    n, p1, p2 = 20000, 0.3, 0.5
    s1, s2 = sample_client_nodes(n, [p1, p2], seed=0)
    shared = len(np.intersect1d(s1, s2))
    expected = n * p1 * p2
    # hypergeometric sd ≈ sqrt(n p1 p2 (1-p1)(1-p2)) ≈ 32; allow 5 sd
    assert abs(shared - expected) < 5 * 33


def test_overlap_mode_forces_a_common_set_into_every_client():
    sets = sample_client_nodes(1000, [0.3, 0.5, 0.4], seed=0, overlap=0.2)
    common = sets[0]
    for s in sets[1:]:
        common = np.intersect1d(common, s)
    assert len(common) >= 200
    assert [len(s) for s in sets] == [300, 500, 400]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"proportions": [0.3, 1.5]}, "proportions[1]"),
        ({"proportions": []}, "proportions"),
        ({"proportions": [0.3], "overlap": 0.5}, "overlap"),
        ({"proportions": [0.3], "overlap": -0.1}, "overlap"),
    ],
)
def test_bad_sampling_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sample_client_nodes(100, seed=0, **kwargs)


def test_induced_subgraphs_keep_features_labels_splits_and_only_internal_edges():
    graph = _ring_graph()
    clients = make_clients(graph, [0.4, 0.6], seed=5)
    for client in clients:
        original = client.node_ids - 1000
        np.testing.assert_array_equal(client.labels, graph.labels[original])
        np.testing.assert_array_equal(client.train_mask, graph.train_mask[original])
        np.testing.assert_array_equal(client.features.toarray(), graph.features[original].toarray())
        dense = graph.adjacency().toarray()[np.ix_(original, original)]
        np.testing.assert_array_equal(client.adjacency().toarray(), dense)


def test_global_index_is_the_union_and_merged_graph_is_union_of_client_graphs():
    graph = _ring_graph()
    clients = make_clients(graph, [0.3, 0.4, 0.5], seed=7)
    index = GlobalIndex.from_id_sets([c.node_ids for c in clients])
    union = np.unique(np.concatenate([c.node_ids for c in clients]))
    assert index.size == len(union) < sum(c.num_nodes for c in clients)
    merged = merge_client_graphs(clients, index)
    expected = np.zeros((index.size, index.size))
    for client in clients:
        pos = index.positions(client.node_ids)
        expected[np.ix_(pos, pos)] = np.maximum(expected[np.ix_(pos, pos)], client.adjacency().toarray())
    np.testing.assert_array_equal(merged.adjacency().toarray(), expected)
    original = index.node_ids - 1000
    np.testing.assert_array_equal(merged.labels, graph.labels[original])
    np.testing.assert_array_equal(merged.test_mask, graph.test_mask[original])
    np.testing.assert_array_equal(merged.features.toarray(), graph.features[original].toarray())
    with pytest.raises(KeyError):
        index.positions(np.array([5]))


def test_participation_subsets_are_seeded_and_nonempty():
    assert select_participants(6, 1.0, seed=0, round_number=3) == list(range(6))
    picks = [tuple(select_participants(6, 0.5, seed=0, round_number=r)) for r in range(1, 30)]
    assert all(len(p) == 3 for p in picks)
    assert len(set(picks)) > 1  # changes across rounds
    assert picks == [tuple(select_participants(6, 0.5, seed=0, round_number=r)) for r in range(1, 30)]
    assert len(select_participants(6, 0.01, seed=0, round_number=1)) == 1
    with pytest.raises(ConfigError, match="participation"):
        select_participants(6, 0.0, seed=0, round_number=1)
