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
    generator = torch.Generator().manual_seed(3)
    h = torch.randn(3000, 8, generator=generator)
    hubs = torch.randn(30, 8, generator=generator)
    h[:30] = 50 * hubs / hubs.norm(dim=1, keepdim=True)
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


def test_auto_switches_to_ivf_above_the_threshold(monkeypatch: pytest.MonkeyPatch):
    from fedgl_secure.engine import pseudo_graph

    assert pseudo_graph.APPROXIMATE_MIN_NODES >= 100_000
    assert pseudo_graph.APPROXIMATE_MIN_NODES_CUDA >= pseudo_graph.APPROXIMATE_MIN_NODES
    cpu = torch.device("cpu")
    assert resolve_backend("auto", "cpu", num_nodes=pseudo_graph.APPROXIMATE_MIN_NODES) == ("fused", cpu)
    assert resolve_backend("auto", "cpu", num_nodes=pseudo_graph.APPROXIMATE_MIN_NODES + 1) == ("ivf", cpu)
    assert resolve_backend("faiss", "cpu", num_nodes=10**7) == ("faiss", cpu)  # forcing wins
    assert resolve_backend("ivf", "cpu", num_nodes=10) == ("ivf", cpu)

    h = clustered_embeddings(400, 8, seed=13)
    exact = discover_pseudo_graph(h, 10, device="cpu")
    assert_matches_reference(exact, h, 10, "dot")  # below the threshold auto stays exact
    monkeypatch.setattr(pseudo_graph, "APPROXIMATE_MIN_NODES", 399)
    assert resolve_backend("auto", "cpu", num_nodes=400) == ("ivf", cpu)
    switched = discover_pseudo_graph(h, 10, device="cpu")
    ivf = discover_pseudo_graph(h, 10, backend="ivf", device="cpu")
    assert torch.equal(switched.neighbors, ivf.neighbors)


def random_start(points: np.ndarray, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's list: ``width`` random other rows with their exact scores, sorted (a poor seed)."""
    m = points.shape[0]
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(np.delete(np.arange(m), i), width, replace=False) for i in range(m)])
    scores = np.einsum("id,ikd->ik", points, points[ids]).astype(np.float32)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)


def test_refinement_repairs_random_lists_deterministically():
    """From random lists (recall ~1 %), neighbours' neighbours rounds reach the exact top-32 of most
    rows; lists stay sorted, never hold the row itself or a row twice, and do not depend on threads."""
    import numba

    from fedgl_secure.engine import knn_refine

    points = torch.nn.functional.normalize(clustered_embeddings(3000, 8, seed=21), dim=1).numpy()
    ids, scores = random_start(points, 32, seed=2)
    threads = numba.get_num_threads()
    results = []
    for n in sorted({1, threads}):
        a, b = ids.copy(), scores.copy()
        numba.set_num_threads(n)
        try:
            changes = knn_refine.refine(points, a, b, fan=16, rounds=12, settle=0.0)
        finally:
            numba.set_num_threads(threads)
        results.append((a, b))
    a, b = results[0]
    assert all(np.array_equal(a, other) and np.array_equal(b, other_b) for other, other_b in results[1:])
    assert changes[0] > changes[-1]
    assert not (a == np.arange(3000)[:, None]).any()
    assert all(len(set(row)) == 32 for row in a.tolist())
    assert (np.diff(b, axis=1) <= 0).all()
    np.testing.assert_allclose(b, np.einsum("id,ikd->ik", points, points[a]), atol=1e-5)
    exact = torch.from_numpy(points @ points.T).fill_diagonal_(float("-inf")).topk(32, dim=1).indices.numpy()
    hits = sum(len(set(x) & set(y)) for x, y in zip(a.tolist(), exact.tolist(), strict=True))
    assert hits / exact.size >= 0.9
