"""Global pseudo graph (Eq. 15) against a dense reference built from the full H̄ H̄ᵀ."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgl_secure.engine.pseudo_graph import (
    BACKENDS,
    SIMILARITIES,
    PseudoGraph,
    discover_pseudo_graph,
    drop_self,
    resolve_backend,
)
from fedgl_secure.errors import ConfigError

# The fused backend runs these same checks in test_fused_knn.py: its kernel compiles once per
# process (up to ~100 s on a busy 2-core host), and one test file means one xdist worker pays it.
CPU_BACKENDS = ("torch", "faiss")


def dense_reference(h: torch.Tensor, s: int, similarity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 15 the obvious way, in float64: (M x M dense Ā, M x s_eff top neighbour ids)."""
    x = h.double()
    if similarity == "cosine":
        norms = x.norm(dim=1, keepdim=True)
        x = torch.where(norms > 0, x / norms.clamp_min(1e-300), torch.zeros_like(x))
    sims = x @ x.T
    sims.fill_diagonal_(float("-inf"))
    s_eff = min(s, h.shape[0] - 1)
    values, ids = sims.topk(s_eff, dim=1)
    kept = values.clamp(min=0)
    totals = kept.sum(dim=1, keepdim=True)
    kept = torch.where(totals > 0, kept / totals.clamp_min(1e-300), torch.zeros_like(kept))
    dense = torch.zeros_like(sims).scatter_(1, ids, kept)
    return dense, ids


def random_embeddings(m: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed))


def assert_matches_reference(graph: PseudoGraph, h: torch.Tensor, s: int, similarity: str) -> None:
    dense, ids = dense_reference(h, s, similarity)
    m = h.shape[0]
    assert graph.neighbors.shape == graph.weights.shape == (m, min(s, m - 1))
    assert graph.neighbors.dtype == torch.int64 and graph.weights.dtype == torch.float32
    assert graph.neighbors.device.type == graph.weights.device.type == "cpu"
    for i in range(m):
        assert set(graph.neighbors[i].tolist()) == set(ids[i].tolist()), f"row {i}"
    torch.testing.assert_close(graph.to_sparse_coo().to_dense().double(), dense, atol=1e-5, rtol=0)
    assert_invariants(graph)


def assert_invariants(graph: PseudoGraph) -> None:
    m = graph.num_nodes
    rows = torch.arange(m)[:, None]
    assert not (graph.neighbors == rows).any(), "a node is its own neighbour"
    assert ((graph.neighbors >= 0) & (graph.neighbors < m)).all()
    for i in range(m):
        assert len(set(graph.neighbors[i].tolist())) == graph.num_neighbors, f"duplicate in row {i}"
    assert (graph.weights >= 0).all()
    sums = graph.weights.sum(dim=1)
    assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0)), "rows must sum to 1 or be all 0"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize(
    ("m", "d", "s", "block_size"),
    [
        (50, 8, 5, 7),  # blocks that do not divide M; faiss below its BLAS threshold
        (50, 8, 5, None),
        (137, 16, 10, 64),
        (20, 3, 19, 3),  # s = M - 1: every other node is kept
        (20, 3, 100, None),  # s > M - 1 is capped
    ],
)
def test_matches_dense_reference(backend: str, similarity: str, m: int, d: int, s: int, block_size: int | None):
    h = random_embeddings(m, d, seed=m + d + s)
    graph = discover_pseudo_graph(h, s, similarity=similarity, backend=backend, block_size=block_size)
    assert_matches_reference(graph, h, s, similarity)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_high_norm_hubs_outrank_self_similarity(backend: str):
    # With dot similarity a few large-norm nodes beat most nodes' own ‖h_i‖², so the node itself
    # is often not among its top s + 1: exactly the case where faiss results lose the last column.
    h = random_embeddings(60, 4, seed=3)
    h[:8] *= 20
    graph = discover_pseudo_graph(h, 6, similarity="dot", backend=backend, block_size=16)
    assert_matches_reference(graph, h, 6, "dot")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_all_negative_similarities_give_an_all_zero_row(backend: str, similarity: str):
    h = random_embeddings(30, 2, seed=1).abs() + 0.1  # all in the positive quadrant
    h[0] = torch.tensor([-1.0, -2.0])  # negatively similar to everybody
    graph = discover_pseudo_graph(h, 29, similarity=similarity, backend=backend)
    assert_matches_reference(graph, h, 29, similarity)
    assert (graph.weights[0] == 0).all()
    assert torch.allclose(graph.weights[1:].sum(dim=1), torch.ones(29))
    coo = graph.to_sparse_coo()
    assert not (coo.indices()[0] == 0).any(), "zero-weight entries must be dropped"
    assert not (coo.indices()[1] == 0).any()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cosine_keeps_zero_embeddings_at_zero(backend: str):
    h = random_embeddings(25, 5, seed=2)
    h[4] = 0
    graph = discover_pseudo_graph(h, 5, similarity="cosine", backend=backend)
    assert torch.isfinite(graph.weights).all()
    assert (graph.weights[4] == 0).all()
    assert_invariants(graph)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_ties_never_make_a_node_its_own_neighbour(backend: str):
    graph = discover_pseudo_graph(torch.ones(30, 4), 5, backend=backend, block_size=8)
    assert_invariants(graph)
    torch.testing.assert_close(graph.weights, torch.full((30, 5), 0.2))


def test_sparse_exports_agree():
    graph = discover_pseudo_graph(random_embeddings(40, 6, seed=4), 4, similarity="cosine")
    coo = graph.to_sparse_coo()
    assert coo.is_coalesced() and coo.shape == (40, 40) and coo.dtype == torch.float32
    torch.testing.assert_close(torch.from_numpy(graph.to_scipy().toarray()), coo.to_dense())
    rows = torch.arange(40)[:, None].expand_as(graph.neighbors)
    assert torch.equal(coo.to_dense()[rows, graph.neighbors], graph.weights)


def test_degenerate_sizes_and_dtypes():
    assert discover_pseudo_graph(torch.randn(1, 3), 5).neighbors.shape == (1, 0)
    two = discover_pseudo_graph(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), 5)
    assert two.neighbors.tolist() == [[1], [0]] and two.weights.tolist() == [[1.0], [1.0]]
    h64 = random_embeddings(30, 4, seed=5).double()
    assert_matches_reference(discover_pseudo_graph(h64, 3), h64, 3, "dot")


def test_faiss_and_torch_share_a_process():
    """Both ship their own OpenMP runtime; alternating them must neither hang nor disagree,
    and the faiss thread count we set for a call must not outlive it."""
    import faiss

    before = faiss.omp_get_max_threads()
    h = random_embeddings(300, 8, seed=6)
    first = discover_pseudo_graph(h, 10, backend="faiss")
    mid = discover_pseudo_graph(h, 10, backend="torch", block_size=50)
    last = discover_pseudo_graph(h, 10, backend="faiss")
    assert faiss.omp_get_max_threads() == before
    torch.testing.assert_close(first.to_sparse_coo().to_dense(), mid.to_sparse_coo().to_dense())
    assert torch.equal(first.neighbors, last.neighbors)


def test_faiss_tile_sizes_are_set_for_our_search_only():
    """Exact search runs on cache-sized tiles, which must not leak into other faiss users of the process."""
    import faiss

    before = (faiss.cvar.distance_compute_blas_query_bs, faiss.cvar.distance_compute_blas_database_bs)
    h = random_embeddings(3000, 8, seed=16)
    graph = discover_pseudo_graph(h, 10, backend="faiss")
    assert (faiss.cvar.distance_compute_blas_query_bs, faiss.cvar.distance_compute_blas_database_bs) == before
    assert_matches_reference(graph, h, 10, "dot")


def test_faiss_imported_before_torch_in_a_fresh_process():
    """Both backends find the same top-5 after faiss's OpenMP pool started before torch's: the same similarities
    per row (the neighbours' ids may differ only where two candidates tie within float rounding — unseeded data
    once made this test fail on such a tie)."""
    script = textwrap.dedent(
        """
        import faiss, numpy as np
        import torch
        from fedgl_secure.engine.pseudo_graph import discover_pseudo_graph
        torch.manual_seed(0)
        h = torch.randn(500, 8)
        a = discover_pseudo_graph(h, 5, backend="faiss").neighbors
        _ = torch.randn(256, 256) @ torch.randn(256, 256)  # torch's OpenMP pool, after faiss's
        b = discover_pseudo_graph(h, 5, backend="torch").neighbors
        def similarities(neighbors):
            return (h[:, None, :] * h[neighbors]).sum(dim=-1).sort(dim=1).values
        same = torch.allclose(similarities(a), similarities(b), rtol=0, atol=1e-5)
        print("agree", bool(same and (a != torch.arange(500)[:, None]).all()))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "agree True" in done.stdout


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"embeddings": torch.randn(10)}, "embeddings"),
        ({"embeddings": torch.randn(2, 3, 4)}, "embeddings"),
        ({"embeddings": torch.randn(10, 0)}, "embeddings"),
        ({"embeddings": torch.tensor([[1.0, float("nan")], [0.0, 1.0]])}, "embeddings"),
        ({"embeddings": torch.tensor([[1.0, float("inf")], [0.0, 1.0]])}, "embeddings"),
        ({"embeddings": [[1.0, 2.0], [3.0, 4.0]]}, "embeddings"),
        ({"s": 0}, "s must"),
        ({"s": -3}, "s must"),
        ({"s": 2.5}, "s must"),
        ({"s": True}, "s must"),
        ({"similarity": "euclidean"}, "similarity"),
        ({"backend": "gpu"}, "backend"),
        ({"block_size": 0}, "block_size"),
        ({"device": "not-a-device"}, "device"),
        ({"backend": "faiss", "device": "cuda"}, "device"),
    ],
)
def test_invalid_arguments_raise_config_error_naming_them(arguments: dict, named: str):
    call = {"embeddings": torch.randn(10, 3), "s": 3, **arguments}
    with pytest.raises(ConfigError) as raised:
        discover_pseudo_graph(**call)
    assert str(raised.value).startswith(named), str(raised.value)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_overflowing_similarities_raise_instead_of_returning_nan(backend: str):
    with pytest.raises(ConfigError, match="embeddings"):
        discover_pseudo_graph(torch.full((5, 2), 1e30), 2, backend=backend)


@settings(max_examples=25, deadline=None, database=None)
@given(
    m=st.integers(2, 40),
    d=st.integers(2, 6),  # with one dimension cosine similarities are all ±1: ties everywhere
    s=st.integers(1, 45),
    seed=st.integers(0, 2**16),
    similarity=st.sampled_from(SIMILARITIES),
    backend=st.sampled_from(CPU_BACKENDS),
    block_size=st.one_of(st.none(), st.integers(1, 45)),
)
def test_property_any_size_matches_reference(m, d, s, seed, similarity, backend, block_size):
    h = random_embeddings(m, d, seed)
    graph = discover_pseudo_graph(h, s, similarity=similarity, backend=backend, block_size=block_size)
    assert_matches_reference(graph, h, s, similarity)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_progress_bar_only_for_many_blocks_unless_disabled(backend: str, capsys: pytest.CaptureFixture):
    h = random_embeddings(30, 3, seed=7)
    discover_pseudo_graph(h, 3, backend=backend, block_size=10)  # 3 blocks: quiet
    assert "pseudo graph" not in capsys.readouterr().err
    discover_pseudo_graph(h, 3, backend=backend, block_size=1, progress=False)  # 30, disabled
    assert "pseudo graph" not in capsys.readouterr().err
    discover_pseudo_graph(h, 3, backend=backend, block_size=1)  # 30 blocks: shown
    assert "pseudo graph" in capsys.readouterr().err


def test_drop_self_removes_the_node_or_else_the_last_candidate():
    ids = torch.tensor([[5, 0, 7], [4, 8, 9], [2, 3, 1]])  # row 0 finds itself in the middle,
    scores = torch.tensor([[3.0, 2.0, 1.0], [6.0, 5.0, 4.0], [9.0, 8.0, 7.0]])  # row 1 not at all
    kept_ids, kept_scores = drop_self(ids, scores, torch.tensor([0, 1, 2]))
    assert kept_ids.tolist() == [[5, 7], [4, 8], [3, 1]]
    assert kept_scores.tolist() == [[3.0, 1.0], [6.0, 5.0], [8.0, 7.0]]


def test_auto_backend_on_a_cpu_host_prefers_fused_then_faiss(monkeypatch: pytest.MonkeyPatch):
    from fedgl_secure.engine import pseudo_graph

    cpu, large = torch.device("cpu"), pseudo_graph.FUSED_MIN_NODES
    if torch.cuda.is_available():
        assert resolve_backend("auto", num_nodes=large) == ("torch", torch.device("cuda"))
    assert resolve_backend("auto", "cpu", num_nodes=large) == ("fused", cpu)
    # Small inputs stay on faiss: the kernel's one-off load would cost more than it saves.
    assert resolve_backend("auto", "cpu", num_nodes=large - 1) == ("faiss", cpu)
    assert resolve_backend("auto", "cpu") == ("faiss", cpu)
    assert resolve_backend("fused", "cpu", num_nodes=10) == ("fused", cpu)  # forcing wins
    assert resolve_backend("torch", "cpu") == ("torch", cpu)
    monkeypatch.setattr(pseudo_graph, "_import_fused", lambda: None)  # numba missing
    assert resolve_backend("auto", "cpu", num_nodes=large) == ("faiss", cpu)
    with pytest.raises(ConfigError, match="numba"):
        resolve_backend("fused", "cpu")


def test_public_constants():
    assert BACKENDS == ("auto", "torch", "fused", "faiss", "ivf", "faiss_ivf", "planar") and SIMILARITIES == (
        "dot",
        "cosine",
    )


# The approximate backends are tested in test_approximate_knn.py (ivf) and test_faiss_ivf.py (faiss_ivf),
# the planar one in test_planar_knn.py.


def test_faiss_refuses_a_gpu_device():
    with pytest.raises(ConfigError, match="^device"):
        discover_pseudo_graph(torch.randn(10, 3), 3, backend="faiss", device="cuda:0")
