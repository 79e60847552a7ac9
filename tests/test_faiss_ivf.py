"""The faiss inverted-file backend of Eq. 15's top-s (``backend="faiss_ivf"``, what ``auto`` runs on a
CPU above the exact path's size): ``IndexIVFFlat`` over rows lifted so that L2 order is inner-product
order, plus an exact scan of the highest-norm rows for ``dot``."""

from __future__ import annotations

import pytest
import torch
from test_approximate_knn import clustered_embeddings, recall, with_hubs
from test_pseudo_graph import assert_invariants

from fedgl_secure.engine import faiss_ivf, pseudo_graph
from fedgl_secure.engine.pseudo_graph import SIMILARITIES, discover_pseudo_graph, resolve_backend
from fedgl_secure.errors import ConfigError


@pytest.fixture(scope="module")
def clustered_20k() -> torch.Tensor:
    return clustered_embeddings(20_000, 16, seed=21)


def sampled_recall(graph, h: torch.Tensor, s: int, similarity: str, rows: torch.Tensor) -> float:
    """Recall of the exact top-s over ``rows`` (a dense 20,000 x 20,000 reference would take 3 GB)."""
    x = torch.nn.functional.normalize(h, dim=1) if similarity == "cosine" else h
    scores = x[rows].double() @ x.double().t()
    scores[torch.arange(rows.shape[0]), rows] = float("-inf")
    exact = scores.topk(s, dim=1).indices
    found = graph.neighbors[rows].tolist()
    return sum(len(set(a) & set(b)) for a, b in zip(found, exact.tolist(), strict=True)) / exact.numel()


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_recall_meets_the_target_on_20k_rows_deterministically(clustered_20k: torch.Tensor, similarity: str):
    s = 10
    graph = discover_pseudo_graph(clustered_20k, s, similarity=similarity, backend="faiss_ivf")
    plan = faiss_ivf.faiss_ivf_plan(20_000, mips=similarity == "dot")
    assert plan.nprobe < plan.nlist / 4  # a real partition: each row scans a fraction of the rows
    rows = torch.randperm(20_000, generator=torch.Generator().manual_seed(1))[:500]
    assert sampled_recall(graph, clustered_20k, s, similarity, rows) >= faiss_ivf.TARGET_RECALL
    assert graph.neighbors.dtype == torch.int32 and graph.weights.dtype == torch.float32
    # Weights are Eq. 15 on the exact similarities of the neighbours found, sorted by decreasing value.
    x = torch.nn.functional.normalize(clustered_20k, dim=1) if similarity == "cosine" else clustered_20k
    sims = torch.einsum("rd,rkd->rk", x[rows], x[graph.neighbors[rows].long()])
    assert (sims[:, :-1] >= sims[:, 1:] - 1e-5).all()
    torch.testing.assert_close(graph.weights[rows], pseudo_graph.pseudo_graph_weights(sims))
    again = discover_pseudo_graph(clustered_20k, s, similarity=similarity, backend="faiss_ivf")
    assert torch.equal(graph.neighbors, again.neighbors) and torch.equal(graph.weights, again.weights)


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_a_sample_of_rows_searched_alone_gets_the_neighbours_the_whole_graph_gives_them(
    clustered_20k: torch.Tensor, similarity: str
):
    """What lets benchmarks/pseudo_graph_recall.py measure recall at 10^7 rows from 500 of them: a row's answer
    depends on the row and the index only, not on which other rows are searched with it."""
    s = 10
    graph = discover_pseudo_graph(clustered_20k, s, similarity=similarity, backend="faiss_ivf")
    h = torch.nn.functional.normalize(clustered_20k, dim=1) if similarity == "cosine" else clustered_20k
    faiss = pseudo_graph._import_faiss()
    with pseudo_graph._faiss_threads(faiss, torch.get_num_threads()):
        index = faiss_ivf.build_index(faiss, h.numpy(), faiss_ivf.faiss_ivf_plan(20_000, mips=similarity == "dot"))
        rows = torch.randperm(20_000, generator=torch.Generator().manual_seed(4))[:300]
        ids, similarities = faiss_ivf.search_rows(faiss, index, h, rows, s)
    assert torch.equal(ids.to(graph.neighbors.dtype), graph.neighbors[rows])
    torch.testing.assert_close(pseudo_graph.pseudo_graph_weights(similarities), graph.weights[rows])


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_graph_is_valid_where_probed_lists_are_short(similarity: str):
    """s = 100 of 300 rows: some rows' probed lists hold fewer than s + 1 rows and are searched
    again over every list; the graph is still the exact one."""
    h = clustered_embeddings(300, 8, seed=5)
    graph = discover_pseudo_graph(h, 100, similarity=similarity, backend="faiss_ivf")
    assert_invariants(graph)
    assert recall(graph, h, 100, similarity) >= 0.99


def test_dot_finds_high_norm_rows_in_other_directions(monkeypatch: pytest.MonkeyPatch):
    """MIPS: every row's top-s by dot product are the few rows of by far the largest norm,
    whatever their direction; the lifted lists and the hub scan find them (each alone, too)."""
    h = with_hubs()
    graph = discover_pseudo_graph(h, 5, similarity="dot", backend="faiss_ivf")
    assert recall(graph, h, 5, "dot") >= 0.95
    monkeypatch.setattr(faiss_ivf, "HUB_ROWS", 0)
    lists_only = discover_pseudo_graph(h, 5, similarity="dot", backend="faiss_ivf")
    assert recall(lists_only, h, 5, "dot") >= 0.95


def test_lifted_rows_order_candidates_as_the_dot_product_does():
    generator = torch.Generator().manual_seed(4)
    h = (torch.randn(200, 6, generator=generator) * torch.rand(200, 1, generator=generator) * 5).numpy()
    phi = faiss_ivf.largest_norm(h)
    stored, query = faiss_ivf.stored_vectors(h, phi), faiss_ivf.query_vectors(h)
    assert stored.shape == query.shape == (200, 7)
    torch.testing.assert_close(torch.from_numpy(stored).norm(dim=1), torch.full((200,), phi), rtol=1e-5, atol=0)
    q, x = torch.from_numpy(query).double(), torch.from_numpy(stored).double()
    distances = (q[:, None, :] - x[None, :, :]).square().sum(dim=2)  # not cdist: its matmul path cancels
    exact = torch.from_numpy(h).double() @ torch.from_numpy(h).double().t()
    for i in range(0, 200, 17):
        assert torch.equal(distances[i].argsort()[:20], (-exact[i]).argsort()[:20])


def test_plan_lists_grow_as_the_square_root_and_hubs_serve_dot_only():
    small, large = faiss_ivf.faiss_ivf_plan(10**6, mips=False), faiss_ivf.faiss_ivf_plan(10**8, mips=False)
    assert large.nlist == pytest.approx(10 * small.nlist, rel=0.01)
    assert small.nprobe == large.nprobe == faiss_ivf.NPROBE
    assert small.hubs == 0 and faiss_ivf.faiss_ivf_plan(10**6, mips=True).hubs == faiss_ivf.HUB_ROWS
    tiny = faiss_ivf.faiss_ivf_plan(10, mips=True)
    assert tiny.nprobe <= tiny.nlist <= 10 and tiny.hubs == tiny.train_rows == 10


def test_auto_runs_faiss_ivf_above_the_threshold_on_a_cpu(monkeypatch: pytest.MonkeyPatch):
    cpu = torch.device("cpu")
    assert resolve_backend("auto", "cpu", num_nodes=pseudo_graph.APPROXIMATE_MIN_NODES + 1) == ("faiss_ivf", cpu)
    assert resolve_backend("faiss_ivf", "cpu", num_nodes=10) == ("faiss_ivf", cpu)
    h = clustered_embeddings(400, 8, seed=13)
    monkeypatch.setattr(pseudo_graph, "APPROXIMATE_MIN_NODES", 399)
    switched = discover_pseudo_graph(h, 10, device="cpu")
    forced = discover_pseudo_graph(h, 10, backend="faiss_ivf", device="cpu")
    assert torch.equal(switched.neighbors, forced.neighbors)


def test_faiss_ivf_refuses_a_gpu_and_a_missing_faiss(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ConfigError, match="backend 'faiss_ivf' runs on the CPU"):
        resolve_backend("faiss_ivf", "meta")
    monkeypatch.setattr(pseudo_graph, "_import_faiss", lambda: None)
    with pytest.raises(ConfigError, match="'faiss_ivf' needs the faiss-cpu package.*'ivf'"):
        resolve_backend("faiss_ivf", "cpu")
