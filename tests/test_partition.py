"""The Louvain client split (``federation.partition = "louvain"``): disjoint, covering, seeded, M clients."""

from __future__ import annotations

import numpy as np
import pytest

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.partition import (
    balance_communities,
    cross_client_edges,
    louvain_clients,
    louvain_partition,
    partition_owner,
)
from fedgl_secure.data.splits import SplitConfig, apply_split
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError


@pytest.fixture(scope="module")
def graph():
    return synthetic_consortium(seed=3, num_nodes=600, num_val=100, num_test=200)


@pytest.mark.parametrize("num_clients", [1, 3, 7, 10])
def test_partition_is_disjoint_covers_the_graph_and_has_m_clients(graph, num_clients):
    node_sets = louvain_partition(graph, num_clients, seed=0)
    assert len(node_sets) == num_clients
    assert all(nodes.size > 0 for nodes in node_sets)
    everything = np.concatenate(node_sets)
    assert everything.size == graph.num_nodes  # no node twice
    assert np.array_equal(np.sort(everything), np.arange(graph.num_nodes))
    # balanced to within one community piece of ceil(n / M)
    assert max(nodes.size for nodes in node_sets) <= 2 * int(np.ceil(graph.num_nodes / num_clients))


def test_partition_is_seeded(graph):
    first, again = louvain_partition(graph, 5, seed=1), louvain_partition(graph, 5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other = louvain_partition(graph, 5, seed=2)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_partition_follows_communities(graph):
    """Louvain keeps most edges inside a client (sampling 5 random clients would keep about a fifth)."""
    node_sets = louvain_partition(graph, 5, seed=0)
    cut = cross_client_edges(graph, node_sets)
    assert cut.edges.shape[1] < 0.5 * graph.edge_index.shape[1]


def test_cross_client_edges_are_known_by_id_and_lost_from_the_clients(graph):
    node_sets = louvain_partition(graph, 4, seed=0)
    cut = cross_client_edges(graph, node_sets)
    clients = louvain_clients(graph, 4, seed=0)
    inside = sum(c.edge_index.shape[1] for c in clients)
    assert inside + cut.edges.shape[1] == graph.edge_index.shape[1]
    assert np.all(cut.owner[cut.edges[0]] != cut.owner[cut.edges[1]])
    own = cut.of_client(2)
    assert np.all(cut.owner[own[0]] == 2) and np.all(cut.owner[own[1]] != 2)
    degrees = cut.external_degree(2, node_sets[2])
    assert degrees.sum() == own.shape[1]


def test_balance_rule_splits_large_and_merges_small_communities():
    communities = [np.arange(0, 10), np.arange(10, 12), np.arange(12, 13), np.arange(13, 16)]
    node_sets = balance_communities(communities, 16, 4)  # cap 4: the 10-community becomes 4 + 4 + 2
    assert sorted(s.size for s in node_sets) == [4, 4, 4, 4]
    with pytest.raises(ConfigError, match="num_clients"):
        balance_communities([np.arange(3)], 3, 4)


def test_owner_refuses_overlap_and_gaps():
    with pytest.raises(ConfigError, match="shares nodes"):
        partition_owner(4, [np.array([0, 1]), np.array([1, 2, 3])])
    with pytest.raises(ConfigError, match="no client"):
        partition_owner(4, [np.array([0, 1])])


def test_config_needs_num_clients_for_louvain():
    with pytest.raises(ConfigError, match="num_clients"):
        build_config({"federation": {"partition": "louvain"}})
    with pytest.raises(ConfigError, match="num_clients"):
        build_config({"federation": {"num_clients": 3}})
    config = build_config({"federation": {"partition": "louvain", "num_clients": 3}})
    assert config.federation.num_clients == 3


def test_fraction_split_is_40_30_30_and_seeded(graph):
    config = SplitConfig(split="fraction")
    split = apply_split(graph, config, seed=4)
    labelled = int((graph.labels >= 0).sum())
    sizes = [int(m.sum()) for m in (split.train_mask, split.val_mask, split.test_mask)]
    assert sizes == [round(0.4 * labelled), round(0.3 * labelled), labelled - sizes[0] - sizes[1]]
    assert not np.any(split.train_mask & split.val_mask) and not np.any(split.val_mask & split.test_mask)
    again = apply_split(graph, config, seed=4)
    assert np.array_equal(split.train_mask, again.train_mask)
    with pytest.raises(ConfigError, match="fractions"):
        build_config({"data": {"fractions": [0.5, 0.25, 0.25]}})
