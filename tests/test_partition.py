"""The Louvain client split (``federation.partition = "louvain"``): disjoint, covering, seeded, M clients."""

from __future__ import annotations

import numpy as np
import pytest

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.partition import (
    balance_communities,
    cross_client_edges,
    deal_sequentially,
    fedsage_balance,
    fedsage_pieces,
    louvain_clients,
    louvain_partition,
    partition_owner,
    top_up_classes,
)
from fedgl_secure.data.splits import SplitConfig, apply_split
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError


@pytest.fixture(scope="module")
def graph():
    return synthetic_consortium(seed=3, num_nodes=600, num_val=100, num_test=200)


@pytest.mark.parametrize("balance", ["fedsage", "least-loaded"])
@pytest.mark.parametrize("num_clients", [1, 3, 7, 10])
def test_partition_is_disjoint_covers_the_graph_and_has_m_clients(graph, num_clients, balance):
    node_sets = louvain_partition(graph, num_clients, seed=0, balance=balance)
    assert len(node_sets) == num_clients
    assert all(nodes.size > 0 for nodes in node_sets)
    everything = np.concatenate(node_sets)
    assert everything.size == graph.num_nodes  # no node twice
    assert np.array_equal(np.sort(everything), np.arange(graph.num_nodes))
    # balanced to within one community piece of ceil(n / M)
    assert max(nodes.size for nodes in node_sets) <= 2 * int(np.ceil(graph.num_nodes / num_clients))


@pytest.mark.parametrize("balance", ["fedsage", "least-loaded"])
def test_partition_is_seeded(graph, balance):
    first, again = louvain_partition(graph, 5, 1, balance), louvain_partition(graph, 5, 1, balance)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other = louvain_partition(graph, 5, 2, balance)
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


def test_least_loaded_rule_splits_large_and_merges_small_communities():
    communities = [np.arange(0, 10), np.arange(10, 12), np.arange(12, 13), np.arange(13, 16)]
    node_sets = balance_communities(communities, 16, 4)  # cap 4: the 10-community becomes 4 + 4 + 2
    assert sorted(s.size for s in node_sets) == [4, 4, 4, 4]
    with pytest.raises(ConfigError, match="num_clients"):
        balance_communities([np.arange(3)], 3, 4)


def test_fedsage_cut_makes_pieces_of_n_over_m_minus_delta_in_fedsage_order():
    """Step 1: pieces of max_length; each round of cut-off rests follows the previous round (ties kept stable)."""
    a, b = np.arange(0, 17), np.arange(17, 34)
    pieces = fedsage_pieces([b, a, np.array([40, 41])], max_length=8)
    expected = [a[:8], b[:8], a[8:16], b[8:16], np.array([40, 41]), a[16:], b[16:]]
    assert len(pieces) == len(expected)
    assert all(np.array_equal(p, e) for p, e in zip(pieces, expected, strict=True))
    with pytest.raises(ConfigError, match="louvain_delta"):
        fedsage_pieces([a], max_length=0)


def test_fedsage_deal_fills_the_current_owner_and_skips_a_piece_that_overflows():
    """Step 2 by hand: n = 20, M = 2, delta = 2, so owners are full at 10 and may not reach 12.

    A (12 nodes) is cut into 8 + 4. The 8 goes to owner 0; the 4 would bring it to 12, so the pointer moves to
    owner 1, which keeps the next pieces (B, D: 3 + 3) until full at 10; full, it leaves the list and C (2)
    goes back to owner 0 (8 + 2). The least-loaded rule deals the same communities otherwise."""
    communities = [np.arange(0, 12), np.arange(12, 15), np.arange(15, 17), np.arange(17, 20)]
    pieces = fedsage_pieces(communities, max_length=20 // 2 - 2)
    assert [p.size for p in pieces] == [8, 4, 3, 3, 2]
    assert deal_sequentially(pieces, 20, 2, delta=2) == [[0, 4], [1, 2, 3]]
    unlabelled = np.full(20, -1)
    owner0, owner1 = fedsage_balance(communities, unlabelled, 2, delta=2)
    assert np.array_equal(owner0, np.r_[0:8, 15:17]) and np.array_equal(owner1, np.r_[8:15, 17:20])
    least = balance_communities(communities, 20, 2)
    assert not np.array_equal(least[0], owner0)


def test_fedsage_deal_where_fedsage_would_not_finish_gives_the_smallest_owner():
    """6 | 6, then a 5 would bring either owner to 11 >= 10 + 1 (FedSage+ loops forever): both hold 6, the
    lower owner takes it and is full, so the last 3 go to owner 1; then all full with a piece left (FedSage+
    divides by zero): the smaller owner takes it."""
    pieces = [np.arange(6), np.arange(6, 12), np.arange(12, 17), np.arange(17, 20)]
    assert deal_sequentially(pieces, 20, 2, delta=1) == [[0, 2], [1, 3]]
    pieces = [np.arange(10), np.arange(10, 19), np.arange(19, 20)]  # 10 | 9 ... 9 + 1 reaches 10: both full
    assert deal_sequentially(pieces, 20, 2, delta=5) == [[0], [1, 2]]


def test_fedsage_top_up_moves_one_node_per_missing_class():
    """Step 3: owner 1 holds no node of class 0; owner 0 (4 of them) gives its highest one, once."""
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    node_sets = [np.arange(0, 6), np.arange(6, 10)]
    owner0, owner1 = top_up_classes(node_sets, labels)
    assert np.array_equal(owner0, [0, 1, 2, 4, 5]) and np.array_equal(owner1, [3, 6, 7, 8, 9])
    # owners holding 2 of every class give and take nothing
    kept = [np.array([0, 1, 4, 5]), np.array([2, 3, 6, 7, 8, 9])]
    assert all(np.array_equal(a, b) for a, b in zip(top_up_classes(kept, labels), kept, strict=True))


def test_fedsage_is_the_default_rule_and_the_other_is_named():
    assert build_config({"federation": {"partition": "louvain", "num_clients": 3}}).federation.louvain_balance == (
        "fedsage"
    )
    with pytest.raises(ConfigError, match="louvain_balance"):
        build_config({"federation": {"partition": "louvain", "num_clients": 3, "louvain_balance": "fedsage+"}})


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
