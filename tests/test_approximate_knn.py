"""The approximate backend of Eq. 15's top-s (``backend="ivf"``): inverted lists probed per group of
rows, searched by the ``probed_knn`` kernel on a CPU or by torch.

In their own file: the kernel compiles once per process (tens of seconds on a busy 2-core host
where numba's on-disk cache is cold), and one file means one xdist worker pays it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_pseudo_graph import assert_invariants, assert_matches_reference, dense_reference

from fedgl_secure.engine import approximate_knn
from fedgl_secure.engine.pseudo_graph import SIMILARITIES, discover_pseudo_graph, resolve_backend


def clustered_embeddings(m: int, d: int, seed: int, centres: int = 20) -> torch.Tensor:
    """Rows around a few random centres, as GCN logits of a few classes are."""
    generator = torch.Generator().manual_seed(seed)
    means = 3 * torch.randn(centres, d, generator=generator)
    return means[torch.randint(0, centres, (m,), generator=generator)] + torch.randn(m, d, generator=generator)


def with_hubs() -> torch.Tensor:
    """3,000 standard-normal rows in 8 dims, of which 30 have norm 50 in random directions: every
    row's top 5 by dot product are among those 30."""
    generator = torch.Generator().manual_seed(3)
    h = torch.randn(3000, 8, generator=generator)
    hubs = torch.randn(30, 8, generator=generator)
    h[:30] = 50 * hubs / hubs.norm(dim=1, keepdim=True)
    return h


@pytest.fixture(scope="module")
def clustered_5k() -> torch.Tensor:
    return clustered_embeddings(5000, 16, seed=11)


@pytest.fixture
def small_lists(monkeypatch: pytest.MonkeyPatch):
    """Lists of at most 64 rows and 640 candidates per row (~13 % of 5,000): the index really
    partitions instead of scanning everything, as it does at the production sizes below ~25,000 rows."""
    monkeypatch.setattr(approximate_knn, "LIST_SIZE", 64)
    monkeypatch.setattr(approximate_knn, "GROUP_SIZE", 32)
    monkeypatch.setattr(approximate_knn, "CANDIDATES", 640)
    monkeypatch.setattr(approximate_knn, "CANDIDATES_MIPS", 640)
    monkeypatch.setattr(approximate_knn, "CANDIDATES_PER_NEIGHBOR", 4)
    return approximate_knn


def recall(graph, h: torch.Tensor, s: int, similarity: str) -> float:
    _, ids = dense_reference(h, s, similarity)
    hits = sum(len(set(a) & set(b)) for a, b in zip(graph.neighbors.tolist(), ids.tolist(), strict=True))
    return hits / ids.numel()


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_ivf_graph_is_valid_deterministic_and_close_to_exact(clustered_5k: torch.Tensor, similarity: str, small_lists):
    s = 20
    plan = small_lists.ivf_plan(5000, s, mips=similarity == "dot")
    assert plan.nlist == 78 and plan.candidates == 640  # each row sees ~13 % of the rows
    graph = discover_pseudo_graph(clustered_5k, s, similarity=similarity, backend="ivf")
    assert graph.neighbors.shape == graph.weights.shape == (5000, s)
    assert graph.neighbors.dtype == torch.int64 and graph.weights.dtype == torch.float32
    assert_invariants(graph)  # never the row itself, no duplicates, rows sum to 1 or 0
    again = discover_pseudo_graph(clustered_5k, s, similarity=similarity, backend="ivf")
    assert torch.equal(graph.neighbors, again.neighbors) and torch.equal(graph.weights, again.weights)
    assert recall(graph, clustered_5k, s, similarity) >= 0.95


def test_dot_finds_high_norm_rows_in_other_directions(small_lists):
    """MIPS: the top-s by dot product of every row are the few rows of by far the largest norm,
    whatever their direction; a search by direction alone (the first ivf) misses them."""
    h = with_hubs()
    graph = discover_pseudo_graph(h, 5, similarity="dot", backend="ivf")
    assert recall(graph, h, 5, "dot") >= 0.95


def test_mips_keys_order_candidates_as_the_dot_product_does():
    h = torch.randn(200, 6, generator=torch.Generator().manual_seed(4)) * torch.rand(200, 1) * 5
    stored, query = approximate_knn.search_keys(h, mips=True)
    torch.testing.assert_close(stored.norm(dim=1), torch.ones(200))
    scaled = query @ stored.t()
    exact = h @ h.t()
    for i in range(0, 200, 17):
        assert torch.equal(torch.argsort(scaled[i], stable=True), torch.argsort(exact[i], stable=True)) or (
            torch.corrcoef(torch.stack([scaled[i], exact[i]]))[0, 1] > 0.9999
        )


def test_torch_search_finds_the_same_neighbours_as_the_kernel(monkeypatch: pytest.MonkeyPatch, small_lists):
    """The torch search (CUDA, or no numba) scores the same candidates exactly: same neighbour sets."""
    h = clustered_embeddings(2000, 16, seed=5)
    kernel = discover_pseudo_graph(h, 10, similarity="cosine", backend="ivf")
    monkeypatch.setattr(approximate_knn, "_import_kernel", lambda: None)
    torch_graph = discover_pseudo_graph(h, 10, similarity="cosine", backend="ivf")
    for a, b in zip(kernel.neighbors.tolist(), torch_graph.neighbors.tolist(), strict=True):
        assert set(a) == set(b)
    torch.testing.assert_close(kernel.weights, torch_graph.weights, atol=1e-5, rtol=0)


def test_work_per_row_does_not_grow_with_the_index():
    small, large = approximate_knn.ivf_plan(256_000, 10), approximate_knn.ivf_plan(2_560_000, 10)
    assert small.candidates_per_query == large.candidates_per_query  # linear in M, unlike exact search
    assert large.nlist == 10 * small.nlist
    assert approximate_knn.ivf_plan(10**7, 1000).candidates >= 4 * 1001  # a large s searches wider
    assert approximate_knn.ivf_plan(10**7, 10, mips=True).candidates > approximate_knn.ivf_plan(10**7, 10).candidates


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_groups_whose_lists_hold_fewer_than_s_rows_probe_more(monkeypatch: pytest.MonkeyPatch, small_lists, similarity):
    """Lists of ~8 rows and 1 wanted candidate: every group still scans at least s + 1 rows, so each
    row gets s distinct neighbours other than itself and nothing unset leaks out."""
    monkeypatch.setattr(small_lists, "LIST_SIZE", 8)
    monkeypatch.setattr(small_lists, "CANDIDATES", 1)
    monkeypatch.setattr(small_lists, "CANDIDATES_MIPS", 1)
    monkeypatch.setattr(small_lists, "CANDIDATES_PER_NEIGHBOR", 0)
    h = clustered_embeddings(300, 4, seed=12, centres=5)
    graph = discover_pseudo_graph(h, 50, similarity=similarity, backend="ivf")
    assert graph.neighbors.shape == (300, 50)
    assert_invariants(graph)


def test_candidates_reaching_m_give_the_exact_graph(small_lists):
    h = torch.randn(60, 3, generator=torch.Generator().manual_seed(12))
    graph = discover_pseudo_graph(h, 50, similarity="cosine", backend="ivf")
    assert_matches_reference(graph, h, 50, "cosine")


def test_rows_of_one_direction_are_split_into_bounded_lists(small_lists):
    """3,000 all-zero rows (a ReLU layer's dead rows) share one direction and so one list: it is cut
    into pieces of at most LIST_SIZE rows instead of being scanned whole by every group that probes it."""
    h = torch.cat([torch.zeros(3000, 16), clustered_embeddings(2000, 16, seed=14)])
    index = small_lists.build_index(h, small_lists.ivf_plan(5000, 10), 10)
    assert np.diff(index.offsets).max() <= small_lists.LIST_SIZE
    assert sorted(index.order.tolist()) == list(range(5000))  # every row in exactly one list
    assert sorted(index.group_rows.tolist()) == list(range(5000))  # and in exactly one query group
    graph = discover_pseudo_graph(h, 10, similarity="cosine", backend="ivf")
    assert_invariants(graph)
    assert torch.all(graph.weights[:3000] == 0)  # zero rows are similar to nobody


def test_split_oversized_lists_keeps_order_and_centroids():
    size = approximate_knn.LIST_SIZE
    sorted_lists = torch.tensor([0] * 3 + [1] * (2 * size + 1) + [2] * 5)
    centroids = torch.eye(3)
    ids, per_list = approximate_knn.split_oversized_lists(sorted_lists, centroids)
    counts = torch.bincount(ids).tolist()
    third = (2 * size + 1 + 2) // 3  # list 1 (2 * size + 1 rows) cut into 3 near-equal pieces
    assert counts == [3, third, third, 2 * size + 1 - 2 * third, 5]
    assert max(counts) <= size
    assert torch.equal(ids, torch.sort(ids).values)
    assert torch.equal(per_list, centroids[[0, 1, 1, 1, 2]])


def test_auto_switches_to_ivf_above_the_threshold_without_faiss(monkeypatch: pytest.MonkeyPatch):
    """On a CPU with faiss auto runs faiss_ivf above the threshold (test_faiss_ivf.py); without it, ivf."""
    from fedgl_secure.engine import pseudo_graph

    assert resolve_backend("faiss", "cpu", num_nodes=10**7) == ("faiss", torch.device("cpu"))  # forcing wins
    monkeypatch.setattr(pseudo_graph, "_import_faiss", lambda: None)

    assert pseudo_graph.APPROXIMATE_MIN_NODES >= 100_000
    assert pseudo_graph.APPROXIMATE_MIN_NODES_CUDA >= pseudo_graph.APPROXIMATE_MIN_NODES
    cpu = torch.device("cpu")
    assert resolve_backend("auto", "cpu", num_nodes=pseudo_graph.APPROXIMATE_MIN_NODES) == ("fused", cpu)
    assert resolve_backend("auto", "cpu", num_nodes=pseudo_graph.APPROXIMATE_MIN_NODES + 1) == ("ivf", cpu)
    assert resolve_backend("ivf", "cpu", num_nodes=10) == ("ivf", cpu)

    h = clustered_embeddings(400, 8, seed=13)
    exact = discover_pseudo_graph(h, 10, device="cpu")
    assert_matches_reference(exact, h, 10, "dot")  # below the threshold auto stays exact
    monkeypatch.setattr(pseudo_graph, "APPROXIMATE_MIN_NODES", 399)
    assert resolve_backend("auto", "cpu", num_nodes=400) == ("ivf", cpu)
    switched = discover_pseudo_graph(h, 10, device="cpu")
    ivf = discover_pseudo_graph(h, 10, backend="ivf", device="cpu")
    assert torch.equal(switched.neighbors, ivf.neighbors)


def row_candidates(index, row: int) -> set[int]:
    """The stored rows ``row`` is scored against: those of every list its group scans with its bit set."""
    g = int(np.searchsorted(index.group_offsets, np.flatnonzero(index.group_rows.numpy() == row)[0], side="right")) - 1
    bit = int(np.flatnonzero(index.group_rows.numpy()[index.group_offsets[g] : index.group_offsets[g + 1]] == row)[0])
    found: set[int] = set()
    for p in range(index.probe_offsets[g], index.probe_offsets[g + 1]):
        if (int(index.probe_masks[p]) >> bit) & 1:
            c = index.probes[p]
            found.update(index.order[index.offsets[c] : index.offsets[c + 1]].tolist())
    return found


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_each_row_gets_the_exact_top_s_of_the_lists_it_chose(small_lists, similarity: str):
    """Rows of one group choose different lists; each is searched over exactly its own (the group's
    union masked per row), so its result is the exact top-s of those candidates, found by the kernel
    and by the torch search alike."""
    h = clustered_embeddings(3000, 16, seed=8)
    x = torch.nn.functional.normalize(h, dim=1) if similarity == "cosine" else h
    s = 10
    plan = small_lists.ivf_plan(3000, s, mips=similarity == "dot")
    index = small_lists.build_index(x, plan, s)
    assert sorted(index.group_rows.tolist()) == list(range(3000))
    assert np.diff(index.group_offsets).max() <= small_lists.GROUP_SIZE
    masks = index.probe_masks
    assert (masks != -1).any()  # some lists are scanned for part of a group only
    found = {}
    for rows, ids, _ in small_lists.search_index(x, s, index):
        found.update(zip(rows.tolist(), ids.tolist(), strict=True))
    for row in range(0, 3000, 97):
        candidates = sorted(row_candidates(index, row) - {row})
        assert len(candidates) >= plan.candidates - 1  # its lists (and the hubs, for dot) hold enough rows
        scores = x[candidates] @ x[row]
        exact = {candidates[j] for j in scores.topk(s).indices.tolist()}
        assert set(found[row]) == exact
