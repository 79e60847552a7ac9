"""Fed²GNN: rooted trees (Proposition 1, Appendix A), level sums (Algorithm 1), the masked bank-to-bank
exchange, and the method end to end on a small graph."""

from __future__ import annotations

import itertools
from contextlib import nullcontext

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.crypto import pairwise_masks
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.partition import louvain_partition
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import fed2gnn_exchange
from fedgl_secure.methods.fed2gnn import matched_loss, prepare_clients, reconstruct_clients
from fedgl_secure.methods.fed2gnn_exchange import ExchangeBank, exchange_level_sums
from fedgl_secure.methods.rooted_tree import (
    grafted_propagation,
    nonbacktracking_sums,
    rooted_tree,
    tree_propagation,
    walk_sums,
)
from fedgl_secure.model.adjacency import gcn_normalize, row_normalize_features
from fedgl_secure.simulation.experiment import run_experiment


def small_graph(seed: int = 0, n: int = 9, p: float = 0.35) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < p, 1)
    return sp.csr_matrix((upper | upper.T).astype(np.float64))


def walks(adjacency: sp.csr_matrix, start: int, length: int):
    """Every walk of ``length`` steps from ``start`` (brute force)."""
    dense = adjacency.toarray() > 0
    paths = [[start]]
    for _ in range(length):
        paths = [p + [v] for p in paths for v in np.flatnonzero(dense[p[-1]])]
    return paths


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recursive_sums_equal_brute_force_k_hop_sums(seed):
    adjacency = small_graph(seed)
    features = np.random.default_rng(seed).normal(size=(adjacency.shape[0], 3))
    recursive = walk_sums(adjacency, features, 3)
    nonbacktracking = nonbacktracking_sums(adjacency, features, 3)
    for i in range(adjacency.shape[0]):
        for k in range(4):
            paths = walks(adjacency, i, k)
            brute = sum((features[p[-1]] for p in paths), np.zeros(3))
            assert np.allclose(recursive[k][i], brute)
            no_back = [p for p in paths if all(p[t] != p[t + 2] for t in range(len(p) - 2))]
            assert np.allclose(nonbacktracking[k][i], sum((features[p[-1]] for p in no_back), np.zeros(3)))


def gcn_layers(operator: sp.spmatrix, features: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    h = torch.as_tensor(features)
    op = torch.as_tensor(sp.csr_matrix(operator).toarray())
    for layer, weight in enumerate(weights):
        h = op @ h @ torch.as_tensor(weight)
        if layer < len(weights) - 1:
            h = torch.relu(h)
    return h.numpy()


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_rooted_tree_gives_the_ego_graph_gcn_embedding(layers):
    """Proposition 1 with Appendix A's weights; without the correction (the tree's own degrees) it differs."""
    adjacency = small_graph(4, n=10, p=0.3)
    rng = np.random.default_rng(layers)
    features = rng.normal(size=(10, 4))
    weights = [rng.normal(size=(4, 4)) for _ in range(layers)]
    on_graph = gcn_layers(gcn_normalize(adjacency), features, weights)
    for root in range(10):
        tree = rooted_tree(adjacency, root, layers)
        on_tree = gcn_layers(tree_propagation(adjacency, tree), features[tree.node], weights)
        assert np.allclose(on_tree[0], on_graph[root])
    # the uncorrected tree (a plain GCN on the tree as a graph) gives another embedding
    tree = rooted_tree(adjacency, 0, layers)
    edges = sp.csr_matrix(
        (np.ones(tree.size - 1), (np.arange(1, tree.size), tree.parent[1:])), shape=(tree.size, tree.size)
    )
    plain = gcn_layers(gcn_normalize(edges + edges.T), features[tree.node], weights)
    assert not np.allclose(plain[0], on_graph[0])


def grafted_foreign_trees(adjacency: sp.csr_matrix, bank: int, copies: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Nodes 0..bank−1 as one bank: each foreign neighbour j of a bank node i grafted ``copies`` times under i
    (multiplicity 1/copies), j's neighbours other than i under each copy, true degrees: (parent, multiplicity,
    [(graph node it stands for, its degree)])."""
    dense = adjacency.toarray() > 0
    degree = dense.sum(axis=1)
    parent, multiplicity, stands_for = [], [], []
    for i in range(bank):
        for j in np.flatnonzero(dense[i, bank:]) + bank:
            for _ in range(copies):
                child = bank + len(parent)
                parent.append(i), multiplicity.append(1.0 / copies), stands_for.append(j)
                for g in np.flatnonzero(dense[j]):
                    if g != i:
                        parent.append(child), multiplicity.append(1.0), stands_for.append(g)
    return np.asarray(parent), np.asarray(multiplicity), [(v, degree[v]) for v in stands_for]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grafted_trees_with_appendix_a_weights_give_the_whole_graph_gcn(seed):
    """Proposition 1 at a bank: its graph with each boundary node's foreign neighbours grafted under it and their
    other neighbours under them, on Appendix A's weights (true degrees), gives the bank's nodes the 2-layer GCN
    embedding of the whole graph — also when a child stands for its node twice over (multiplicity); plain edges
    under the GCN's own normalisation do not."""
    n, bank = 12, 6
    adjacency = small_graph(seed, n=n, p=0.3)
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, 4))
    weights = [rng.normal(size=(4, 4)) for _ in range(2)]
    on_graph = gcn_layers(gcn_normalize(adjacency), features, weights)
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    assert adjacency[:bank, bank:].nnz > 0  # the bank has foreign neighbours
    local = adjacency[:bank][:, :bank]
    for copies in (1, 2):
        parent, multiplicity, stands_for = grafted_foreign_trees(adjacency, bank, copies)
        nodes = np.asarray([v for v, _ in stands_for])
        added_degree = np.asarray([d for _, d in stands_for], dtype=np.float64)
        operator = grafted_propagation(local, degree[:bank], parent, multiplicity, added_degree)
        on_bank = gcn_layers(operator, features[np.concatenate([np.arange(bank), nodes])], weights)
        assert np.allclose(on_bank[:bank], on_graph[:bank])
    size = bank + parent.size
    edges = sp.coo_matrix(local)
    plain_edges = sp.csr_matrix(
        (
            np.ones(edges.nnz + parent.size),
            (np.concatenate([edges.row, parent]), np.concatenate([edges.col, np.arange(bank, size)])),
        ),
        shape=(size, size),
    )
    plain = gcn_layers(
        gcn_normalize(((plain_edges + plain_edges.T) > 0).astype(float)),
        features[np.concatenate([np.arange(bank), nodes])],
        weights,
    )
    assert not np.allclose(plain[:bank], on_graph[:bank])


def test_sparsify_keeps_the_largest_entries():
    from fedgl_secure.methods.fed2gnn import sparsify

    rows = torch.tensor([[0.1, 0.5, 0.0, 0.3], [0.4, 0.1, 0.2, 0.0]])
    assert torch.equal(sparsify(rows, 2), torch.tensor([[0.0, 0.5, 0.0, 0.3], [0.4, 0.0, 0.2, 0.0]]))
    assert torch.equal(sparsify(rows, 4), rows)


def test_matched_loss_ignores_the_order_of_the_set():
    target = torch.randn(1, 3, 5)
    shuffled = target[:, [2, 0, 1]]
    assert float(matched_loss(shuffled, target, np.array([3]))) == pytest.approx(0.0, abs=1e-9)
    assert float(matched_loss(shuffled, target, np.array([2]))) > 0  # only the first 2 slots count


@pytest.mark.parametrize("size", [1, 2, 4, 5, 7])
def test_best_matching_is_the_hungarian_optimum(size):
    from scipy.optimize import linear_sum_assignment

    from fedgl_secure.methods.fed2gnn import best_matching

    cost = np.random.default_rng(size).random((20, size, size))
    columns = best_matching(cost)
    for b in range(20):
        rows, cols = linear_sum_assignment(cost[b])
        assert cost[b, np.arange(size), columns[b]].sum() == pytest.approx(cost[b, rows, cols].sum())
        assert sorted(columns[b]) == list(range(size))


def test_pairwise_masks_cancel_exactly_and_hide_each_term():
    rng = np.random.default_rng(0)
    keys = [pairwise_masks.new_private_key() for _ in range(4)]
    publics = [pairwise_masks.public_bytes(k) for k in keys]
    active, passive = 0, [1, 2, 3]
    terms = {p: rng.normal(size=50) for p in passive}
    uploads = []
    for p in passive:
        seeds = {q: pairwise_masks.pair_seed(keys[p], publics[q], b"ctx") for q in passive if q != p}
        uploads.append(
            pairwise_masks.masked_upload(
                pairwise_masks.quantise(terms[p]), p, seeds, pairwise_masks.pair_seed(keys[p], publics[active], b"ctx")
            )
        )
    relayed = pairwise_masks.relay_sum(uploads)
    seeds = [pairwise_masks.pair_seed(keys[active], publics[p], b"ctx") for p in passive]
    recovered = pairwise_masks.unmask_sum(relayed, seeds)
    exact = sum(pairwise_masks.quantise(terms[p]).view(np.int64) for p in passive)
    assert np.array_equal(recovered.view(np.int64), exact)  # bit for bit
    assert np.allclose(pairwise_masks.dequantise(recovered), sum(terms.values()), atol=1e-6)
    # the relay's sum is not the sum, nor is any upload a term (each is off by 64-bit uniform masks)
    assert not np.allclose(pairwise_masks.dequantise(relayed), sum(terms.values()), atol=1.0)
    for p, upload in zip(passive, uploads, strict=True):
        assert not np.allclose(pairwise_masks.dequantise(upload), terms[p], atol=1.0)
    # the active bank removing its own mask from one upload still faces the pairwise masks
    alone = pairwise_masks.unmask_sum(uploads[0], [seeds[0]])
    assert not np.allclose(pairwise_masks.dequantise(alone), terms[1], atol=1.0)
    # another context gives other masks (fresh per exchange)
    assert pairwise_masks.pair_seed(keys[1], publics[0], b"ctx") != pairwise_masks.pair_seed(keys[1], publics[0], b"x")


@pytest.fixture(scope="module")
def graph():
    return synthetic_consortium(seed=5, num_nodes=500, num_val=100, num_test=150)


def _banks(graph, num_clients=4, width=3):
    node_sets = louvain_partition(graph, num_clients, seed=0)
    owner = np.empty(graph.num_nodes, dtype=np.int64)
    for k, nodes in enumerate(node_sets):
        owner[nodes] = k
    adjacency = graph.adjacency().tocsr()
    signals = np.hstack(
        [np.random.default_rng(1).normal(size=(graph.num_nodes, width - 1)), np.ones((graph.num_nodes, 1))]
    )
    src, dst = graph.edge_index
    banks = []
    for k, nodes in enumerate(node_sets):
        out = (owner[src] == k) & (owner[dst] != k)
        banks.append(
            ExchangeBank(
                k,
                nodes,
                adjacency[nodes][:, nodes].tocsr(),
                signals[nodes],
                np.stack([src[out], dst[out]]),
                owner[dst[out]],
            )
        )
    return banks, adjacency, signals, owner


def test_exchange_gives_each_bank_the_foreign_part_of_its_level_sums(graph):
    """E_k(i) = Σ over foreign neighbours j of S_{k−1}(j) with S from the whole graph (what no bank holds)."""
    banks, adjacency, signals, owner = _banks(graph)
    full = walk_sums(adjacency, signals, 2)
    result = exchange_level_sums(banks, 2, secure=True, nonce=b"test")
    for bank in banks:
        boundary = result.boundaries[bank.index]
        foreign = adjacency[boundary].multiply(owner[None, :] != bank.index).tocsr()
        for k in (1, 2):
            assert np.allclose(result.sums[bank.index][k - 1], foreign @ full[k - 1], atol=1e-5)
        # the count channel of E_1 is the number of foreign neighbours
        assert np.allclose(result.sums[bank.index][0][:, -1], np.asarray(foreign.sum(axis=1)).ravel())
    values = fed2gnn_exchange.upload_values([b.size for b in result.boundaries], 3, 2)
    assert [8 * v for v in values] == result.bytes_sent
    plain = exchange_level_sums(banks, 2, secure=False, nonce=b"test")
    for a in range(len(banks)):
        for k in range(2):
            assert np.allclose(plain.sums[a][k], result.sums[a][k], atol=1e-5)


def test_relay_view_reveals_nothing_and_changes_with_fresh_masks(graph):
    banks, *_ = _banks(graph)
    boundary = banks[0].boundary()
    terms = {b.index: b.passive_term(b.signals, 0, boundary) for b in banks[1:]}
    total, view = fed2gnn_exchange._secure_sum(banks, terms, 0, b"round-a")
    again, view_b = fed2gnn_exchange._secure_sum(banks, terms, 0, b"round-b")
    truth = sum(terms.values())
    assert np.allclose(total, truth, atol=1e-6) and np.allclose(again, truth, atol=1e-6)
    relay_sum = pairwise_masks.dequantise(pairwise_masks.relay_sum(view)).reshape(truth.shape)
    assert not np.allclose(relay_sum, truth, atol=1.0)
    for upload, term in zip(view, terms.values(), strict=True):
        assert not np.allclose(pairwise_masks.dequantise(upload).reshape(term.shape), term, atol=1.0)
    # same values, fresh context: every upload the relay holds changes entirely
    for first, second in zip(view, view_b, strict=True):
        assert np.mean(first == second) < 0.01
    # the upload bits look uniform: about half of them set
    bits = np.unpackbits(view[0].view(np.uint8))
    assert 0.45 < bits.mean() < 0.55


def test_reconstruction_grafts_trees_on_boundary_nodes_only(graph):
    config = build_config(
        {
            "method": "fed2gnn",
            "federation": {"partition": "louvain", "num_clients": 3},
            "fed2gnn": {"decoder_epochs": 2, "projection_dim": 16, "decoder_hidden": 32},
        }
    )
    node_sets = louvain_partition(graph, 3, seed=0)
    clients, exchange = reconstruct_clients(graph, node_sets, config)
    for k, (client, nodes) in enumerate(zip(clients, node_sets, strict=True)):
        own = np.isin(client.node_ids, nodes)
        assert own.sum() == nodes.size
        assert np.all(client.labels[~own] == -1)
        assert not np.any((client.train_mask | client.val_mask | client.test_mask)[~own])
        # each boundary node gets min(foreign degree, d) decoded neighbours
        local_of = {int(v): i for i, v in enumerate(client.node_ids)}
        generated = ~own
        adjacency = client.adjacency().tocsr()
        for i, degree in zip(exchange.boundaries[k], exchange.sums[k][0][:, -1], strict=True):
            row = adjacency[local_of[int(i)]]
            assert int(generated[row.indices].sum()) == min(int(round(degree)), 5)
        assert exchange.bytes_sent[k] > 0
        # Appendix A's weights: the own nodes' self-weights use their degrees in the whole graph, and the decoded
        # neighbours of a boundary node stand for its foreign neighbours together (P[i, c] / P[c, i] = m_c)
        operator = client.propagation.tocsr()
        true_degree = np.asarray(graph.adjacency().sum(axis=1)).ravel()[client.node_ids[own]]
        assert np.allclose(operator.diagonal()[own], 1.0 / (1.0 + true_degree))
        for i, degree in zip(exchange.boundaries[k], exchange.sums[k][0][:, -1], strict=True):
            row = local_of[int(i)]
            children = [c for c in operator[row].indices if generated[c]]
            assert sum(operator[row, c] / operator[c, row] for c in children) == pytest.approx(degree)


def test_mean_reconstruction_grafts_the_exact_level_mean_without_projection(graph):
    """``reconstruction = "mean"`` with p = 0: one virtual neighbour per boundary node carrying the mean of its
    foreign neighbours' (normalised) feature rows, standing for all of them."""
    config = build_config(
        {
            "method": "fed2gnn",
            "federation": {"partition": "louvain", "num_clients": 3},
            "fed2gnn": {"reconstruction": "mean", "projection_dim": 0, "hops": 1},
        }
    )
    node_sets = louvain_partition(graph, 3, seed=0)
    clients, exchange = reconstruct_clients(graph, node_sets, config)
    normalised = row_normalize_features(graph.features).toarray()
    adjacency = graph.adjacency().tocsr()
    client, nodes = clients[0], node_sets[0]
    own = np.isin(client.node_ids, nodes)
    local_of = {int(v): i for i, v in enumerate(client.node_ids)}
    operator = client.propagation.tocsr()
    for i in exchange.boundaries[0]:
        foreign = np.setdiff1d(adjacency[int(i)].indices, nodes)
        row = local_of[int(i)]
        (child,) = [c for c in operator[row].indices if not own[c]]
        assert np.allclose(client.features[child].toarray().ravel(), normalised[foreign].mean(axis=0), atol=1e-6)
        assert operator[row, child] / operator[child, row] == pytest.approx(foreign.size)


def test_methods_refuse_overlapping_clients(graph):
    config = build_config({"method": "fed2gnn"})
    with pytest.raises(ConfigError, match="partition"):
        prepare_clients(config, graph, [graph])


def test_fed2gnn_and_fedavg_full_run_end_to_end(graph):
    results = {}
    for method in ("fedavg-full", "fed2gnn"):
        config = build_config(
            {
                "method": method,
                "federation": {"partition": "louvain", "num_clients": 3, "max_rounds": 2},
                "fed2gnn": {"decoder_epochs": 2, "projection_dim": 16, "decoder_hidden": 32},
            }
        )
        results[method] = run_experiment(config, graph, progress=False)
    assert results["fedavg-full"].num_global_nodes == graph.num_nodes  # the halos are real nodes
    assert results["fed2gnn"].num_global_nodes > graph.num_nodes  # the decoded tree nodes
    for result in results.values():
        assert 0.0 <= result.global_test_accuracy <= 1.0 and result.rounds_run == 2


def test_brute_force_walks_helper_counts():
    """The test's own brute force: a triangle has 2^k walks of length k from each node."""
    triangle = sp.csr_matrix(np.ones((3, 3)) - np.eye(3))
    for k in range(4):
        assert len(walks(triangle, 0, k)) == 2**k
    assert list(itertools.islice(walks(triangle, 0, 1), 2)) == [[0, 1], [0, 2]]


def test_table1_summary_keeps_cells_apart_and_shows_the_paper():
    from fedgl_secure.simulation.fed2gnn_reproduce import render_markdown, summarize, table1_specs

    def run(method, seed, accuracy):
        return {"dataset": "cora", "method": method, "seed": seed, "global_test_accuracy": accuracy}

    results = [
        (10, run("fed2gnn", 0, 0.80)),
        (10, run("fed2gnn", 1, 0.84)),
        (15, run("fed2gnn", 0, 0.70)),
        (0, run("centralized", 0, 0.88)),
    ]
    for _, result in results:
        result.update(best_val_accuracy=0.5, best_round=3)
    table = summarize(results)
    assert table["cora"]["fed2gnn"]["10"]["mean"] == pytest.approx(82.0)
    assert table["cora"]["fed2gnn"]["10"]["paper"] == 83.30
    assert table["cora"]["fed2gnn"]["15"]["mean"] == pytest.approx(70.0)
    text = render_markdown(table)
    assert "82.00 ± 2.00 [83.30]" in text and "| Central | 88.00 ± 0.00 [87.88] | 88.00 ± 0.00 [87.88] |" in text
    specs = table1_specs("cora", [5, 10], 2, None)
    assert len(specs) == 2 * (1 + 2 * 3)
    louvain = [spec.config for m, spec in specs if m == 10]
    assert {c.method for c in louvain} == {"federated", "fedavg-full", "fed2gnn"}
    assert all(c.federation.num_clients == 10 and c.data.split == "fraction" for c in louvain)


def test_reproduce_command_refuses_bad_client_counts():
    from typer.testing import CliRunner

    from fedgl_secure.cli import app

    result = CliRunner().invoke(app, ["reproduce", "fed2gnn", "--clients", "1,5"])
    assert result.exit_code != 0 and "--clients" in result.output


def test_consortium_services_run_fed2gnn_on_louvain_slices_only():
    from pathlib import Path

    from fedgl_secure.consortium.setup_checks import check_consortium_can_run
    from fedgl_secure.policy.schema import load_policy

    policy = load_policy(Path(__file__).parent.parent / "policies" / "baseline.toml")
    louvain = {"partition": "louvain", "num_clients": 3}
    check_consortium_can_run(build_config({"method": "fed2gnn", "federation": louvain}), policy, 3)
    refused = {
        "only in the in-process simulation": {"method": "fedavg-full", "federation": louvain},
        "with banks' own tables": {"method": "fed2gnn", "dataset": "bank-sources", "federation": louvain},
        "federation.partition": {"method": "fed2gnn"},
        "fed2gnn.secure": {"method": "fed2gnn", "federation": louvain, "fed2gnn": {"secure": False}},
    }
    for message, values in refused.items():
        with pytest.raises(ConfigError, match=message):
            check_consortium_can_run(build_config(values), policy, 3)


def test_table1_reuses_a_run_recorded_before_a_config_field_was_added():
    from fedgl_secure.simulation.fed2gnn_reproduce import _canonical

    config = build_config({"method": "fed2gnn", "federation": {"partition": "louvain", "num_clients": 3}})
    recorded = config.model_dump(mode="json")
    older = {key: value for key, value in recorded.items() if key != "fed2gnn"}  # as written before the section
    assert _canonical(older) == _canonical(recorded) is not None
    # a run recorded before fed2gnn.edge_correction existed trained on plain edges: it is not today's default run
    before_correction = {
        **recorded,
        "fed2gnn": {k: v for k, v in recorded["fed2gnn"].items() if k != "edge_correction"},
    }
    assert _canonical(before_correction) != _canonical(recorded)
    plain = {**recorded, "fed2gnn": {**recorded["fed2gnn"], "edge_correction": False}}
    assert _canonical(before_correction) == _canonical(plain)
    assert _canonical({**recorded, "seed": 1}) != _canonical(recorded)
    assert _canonical({"no_such_field": 1}) is None
    # a run recorded before federation.louvain_balance existed had the least-loaded clients, not FedSage+'s
    before_fedsage = {
        **recorded,
        "federation": {k: v for k, v in recorded["federation"].items() if k != "louvain_balance"},
    }
    assert recorded["federation"]["louvain_balance"] == "fedsage"
    assert _canonical(before_fedsage) != _canonical(recorded)
    least = {**recorded, "federation": {**recorded["federation"], "louvain_balance": "least-loaded"}}
    assert _canonical(before_fedsage) == _canonical(least)


@pytest.mark.parametrize("posture", ["strict-edge-dp", "strict-dp"])
def test_the_neighbour_exchange_is_refused_under_an_edge_or_node_dp_policy(posture):
    """Fail closed: the set-up exchange releases per-node neighbour sums from the true graph, outside every DP
    channel, so an edge or node guarantee would not hold (the simulation and the consortium both refuse)."""
    from pathlib import Path

    from fedgl_secure.methods.privacy_checks import check_runnable
    from fedgl_secure.policy.schema import load_policy

    policy = load_policy(Path(__file__).parent.parent / "policies" / f"{posture}.toml")
    louvain = {"partition": "louvain", "num_clients": 3}
    for method in ("fed2gnn", "fedavg-full"):
        with pytest.raises(ConfigError, match=f"method '{method}' sends other banks per-node neighbour sums"):
            check_runnable(policy, build_config({"method": method, "federation": louvain}))


def test_label_dp_keeps_the_grafted_graphs_appendix_a_operator(graph):
    """Label DP changes no graph: a bank's training graph keeps Fed²GNN's corrected propagation, where edge DP
    (which perturbs the adjacency) rebuilds the operator from the released graph."""
    from pathlib import Path

    from fedgl_secure.engine.graph_tensors import GraphTensors
    from fedgl_secure.policy.schema import load_policy
    from fedgl_secure.privacy.dp_round import FederationPrivacy

    config = build_config(
        {
            "method": "fed2gnn",
            "federation": {"partition": "louvain", "num_clients": 3},
            "fed2gnn": {"decoder_epochs": 2, "projection_dim": 0, "reconstruction": "mean"},
        }
    )
    from fedgl_secure.data.graph import induced_subgraph

    parts = louvain_partition(graph, 3, seed=0)
    clients = prepare_clients(config, graph, [induced_subgraph(graph, nodes) for nodes in parts])
    client = clients[0]
    assert client.propagation is not None
    tensors = GraphTensors.from_graph(client, np.arange(client.num_nodes), client.num_nodes, torch.device("cpu"))
    policies = Path(__file__).parent.parent / "policies"
    operators = {}
    for posture in ("label-dp", "strict-edge-dp"):
        privacy = FederationPrivacy(load_policy(policies / f"{posture}.toml"))
        (adjacency,) = privacy.setup(["bank-a"], [1.0], [client.adjacency()], [np.random.default_rng(0)])
        # the label release may be the consortium's (policies/label-dp.toml): every bank's graph at once
        (private,) = privacy.private_graphs([tensors], [adjacency], lambda: nullcontext(PlaintextSummation()))
        operators[posture] = private.base_adjacency
    assert operators["label-dp"] is tensors.base_adjacency
    assert operators["strict-edge-dp"] is not tensors.base_adjacency
