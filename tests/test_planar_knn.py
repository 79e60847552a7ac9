"""The planar backend (engine/planar_knn.py) is exact search for two-column embeddings.

Exact up to ties: every row's kept similarities equal exact search's, value for value, and no
row keeps itself or a neighbour twice.
"""

import numpy as np
import pytest
import torch
from scipy.spatial import ConvexHull

from fedgl_secure.engine import planar_knn
from fedgl_secure.engine.pseudo_graph import (
    APPROXIMATE_MIN_NODES,
    SIMILARITIES,
    discover_pseudo_graph,
    resolve_backend,
)
from fedgl_secure.engine.pseudo_graph_recall import recall_rows, sampled_recall
from fedgl_secure.errors import ConfigError


def _embeddings(kind: str, m: int, seed: int) -> torch.Tensor:
    generator = np.random.default_rng(seed)
    if kind == "gaussian":
        rows = generator.standard_normal((m, 2)) * [3.0, 0.5] + [1.0, 0.0]
    elif kind == "clustered":  # a few tight clusters: many near-ties
        centres = generator.standard_normal((6, 2)) * 4
        rows = centres[generator.integers(0, 6, m)] + 0.01 * generator.standard_normal((m, 2))
    elif kind == "zeros_and_duplicates":
        rows = generator.standard_normal((m, 2))
        rows[generator.random(m) < 0.2] = 0.0
        rows[: m // 10] = rows[m // 10 : 2 * (m // 10)]
    elif kind == "collinear":  # two logits that sum to 0: every row on one line through 0
        a = generator.standard_normal(m)
        rows = np.stack([a, -a], axis=1)
    elif kind == "all_zero":
        rows = np.zeros((m, 2))
    else:  # "few_directions": cosine ties everywhere
        rows = generator.integers(-1, 2, (m, 2)) * generator.uniform(0.5, 2.0, (m, 1))
    return torch.from_numpy(rows.astype(np.float32))


def _exact_top_values(h: torch.Tensor, s: int, similarity: str) -> torch.Tensor:
    if similarity == "cosine":
        h = torch.nn.functional.normalize(h, dim=1)
    scores = h @ h.t()
    scores.fill_diagonal_(float("-inf"))
    return torch.topk(scores, s, dim=1).values


def _kept_values(h: torch.Tensor, neighbors: torch.Tensor, similarity: str) -> torch.Tensor:
    if similarity == "cosine":
        h = torch.nn.functional.normalize(h, dim=1)
    return (h[:, None, :] * h[neighbors.long()]).sum(dim=-1).sort(dim=1, descending=True).values


KINDS = ("gaussian", "clustered", "zeros_and_duplicates", "collinear", "few_directions", "all_zero")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize("s", [1, 7, 40])
def test_planar_keeps_the_exact_top_s_similarities(kind: str, similarity: str, s: int) -> None:
    h = _embeddings(kind, 1500, seed=s)
    graph = discover_pseudo_graph(h, s, similarity=similarity, backend="planar")

    neighbors = graph.neighbors.long()
    assert neighbors.shape == (1500, s)
    assert not (neighbors == torch.arange(1500)[:, None]).any(), "a row kept itself"
    assert (neighbors.sort(dim=1).values.diff(dim=1) != 0).all(), "a row kept a neighbour twice"
    expected = _exact_top_values(h, s, similarity)
    torch.testing.assert_close(_kept_values(h, neighbors, similarity), expected, atol=2e-6, rtol=1e-6)
    reference = discover_pseudo_graph(h, s, similarity=similarity, backend="torch")
    torch.testing.assert_close(
        graph.weights.sort(dim=1).values, reference.weights.sort(dim=1).values, atol=2e-6, rtol=1e-6
    )


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_planar_handles_more_neighbours_than_directions(similarity: str) -> None:
    """s close to M: the arcs overlap (cosine) and the layers run out (dot)."""
    h = _embeddings("gaussian", 12, seed=3)
    graph = discover_pseudo_graph(h, 11, similarity=similarity, backend="planar")
    torch.testing.assert_close(
        _kept_values(h, graph.neighbors, similarity), _exact_top_values(h, 11, similarity), atol=2e-6, rtol=1e-6
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize(("m", "s"), [(1500, 7), (1000, 7), (12, 11)])
def test_the_block_total_is_the_number_of_blocks_planar_yields(kind: str, similarity: str, m: int, s: int) -> None:
    """The progress bar's total: with and without rows of no direction, and with too few directions for arcs."""
    total, blocks = planar_knn.planar_top_s(_embeddings(kind, m, seed=m), s, similarity, block_rows=250)
    assert total == len(list(blocks))


def _peeled_layers(points: np.ndarray, layers: int) -> np.ndarray:
    remaining, found = np.arange(len(points)), []
    for _ in range(layers):
        vertices = ConvexHull(points[remaining]).vertices
        found.append(remaining[vertices])
        remaining = np.delete(remaining, vertices)
    return np.unique(np.concatenate(found))


def test_the_fence_keeps_every_point_of_the_first_layers() -> None:
    """Above the sample size the fence discards the interior; the layers found are still the
    whole set's, point for point, and the fence did discard most points."""
    points = np.random.default_rng(5).standard_normal((planar_knn.SAMPLE_ROWS + 30_000, 2)) * [2.0, 1.0]
    outside = planar_knn.outside_fence(points, 6)
    assert len(outside) < len(points) // 10
    np.testing.assert_array_equal(planar_knn.convex_layer_candidates(points, 6), _peeled_layers(points, 6))


def test_auto_runs_planar_for_two_columns_above_the_exact_limit() -> None:
    cpu = torch.device("cpu")
    large = APPROXIMATE_MIN_NODES + 1
    assert resolve_backend("auto", "cpu", num_nodes=large, num_dims=2) == ("planar", cpu)
    assert resolve_backend("auto", "cpu", num_nodes=large, num_dims=3)[0] != "planar"
    assert resolve_backend("auto", "cpu", num_nodes=APPROXIMATE_MIN_NODES, num_dims=2)[0] != "planar"


def test_planar_refuses_embeddings_that_are_not_two_columns() -> None:
    with pytest.raises(ConfigError, match="'planar' needs embeddings with 2 columns, got 3"):
        discover_pseudo_graph(torch.randn(50, 3), 5, backend="planar")
    with pytest.raises(ConfigError, match="needs backend 'torch' or 'ivf'"):
        discover_pseudo_graph(torch.randn(50, 2), 5, backend="planar", device="meta")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("s", [3, 25])
def test_dot_blocks_search_only_their_arcs_and_stay_exact(kind: str, s: int) -> None:
    """Small blocks: each searches the few layer points its narrow arc allows, and still finds
    every row's exact top s + 1."""
    h = _embeddings(kind, 3000, seed=s + 1)
    exact = (h @ h.t()).topk(s + 1, dim=1).values
    searched = 0
    for rows, ids, values in planar_knn.dot_top_s(h.numpy().astype(np.float64), s, block_rows=40):
        torch.testing.assert_close((h[rows][:, None, :] * h[ids]).sum(-1), values)
        torch.testing.assert_close(values, exact[rows], atol=2e-6, rtol=1e-6)
        searched += len(rows)
    assert searched == 3000


def test_an_arc_keeps_fewer_points_than_the_layers() -> None:
    h = _embeddings("gaussian", 20_000, seed=9).numpy().astype(np.float64)
    layers = planar_knn.convex_layer_candidates(h, 11)
    angles = np.sort(np.arctan2(h[:, 1], h[:, 0]))
    kept = planar_knn.arc_candidates(h, layers, angles[0], angles[199], 11)
    assert 11 <= len(kept) < len(layers) // 2


def test_cosine_orders_dense_angles_in_float64() -> None:
    """Rows packed into a narrow arc: their float32 cosines are all 1.0, yet the neighbours kept are the
    float64 top s of the sampled rows, every one."""
    generator = np.random.default_rng(11)
    angles = generator.uniform(0.0, 1e-2, 50_000)
    radii = generator.uniform(0.5, 5.0, 50_000)
    h = torch.from_numpy(np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1).astype(np.float32))
    graph = discover_pseudo_graph(h, 10, similarity="cosine", backend="planar")
    rows = recall_rows(50_000, 300, seed=0)
    assert sampled_recall(h, "cosine", rows, graph.neighbors[rows]) == (1.0, 1.0)


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_float64_embeddings_are_ranked_in_float64(similarity: str) -> None:
    """Decrypted sums arrive as float64; customers with the same features differ only by the decryption's
    noise, far below float32's resolution. The planar search ranks what it was given, so its neighbours are
    the float64 top s."""
    generator = np.random.default_rng(2)
    centres = generator.standard_normal((100, 2)) * 3
    h = torch.from_numpy(centres[generator.integers(0, 100, 40_000)] + 1e-8 * generator.standard_normal((40_000, 2)))
    graph = discover_pseudo_graph(h, 10, similarity=similarity, backend="planar")
    rows = recall_rows(40_000, 300, seed=0)
    assert sampled_recall(h, similarity, rows, graph.neighbors[rows]) == (1.0, 1.0)


def test_overflowing_dot_similarities_raise_instead_of_returning_inf() -> None:
    with pytest.raises(ConfigError, match="overflow float32"):
        discover_pseudo_graph(torch.full((5, 2), 1e30), 2, similarity="dot", backend="planar")
