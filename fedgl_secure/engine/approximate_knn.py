"""Approximate top-s inner-product neighbours in linear time: an inverted file searched list by list.

Exact search is ``O(M² D)``; a consortium's union index reaches millions of rows, where that is
hours. This backend keeps the work per row constant, so a round's pseudo graph grows linearly with
``M`` (what ``benchmarks/consortium_scale.py`` measures from 100k to 1M customers per bank):

1. **Lists.** The rows' directions (L2-normalised) are clustered by spherical k-means into
   ``nlist = M / LIST_SIZE`` lists — a fixed list size, not a fixed list count, is what makes the
   search linear — in two levels (``√nlist`` groups, then lists within each group), so that
   assigning ``M`` rows costs ``M x 2√nlist`` similarities rather than ``M x nlist``. Clustering
   directions means a few high-norm rows (``dot``) neither drag the centroids nor crowd one list.
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

# Rows per list. With MIN_NPROBE lists probed, every query scores ~LIST_SIZE * MIN_NPROBE = 16384
# candidates. Measured on 10^6 clustered rows (50 centres, D = 16, cosine; docs/results/
# pseudo_graph_cuda.json): recall of the exact top-100 0.98 here, 0.72 with 512 x 16 (8192
# candidates), 0.99 with 128 x 128 at 2.5x the time.
LIST_SIZE = 256
MIN_NPROBE = 64
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
    return top_centroids(directions, centroids, 1).squeeze(1)


def spherical_kmeans(directions: torch.Tensor, k: int, iterations: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` unit centroids of unit rows (Lloyd's iterations on cosine similarity).

    Starts from ``k`` distinct random rows (``k`` at most the row count); a centroid that loses all
    its rows keeps its place rather than becoming undefined.
    """
    start = torch.randperm(directions.shape[0], generator=generator)[:k].to(directions.device)
    centroids = directions[start].clone()
    for _ in range(iterations):
        assignment = nearest_centroid(directions, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, directions)
        norms = sums.norm(dim=1, keepdim=True)
        centroids = torch.where(norms > 0, sums / norms.clamp_min(torch.finfo(sums.dtype).tiny), centroids)
    return centroids


@dataclass(frozen=True)
class InvertedLists:
    """Rows grouped into lists, and which lists each list is searched against.

    Attributes:
        order: all row ids, list by list (list ``c`` is ``order[offsets[c]:offsets[c + 1]]``).
        offsets: ``count + 1`` bounds into ``order``.
        probes: ``count x nprobe`` list ids per list, most similar centroid first, itself first of all.
    """

    order: torch.Tensor
    offsets: list[int]
    probes: torch.Tensor

    @property
    def count(self) -> int:
        return len(self.offsets) - 1


def build_inverted_lists(h: torch.Tensor, plan: IvfPlan) -> InvertedLists:
    """Partition the rows of ``h`` by direction into ~``plan.nlist`` lists in two levels.

    One level of ``nlist`` centroids would cost ``M x nlist`` similarities to assign the rows, as
    much as exact search once ``nlist`` grows with ``M``. So ~``√nlist`` coarse groups are found
    first (spherical k-means on a sample), each group is split into sub-centroids in proportion to
    its share of the sample, and every row is assigned to its coarse group, then to the nearest
    sub-centroid of that group: ``M x 2√nlist`` similarities. A row near a group border may land in
    a list whose centroid is not its globally nearest; probing neighbouring lists covers that.
    """
    m = h.shape[0]
    device = h.device
    directions = torch.nn.functional.normalize(h, p=2.0, dim=1)
    generator = torch.Generator().manual_seed(SEED)
    sample = directions[torch.randperm(m, generator=generator)[: plan.train_rows].to(device)]
    groups = spherical_kmeans(sample, max(1, round(math.sqrt(plan.nlist))), plan.iterations, generator)
    sample_group = nearest_centroid(sample, groups)
    sizes = torch.bincount(sample_group, minlength=groups.shape[0]).cpu()
    kept = torch.nonzero(sizes).squeeze(1)  # a group no sample row chose has no lists
    groups, sizes = groups[kept.to(device)], sizes[kept]
    sample_group = torch.searchsorted(kept.to(device), sample_group)
    centroids = []
    for g, size in enumerate(sizes.tolist()):
        members = sample[sample_group == g]
        lists = min(size, max(1, round(plan.nlist * size / plan.train_rows)))
        centroids.append(spherical_kmeans(members, lists, plan.iterations, generator))
    del sample, sample_group
    first_list = [0, *torch.tensor([c.shape[0] for c in centroids]).cumsum(0).tolist()]
    # each row looks in its two most similar groups: a row near a group border then still finds the
    # list it is closest to (measured: with one group, recall of the top-100 fell as M grew)
    row_groups = top_centroids(directions, groups, min(2, groups.shape[0]))
    assignment = torch.empty(m, dtype=torch.int64, device=device)
    best = torch.full((m,), float("-inf"), device=device)
    for g, sub_centroids in enumerate(centroids):
        rows = torch.nonzero((row_groups == g).any(dim=1)).squeeze(1)
        score, nearest = (directions[rows] @ sub_centroids.t()).max(dim=1)
        better = score > best[rows]
        best[rows[better]] = score[better]
        assignment[rows[better]] = first_list[g] + nearest[better]
    del directions, row_groups, best
    order = torch.argsort(assignment, stable=True)
    assignment, centroids_per_list = split_oversized_lists(assignment[order], torch.cat(centroids))
    count = centroids_per_list.shape[0]
    offsets = [0, *torch.bincount(assignment, minlength=count).cpu().cumsum(0).tolist()]
    probes = top_centroids(centroids_per_list, centroids_per_list, min(plan.nprobe, count), own_first=True).cpu()
    return InvertedLists(order, offsets, probes)


def split_oversized_lists(sorted_lists: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut every list of more than ``LIST_SIZE`` rows into near-equal pieces of at most ``LIST_SIZE`` rows.

    Rows sharing one direction — all-zero embeddings (a ReLU layer's dead rows), duplicated
    customers — land in one list however many there are; searched as one list against its probes
    that costs (list size)², which put 198,000 rows in one list and a 2 TB score block at 2.5M
    nodes; and k-means lists in dense regions run to twice the mean size, which dense regions'
    probes then pay for again (a 10x larger index took 18x the time). Pieces keep the list's
    centroid, so they probe each other, and every row is scored against at most
    ``nprobe * LIST_SIZE`` candidates. ``sorted_lists`` is each row's list id in ascending order (rows already grouped);
    returns the new ids (still ascending) and one centroid per new list.
    """
    counts = torch.bincount(sorted_lists, minlength=centroids.shape[0])
    pieces = torch.div(counts + LIST_SIZE - 1, LIST_SIZE, rounding_mode="floor").clamp(min=1)
    first_piece = pieces.cumsum(0) - pieces
    list_start = counts.cumsum(0) - counts
    position = torch.arange(sorted_lists.shape[0], device=sorted_lists.device) - list_start[sorted_lists]
    piece_size = torch.div(counts + pieces - 1, pieces, rounding_mode="floor").clamp(min=1)
    piece = torch.div(position, piece_size[sorted_lists], rounding_mode="floor")
    return first_piece[sorted_lists] + piece, centroids.repeat_interleave(pieces, dim=0)


def top_centroids(rows: torch.Tensor, centroids: torch.Tensor, k: int, own_first: bool = False) -> torch.Tensor:
    """The ``k`` most similar centroids of each row (inner product), in bounded blocks; with
    ``own_first`` row ``i`` is centroid ``i`` and comes first in its own list."""
    top = torch.empty((rows.shape[0], k), dtype=torch.int64, device=rows.device)
    step = max(1, _BLOCK_SCORES // max(1, centroids.shape[0]))
    centroids_t = centroids.t().contiguous()
    for start in range(0, rows.shape[0], step):
        scores = rows[start : start + step] @ centroids_t
        if own_first:
            local = torch.arange(scores.shape[0], device=rows.device)
            scores[local, start + local] = float("inf")
        top[start : start + step] = scores.topk(k, dim=1).indices
    return top


def search_lists(
    h: torch.Tensor, s: int, lists: InvertedLists
) -> Generator[tuple[torch.Tensor, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(row ids, neighbour ids, similarities)`` per list: each row's approximate top ``s``
    other rows by inner product ``h_i · h_j``, sorted by decreasing similarity, on ``h``'s device.

    ``s`` must be below ``M``. Rows come in list order, not in index order; every row appears once.
    """
    device = h.device
    order, bounds = lists.order, lists.offsets
    grouped = h[order]  # rows list by list: a list is a contiguous slice
    for c in range(lists.count):
        first, stop = bounds[c], bounds[c + 1]
        if first == stop:
            continue
        candidates = torch.cat([torch.arange(bounds[p], bounds[p + 1]) for p in lists.probes[c].tolist()]).to(device)
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
