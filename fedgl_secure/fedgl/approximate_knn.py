"""Approximate top-s inner-product neighbours in linear time: an inverted file searched list by list.

Exact search is ``O(M² D)``; a consortium's union index reaches millions of rows, where that is
hours. This backend keeps the work per row constant, so a round's pseudo graph grows linearly with
``M`` (what ``benchmarks/consortium_scale.py`` measures from 100k to 1M customers per bank):

1. **Lists.** The rows' directions (L2-normalised) are clustered by spherical k-means into
   ``nlist = M / LIST_SIZE`` lists — a fixed list size, not a fixed list count, is what makes the
   search linear. Clustering directions means a few high-norm rows (``dot``) neither drag the
   centroids nor crowd one list.
2. **Probes.** Each list is searched against the ``nprobe`` lists whose centroids are most similar
   to its own (itself first): a fixed number of candidate rows per query.
3. **Search.** All queries of one list share the same candidates, so a list is one dense
   ``queries x candidates`` product and one ``topk`` — BLAS/GPU-shaped work, the same code on a
   CPU and on CUDA, rather than a per-query scan.

Lists whose probes hold too few rows for ``s`` neighbours are searched exactly. Randomness (the
k-means sample and start) comes from a fixed seed, so the same input on the same device gives the
same graph. Recall of the exact top-s on clustered embeddings is measured by
``benchmarks/pseudo_graph.py --backend ivf --recall-sample N`` (docs/results/).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

import torch

# Rows per list. With NPROBE lists probed, every query scores ~LIST_SIZE * NPROBE = 8192
# candidates: ~0.99 recall of the exact top-10 and top-100 on clustered rows (50 centres).
LIST_SIZE = 512
MIN_NPROBE = 16
# Probe enough lists to expect at least this many candidates per wanted neighbour.
CANDIDATES_PER_NEIGHBOR = 4
KMEANS_ROWS_PER_LIST = 32
KMEANS_ITERATIONS = 8
SEED = 0
# Rows whose scores against the centroids (or against the whole index, for the exact fallback)
# are computed at once: bounds the working set of those products.
_BLOCK_SCORES = 2**24


@dataclass(frozen=True)
class IvfPlan:
    """How ``M`` rows are searched: list count, lists probed per query, k-means sample and rounds."""

    nlist: int
    nprobe: int
    train_rows: int
    iterations: int

    @property
    def candidates_per_query(self) -> int:
        """Expected candidate rows each query is scored against."""
        return self.nprobe * LIST_SIZE


def ivf_plan(m: int, s: int) -> IvfPlan:
    """The plan for ``M = m`` rows and ``s`` neighbours: lists of ~``LIST_SIZE`` rows, at least
    ``MIN_NPROBE`` probes and enough to expect ``CANDIDATES_PER_NEIGHBOR * (s + 1)`` candidates."""
    nlist = max(1, round(m / LIST_SIZE))
    wanted = math.ceil(CANDIDATES_PER_NEIGHBOR * (s + 1) / LIST_SIZE)
    nprobe = min(nlist, max(MIN_NPROBE, wanted))
    return IvfPlan(nlist, nprobe, min(m, KMEANS_ROWS_PER_LIST * nlist), KMEANS_ITERATIONS)


def nearest_centroid(directions: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of the most similar centroid (inner product) of each row, in bounded blocks."""
    assignment = torch.empty(directions.shape[0], dtype=torch.int64, device=directions.device)
    step = max(1, _BLOCK_SCORES // max(1, centroids.shape[0]))
    centroids_t = centroids.t().contiguous()
    for start in range(0, directions.shape[0], step):
        assignment[start : start + step] = (directions[start : start + step] @ centroids_t).argmax(dim=1)
    return assignment


def spherical_kmeans(directions: torch.Tensor, k: int, iterations: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` unit centroids of unit rows (Lloyd's iterations on cosine similarity).

    Starts from ``k`` distinct random rows; a centroid that loses all its rows keeps its place
    rather than becoming undefined.
    """
    start = torch.randperm(directions.shape[0], generator=generator)[:k].to(directions.device)
    centroids = directions[start].clone()
    for _ in range(iterations):
        assignment = nearest_centroid(directions, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, directions)
        norms = sums.norm(dim=1, keepdim=True)
        centroids = torch.where(norms > 0, sums / norms.clamp_min(torch.finfo(sums.dtype).tiny), centroids)
    return centroids


def ivf_top_s(
    h: torch.Tensor, s: int, plan: IvfPlan
) -> Generator[tuple[torch.Tensor, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(row ids, neighbour ids, similarities)`` per list: each row's approximate top ``s``
    other rows by inner product ``h_i · h_j``, sorted by decreasing similarity, on ``h``'s device.

    ``s`` must be below ``M``. Rows come in list order, not in index order; every row appears once.
    """
    m = h.shape[0]
    device = h.device
    directions = torch.nn.functional.normalize(h, p=2.0, dim=1)
    generator = torch.Generator().manual_seed(SEED)
    sample = torch.randperm(m, generator=generator)[: plan.train_rows].to(device)
    centroids = spherical_kmeans(directions[sample], plan.nlist, plan.iterations, generator)
    del sample
    assignment = nearest_centroid(directions, centroids)
    del directions
    order = torch.argsort(assignment, stable=True)
    offsets = torch.zeros(plan.nlist + 1, dtype=torch.int64)
    offsets[1:] = torch.bincount(assignment, minlength=plan.nlist).cpu().cumsum(0)
    del assignment
    affinity = centroids @ centroids.t()
    affinity.fill_diagonal_(float("inf"))  # a list always probes itself first
    probes = affinity.topk(plan.nprobe, dim=1).indices.cpu()
    del affinity
    grouped = h[order]  # rows list by list: a list is a contiguous slice
    bounds = offsets.tolist()
    for c in range(plan.nlist):
        first, stop = bounds[c], bounds[c + 1]
        if first == stop:
            continue
        candidates = torch.cat([torch.arange(bounds[p], bounds[p + 1]) for p in probes[c].tolist()]).to(device)
        queries = grouped[first:stop]
        rows = order[first:stop]
        if candidates.numel() <= s:  # too few rows around this list: search it exactly
            yield (rows, *_exact_top_s(queries, rows, h, s))
            continue
        scores = queries @ grouped[candidates].t()
        # the list's own rows sit at the start of its candidates (it probes itself first)
        own = torch.arange(stop - first, device=device)
        scores[own, own] = float("-inf")
        values, columns = torch.topk(scores, s, dim=1)
        yield rows, order[candidates[columns]], values


def _exact_top_s(
    queries: torch.Tensor, rows: torch.Tensor, h: torch.Tensor, s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``(neighbour ids, similarities)`` of a few rows against all of ``h`` (self excluded)."""
    scores = queries @ h.t()
    scores[torch.arange(rows.shape[0], device=h.device), rows] = float("-inf")
    values, ids = torch.topk(scores, s, dim=1)
    return ids, values
