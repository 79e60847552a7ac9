"""GraphFL's overlap variant: the overlapping subgraph clients (data/graphfl_split.py), a client without labelled
nodes in the engine, and the experiment's cache and summary (simulation/graphfl_overlap.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedgl_secure import cli
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graphfl_split import (
    community_order,
    graphfl_clients,
    graphfl_overlap_clients,
    overlapping_windows,
)
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError
from fedgl_secure.simulation import graphfl_overlap
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.simulation.graphfl_overlap import parse_overlaps, summarise_overlap

CLIENTS, LABELS, TEST, VAL = 8, 5, 100, 50


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=80, num_test=100)


def _clients(dataset, overlap, seed=0):
    return graphfl_overlap_clients(dataset, CLIENTS, LABELS, seed, overlap, test_size=TEST, val_size=VAL)


def _global_sets(clients):
    """Per client, its nodes' global ids (``node_ids`` of the synthetic graph are its row numbers)."""
    return [np.asarray(c.node_ids, dtype=np.int64) for c in clients]


@pytest.mark.parametrize("overlap", [0.0, 0.2, 0.4])
def test_windows_cover_the_graph_and_neighbours_share_gamma(dataset, overlap):
    order = community_order(dataset, seed=0)
    assert np.array_equal(np.sort(order), np.arange(dataset.num_nodes))  # every node once
    windows = overlapping_windows(order, CLIENTS, overlap)
    size = math.ceil(dataset.num_nodes / (CLIENTS - (CLIENTS - 1) * overlap))
    assert np.array_equal(np.unique(np.concatenate(windows)), np.arange(dataset.num_nodes))
    assert all(w.size <= size for w in windows) and all(w.size == size for w in windows[:-1])
    for i in range(CLIENTS - 1):  # client i holds ~γ·s nodes of client i+1 (rounding: within one node)
        shared = np.intersect1d(windows[i], windows[i + 1]).size
        assert abs(shared - overlap * size) <= 1
        for j in range(i + 2, CLIENTS):  # γ < 0.5: only neighbours meet (a chain, not a cycle)
            assert np.intersect1d(windows[i], windows[j]).size == 0
    if overlap == 0.0:
        assert sum(w.size for w in windows) == dataset.num_nodes  # a partition


def test_clients_hold_induced_subgraphs(dataset):
    clients = _clients(dataset, 0.2)
    edges = set(zip(*dataset.edge_index.tolist(), strict=True))
    held = set()
    for client, nodes in zip(clients, _global_sets(clients), strict=True):
        local = set(zip(*nodes[client.edge_index].tolist(), strict=True))
        inside = {(u, v) for u, v in edges if u in set(nodes.tolist()) and v in set(nodes.tolist())}
        assert local == inside  # every edge between its nodes, and no other (none leaves the client)
        assert client.edge_index.max() < client.num_nodes
        assert np.array_equal(client.labels, dataset.labels[nodes])
        held |= local
    dropped = edges - held
    assert dropped  # edges between clients that no client holds both ends of are gone
    owners = [set(n.tolist()) for n in _global_sets(clients)]
    for u, v in dropped:
        assert not any(u in s and v in s for s in owners)


def test_roles_match_graphfl_clients_and_never_collide(dataset):
    clients = _clients(dataset, 0.3, seed=2)
    reference = graphfl_clients(dataset, CLIENTS, LABELS, 2, test_size=TEST, val_size=VAL)
    drawn = np.flatnonzero(np.any([c.train_mask for c in reference], axis=0))
    role = np.full(dataset.num_nodes, -1)  # 0 train, 1 validation, 2 test, at every client that holds the node
    for client, nodes in zip(clients, _global_sets(clients), strict=True):
        for value, mask in enumerate((client.train_mask, client.val_mask, client.test_mask)):
            assert not ((role[nodes[mask]] >= 0) & (role[nodes[mask]] != value)).any()  # one role per node
            role[nodes[mask]] = value
        # its training nodes are exactly the drawn nodes it holds
        assert np.array_equal(np.sort(nodes[client.train_mask]), np.intersect1d(drawn, nodes))
    assert np.array_equal(np.flatnonzero(role == 0), drawn)
    assert np.array_equal(np.flatnonzero(role == 1), np.flatnonzero(reference[0].val_mask))
    assert np.array_equal(np.flatnonzero(role == 2), np.flatnonzero(reference[0].test_mask))
    assert (role == 1).sum() == VAL and (role == 2).sum() == TEST


def test_overlap_clients_are_deterministic_per_seed(dataset):
    first, again, other = _clients(dataset, 0.1, 4), _clients(dataset, 0.1, 4), _clients(dataset, 0.1, 5)
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.node_ids, b.node_ids) and np.array_equal(a.edge_index, b.edge_index)
        assert np.array_equal(a.train_mask, b.train_mask) and np.array_equal(a.test_mask, b.test_mask)
    differs = [
        not np.array_equal(a.node_ids, b.node_ids) or not np.array_equal(a.train_mask, b.train_mask)
        for a, b in zip(first, other, strict=True)
    ]
    assert any(differs)


@pytest.mark.parametrize("overlap", [-0.1, 1.0, 1.5, float("nan")])
def test_gamma_out_of_range_is_refused(dataset, overlap):
    with pytest.raises(ConfigError, match="must be in \\[0, 1\\)"):
        _clients(dataset, overlap)
    with pytest.raises(ConfigError, match="--overlaps"):
        parse_overlaps(f"0.1,{overlap}")


def test_a_client_without_labelled_nodes_keeps_the_broadcast(dataset):
    """Over no nodes the mean cross-entropy is nan with a zero gradient, so its epochs would apply only the L2
    weight decay (Kipf's 5e-4 here), which Adam turns into steps of ~lr towards 0: W̄ must come back unchanged."""
    client = _clients(dataset, 0.0)[0]
    client = dataclasses.replace(client, train_mask=np.zeros_like(client.train_mask))
    graph = GraphTensors.from_graph(client, np.arange(client.num_nodes), client.num_nodes, torch.device("cpu"))
    config = build_config({"dataset": "synthetic", "method": "federated", "seed": 0})
    assert config.training.weight_decay > 0
    trainer = LocalTrainer(0, graph, config.training, 0)
    broadcast = torch.randn(trainer.model.flat_parameters().numel(), generator=torch.Generator().manual_seed(0))
    loss = trainer.train(graph.adjacency(None, 0.0, False), broadcast)
    assert torch.equal(trainer.model.flat_parameters(), broadcast)
    assert loss == 0.0


def test_fedavg_runs_on_overlap_clients_some_without_labels(dataset):
    clients = graphfl_overlap_clients(dataset, 12, 2, 0, 0.2, test_size=TEST, val_size=VAL)
    assert any(not c.train_mask.any() for c in clients)  # the case at hand
    config = build_config(
        {
            "dataset": "synthetic",
            "method": "federated",
            "seed": 0,
            "device": "cpu",
            "federation": {"max_rounds": 3, "patience": 3, "participation": 0.5},
            "training": {"local_epochs": 2},
        }
    )
    finite = []
    result = run_experiment(
        config, clients=clients, progress=False, observer=lambda b: finite.append(bool(torch.isfinite(b.weights).all()))
    )
    assert finite == [True] * 3  # W̄ after every round (a nan W̄ still scores: argmax of nan logits is a class)
    assert result.best_round > 0


def test_the_cache_key_includes_gamma(dataset, tmp_path, monkeypatch):
    calls = []

    def fake_cell(data, method, lpc, seed, overlap, settings):
        calls.append(overlap)
        return {"test": overlap, "val": overlap, "best_round": 1}

    monkeypatch.setattr(graphfl_overlap, "overlap_cell", fake_cell)
    first = graphfl_overlap.cached_overlap_cell(tmp_path, dataset, "federated", 10, 0, 0.1, {})
    second = graphfl_overlap.cached_overlap_cell(tmp_path, dataset, "federated", 10, 0, 0.3, {})
    again = graphfl_overlap.cached_overlap_cell(tmp_path, dataset, "federated", 10, 0, 0.1, {})
    assert (first["test"], second["test"], again["test"]) == (0.1, 0.3, 0.1)
    assert calls == [0.1, 0.3] and len(list(tmp_path.glob("overlap-*.json"))) == 2


def test_summary_pairs_graphfl_with_fl_per_seed():
    def cell(test):
        return {"test": test, "val": test, "edges_kept": 0.5, "clients_without_labels": 2, "mean_client_nodes": 9.0}

    cells = {"cora/10/0.1": {"federated": [cell(0.6), cell(0.7)], "graphfl": [cell(0.5), cell(0.8)]}}
    row = summarise_overlap(cells)["cora/10/0.1"]
    assert row["graphfl_minus_fl"]["per_seed"] == pytest.approx([-0.1, 0.1])
    assert row["graphfl_minus_fl"]["mean"] == pytest.approx(0.0)
    assert row["graphfl_minus_fl"]["se"] == pytest.approx(0.1)  # std (ddof 1) 0.1414 / sqrt(2)
    assert row["federated"]["ours"] == pytest.approx([0.65, 0.05])
    assert row["division"]["edges_kept"] == pytest.approx(0.5)


def test_the_command_runs_every_gamma_and_writes_its_own_table(dataset, tmp_path, monkeypatch):
    computed = []

    def fake_cached(runs, data, method, lpc, seed, overlap, overrides):
        computed.append((method, overlap, seed))
        test = {"federated": 0.6, "graphfl": 0.5 + seed / 10, "centralized": 0.7}[method]
        return {"test": test, "val": test, "edges_kept": 0.5, "clients_without_labels": 3, "mean_client_nodes": 9.0}

    monkeypatch.setattr(graphfl_overlap, "cached_overlap_cell", fake_cached)
    monkeypatch.setattr(graphfl_overlap, "load_dataset", lambda name, root, seed: dataset)
    summary = graphfl_overlap.run_graphfl_overlap(["cora"], 2, tmp_path, None, {}, [10], [0.0, 0.3])
    assert sorted(set(computed)) == sorted(
        (m, g, s) for m in ("federated", "graphfl", "centralized") for g in (0.0, 0.3) for s in (0, 1)
    )
    assert sorted(summary) == ["cora/10/0", "cora/10/0.3"]
    assert summary["cora/10/0.3"]["graphfl_minus_fl"]["per_seed"] == pytest.approx([-0.1, 0.0])
    table = (tmp_path / "graphfl_overlap.md").read_text()
    assert "| cora | 10 | 0.3 | 0.600 ± 0.000 | 0.550 ± 0.050 | 0.700 ± 0.000 | -0.050 ± 0.050 |" in table
    assert (tmp_path / "graphfl_overlap.json").exists() and not (tmp_path / "graphfl.md").exists()


def test_the_cli_refuses_a_bad_gamma_and_runs_only_the_overlap_part(tmp_path, monkeypatch):
    result = CliRunner().invoke(
        cli.app, ["reproduce", "graphfl", "--parts", "overlap", "--overlaps", "0,1.2", "--output-dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "γ = 1.2" in result.output
    asked = []

    def fake_run(datasets, seeds, output_dir, root, overrides, counts, overlaps):
        asked.append((datasets, seeds, counts, overlaps))
        (output_dir / "graphfl_overlap.md").write_text("overlap table\n")

    monkeypatch.setattr(graphfl_overlap, "run_graphfl_overlap", fake_run)
    args = ["--parts", "overlap", "--datasets", "cora", "--seeds", "3", "--labels-per-class", "10"]
    result = CliRunner().invoke(cli.app, ["reproduce", "graphfl", *args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert asked == [(["cora"], 3, [10], [0.0, 0.1, 0.3])] and "overlap table" in result.output
    assert not (tmp_path / "graphfl.md").exists()  # the other parts did not run, so their report is not rewritten
