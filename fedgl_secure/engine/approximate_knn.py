"""Approximate top-s neighbours for Eq. 15 in linear time: an inverted file probed per small group of rows.

Eq. 15 keeps, per row ``i`` of ``H̄`` (``M x D``), the ``s`` largest similarities ``h_i · h_j``
(``j ≠ i``; ``cosine`` normalises the rows first). Exact search is ``O(M² D)``: hours at
``2.5·10^6`` rows on a CPU. This index keeps the work per row constant:

1. **Keys.** Search becomes a cosine search on unit *keys*. For ``cosine`` a row's key is the row
   (already unit). For ``dot`` (maximum inner product) the standard MIPS reduction: a row is stored
   as ``[h/Φ, √(1 - ‖h‖²/Φ²)]`` (``Φ`` the largest norm) and queried as ``[h/‖h‖, 0]``, so that the
   query key's inner product with a stored key is ``h_i · h_j / (‖h_i‖ Φ)``: the order of ``dot``,
   with high-norm rows placed near the queries that rank them first instead of among rows of the
   same direction only (the direction-only lists lost 90 % of the neighbours at 10^7 rows,
   docs/results/pseudo_graph_cuda.json).
2. **Lists.** Stored keys are clustered by spherical k-means into ``M / LIST_SIZE`` lists in two
   levels (``√nlist`` groups, then lists within each group), so assigning ``M`` rows costs
   ``M x 3√nlist`` similarities, not ``M x nlist``; lists above ``LIST_SIZE`` rows (duplicated or
   all-zero rows) are cut into pieces.
3. **Probes, per row.** Each query key ranks the lists nearest its own list (the ``2 x depth``
   most similar centroids to its list's) and chooses the most similar until they hold
   ``candidates`` rows (``CANDIDATES`` or ``CANDIDATES_PER_NEIGHBOR x (s + 1)``, more for ``dot``,
   with a hub list of the highest-norm rows first for ``dot``), never fewer than ``s + 1``.
   Probes chosen per group of rows instead (by the group's centre), as this module did before,
   lose the rows at a group's border: in 16 dimensions most rows are near one (recall of the
   top-100, cosine, 10^6 clustered rows: 0.86 even after NN-descent refinement).
4. **Query groups.** Rows are sorted by their first three lists and cut into groups of
   ``GROUP_SIZE``; a group scans the union of its rows' lists, each list scored only against the
   rows that chose it (a bit mask per probe), so every row is searched over exactly its own lists
   while a list's columns are loaded once for the whole group.
5. **Search.** On a CPU with numba, ``probed_knn``'s kernel scores each group's rows against its
   lists tile by tile in L1; otherwise (CUDA, or no numba) a torch product and ``topk`` per group.
   Both compute the exact similarity of every candidate, so only the candidate sets approximate.

Randomness (k-means samples and starts) comes from ``SEED``, so the same input on the same device
gives the same graph. Recall of the exact top-s is measured by ``benchmarks/pseudo_graph.py
--recall-sample N`` (docs/results/pseudo_graph_2_5m.json, pseudo_graph_10m.json).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

# Stored rows per list. Larger lists mean fewer, longer runs per probe (less padding, fewer
# centroids to rank) but a coarser choice of candidates; measured on 10^6 clustered rows, lists of
# ~1,000 and of ~250 rows need the same number of candidates for the same recall.
LIST_SIZE = 1024
# Query rows per group: one kernel block (fused_knn.BLOCK), so a group's rows share every column
# chunk the kernel loads.
GROUP_SIZE = 64
# Candidate rows per query row, cosine (direction) search and dot (MIPS) search, and never fewer
# than CANDIDATES_PER_NEIGHBOR per wanted neighbour. 16-dimensional Gaussian clusters are the
# hardest case (every row's neighbourhood is truly 16-dimensional); measured there at 10^6 rows,
# cosine: s = 100 with 12,120 candidates 0.975, s = 10 with 4,096 0.82.
CANDIDATES = 10240
CANDIDATES_MIPS = 16384
CANDIDATES_PER_NEIGHBOR = 120
# dot: this share of each row's candidates are the rows of the largest norms (hubs), scanned by
# every group. A few high-norm rows are the top-s of nearly every row under dot (DESIGN §3: one
# node was the neighbour of 2,673 of Cora's 2,708), and k-means on MIPS keys scatters them into
# lists dominated by ordinary rows, whose centroids no query ranks high (measured: recall 0.67 for
# 30 hubs among 3,000 rows without this, 1.0 with).
HUB_SHARE = 0.25
KMEANS_ROWS_PER_LIST = 32
KMEANS_ITERATIONS = 8
SEED = 0
# Rows whose scores against centroids are computed at once: bounds those products' working set.
_BLOCK_SCORES = 2**24
# Query groups per kernel call: bounds the results held at once and gives the progress bar steps.
_GROUPS_PER_STEP = 256


@dataclass(frozen=True)
class IvfPlan:
    """How ``M`` rows are searched: lists, candidates per row, k-means sample and rounds."""

    nlist: int
    candidates: int
    train_rows: int
    iterations: int
    mips: bool
    hubs: int

    @property
    def candidates_per_query(self) -> int:
        """Candidate rows each query row is scored against (at least; whole lists are scanned)."""
        return self.candidates


def ivf_plan(m: int, s: int, mips: bool = False) -> IvfPlan:
    """The plan for ``M = m`` rows and ``s`` neighbours; ``mips`` for ``dot`` similarity."""
    nlist = max(1, round(m / LIST_SIZE))
    base = CANDIDATES_MIPS if mips else CANDIDATES
    candidates = min(m, max(base, CANDIDATES_PER_NEIGHBOR * (s + 1)))
    # Hubs only while the other rows can still fill a group's s + 1 candidates.
    hubs = min(int(HUB_SHARE * candidates), m - s - 1) if mips and m > 2 * (s + 1) else 0
    return IvfPlan(nlist, candidates, min(m, KMEANS_ROWS_PER_LIST * nlist), KMEANS_ITERATIONS, mips, max(hubs, 0))


def search_keys(h: torch.Tensor, mips: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit ``(stored keys, query keys)`` whose inner products order the candidates as ``h``'s
    inner products do (MIPS reduction for ``mips``; see the module docstring). Zero rows get zero keys."""
    if not mips:
        keys = torch.nn.functional.normalize(h, p=2.0, dim=1)
        return keys, keys
    norms = h.norm(dim=1, keepdim=True)
    phi = norms.max().clamp_min(torch.finfo(h.dtype).tiny)
    lift = (1 - (norms / phi).square()).clamp_min(0).sqrt()
    stored = torch.cat([h / phi, lift], dim=1)
    query = torch.cat([torch.nn.functional.normalize(h, p=2.0, dim=1), torch.zeros_like(lift)], dim=1)
    return stored, query


def nearest_centroid(directions: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of the most similar centroid (inner product) of each row, in bounded blocks."""
    nearest = torch.empty(directions.shape[0], dtype=torch.int64, device=directions.device)
    step = max(1, _BLOCK_SCORES // max(1, centroids.shape[0]))
    centroids_t = centroids.t().contiguous()
    for start in range(0, directions.shape[0], step):
        nearest[start : start + step] = (directions[start : start + step] @ centroids_t).argmax(dim=1)
    return nearest


def cluster_sums(rows: torch.Tensor, assignment: torch.Tensor, k: int) -> torch.Tensor:
    """``k x D`` sums of the rows assigned to each cluster.

    A one-hot product, not ``index_add_``: on a CPU the latter took ~36 ms per call for a few
    thousand rows (measured, 2 busy cores), two thirds of building the index.
    """
    sums = torch.zeros((k, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    step = max(1, _BLOCK_SCORES // max(1, k))
    for start in range(0, rows.shape[0], step):
        part = assignment[start : start + step]
        one_hot = torch.zeros((k, part.shape[0]), dtype=rows.dtype, device=rows.device)
        one_hot[part, torch.arange(part.shape[0], device=rows.device)] = 1
        sums += one_hot @ rows[start : start + step]
    return sums


def spherical_kmeans(directions: torch.Tensor, k: int, iterations: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` unit centroids of unit rows (Lloyd's iterations on cosine similarity).

    Starts from ``k`` distinct random rows (``k`` at most the row count); a centroid that loses all
    its rows keeps its place rather than becoming undefined.
    """
    start = torch.randperm(directions.shape[0], generator=generator)[:k].to(directions.device)
    centroids = directions[start].clone()
    for _ in range(iterations):
        assignment = nearest_centroid(directions, centroids)
        sums = cluster_sums(directions, assignment, centroids.shape[0])
        norms = sums.norm(dim=1, keepdim=True)
        centroids = torch.where(norms > 0, sums / norms.clamp_min(torch.finfo(sums.dtype).tiny), centroids)
    return centroids


@dataclass(frozen=True)
class Coarse:
    """Two-level centroids: ``groups`` (``√nlist``) and each group's lists, ``lists[first[g]:first[g + 1]]``."""

    groups: torch.Tensor
    lists: torch.Tensor
    first: list[int]

    def assign(self, keys: torch.Tensor) -> torch.Tensor:
        """Each key's list: the most similar list centroid within its two most similar groups."""
        m = keys.shape[0]
        row_groups = top_centroids(keys, self.groups, min(2, self.groups.shape[0]))
        assignment = torch.zeros(m, dtype=torch.int64, device=keys.device)
        best = torch.full((m,), float("-inf"), device=keys.device)
        for g in range(self.groups.shape[0]):
            rows = torch.nonzero((row_groups == g).any(dim=1)).squeeze(1)
            score, nearest = (keys[rows] @ self.lists[self.first[g] : self.first[g + 1]].t()).max(dim=1)
            better = score > best[rows]
            best[rows[better]] = score[better]
            assignment[rows[better]] = self.first[g] + nearest[better]
        return assignment


def train_coarse(keys: torch.Tensor, plan: IvfPlan, generator: torch.Generator) -> Coarse:
    """``√nlist`` groups by spherical k-means on a sample, each split into lists in proportion to its share."""
    m = keys.shape[0]
    sample = keys[torch.randperm(m, generator=generator)[: plan.train_rows].to(keys.device)]
    groups = spherical_kmeans(sample, max(1, round(math.sqrt(plan.nlist))), plan.iterations, generator)
    sample_group = nearest_centroid(sample, groups)
    sizes = torch.bincount(sample_group, minlength=groups.shape[0]).cpu()
    kept = torch.nonzero(sizes).squeeze(1)  # a group no sample row chose has no lists
    groups, sizes = groups[kept.to(keys.device)], sizes[kept]
    sample_group = torch.searchsorted(kept.to(keys.device), sample_group)
    lists = []
    for g, size in enumerate(sizes.tolist()):
        members = sample[sample_group == g]
        count = min(size, max(1, round(plan.nlist * size / plan.train_rows)))
        lists.append(spherical_kmeans(members, count, plan.iterations, generator))
    first = [0, *torch.tensor([c.shape[0] for c in lists]).cumsum(0).tolist()]
    return Coarse(groups, torch.cat(lists), first)


def pieces_per_list(counts: torch.Tensor) -> torch.Tensor:
    """Pieces ``split_oversized_lists`` cuts lists of these sizes into (an empty list keeps one)."""
    return torch.div(counts + LIST_SIZE - 1, LIST_SIZE, rounding_mode="floor").clamp(min=1)


def split_oversized_lists(sorted_lists: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut every list of more than ``LIST_SIZE`` rows into near-equal pieces of at most ``LIST_SIZE`` rows.

    Rows sharing one direction — all-zero embeddings (a ReLU layer's dead rows), duplicated
    customers — land in one list however many there are, and k-means lists in dense regions run
    to twice the mean size; every group probing such a list would pay for all of it. Pieces keep
    the list's centroid, so they rank equally and are probed together. ``sorted_lists`` is each
    row's list id in ascending order; returns the new ids (still ascending) and one centroid per
    new list.
    """
    counts = torch.bincount(sorted_lists, minlength=centroids.shape[0])
    pieces = pieces_per_list(counts)
    first_piece = pieces.cumsum(0) - pieces
    list_start = counts.cumsum(0) - counts
    position = torch.arange(sorted_lists.shape[0], device=sorted_lists.device) - list_start[sorted_lists]
    piece_size = torch.div(counts + pieces - 1, pieces, rounding_mode="floor").clamp(min=1)
    piece = torch.div(position, piece_size[sorted_lists], rounding_mode="floor")
    return first_piece[sorted_lists] + piece, centroids.repeat_interleave(pieces, dim=0)


def top_centroids(rows: torch.Tensor, centroids: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` most similar centroids of each row (inner product), most similar first, in bounded blocks."""
    top = torch.empty((rows.shape[0], k), dtype=torch.int64, device=rows.device)
    step = max(1, _BLOCK_SCORES // max(1, centroids.shape[0]))
    centroids_t = centroids.t().contiguous()
    for start in range(0, rows.shape[0], step):
        top[start : start + step] = (rows[start : start + step] @ centroids_t).topk(k, dim=1).indices
    return top


@dataclass(frozen=True)
class InvertedIndex:
    """Stored rows in lists and query rows in groups, with each group's probed lists.

    Attributes:
        order: stored row ids list by list (list ``c`` is ``order[offsets[c]:offsets[c + 1]]``).
        offsets: ``lists + 1`` bounds into ``order``.
        group_rows: query row ids group by group (group ``g`` is ``group_rows[group_offsets[g]:...]``).
        group_offsets: ``groups + 1`` bounds into ``group_rows``.
        probe_offsets, probes: group ``g`` scans lists ``probes[probe_offsets[g]:probe_offsets[g + 1]]``,
            most similar first.
    """

    order: torch.Tensor
    offsets: np.ndarray
    group_rows: torch.Tensor
    group_offsets: np.ndarray
    probe_offsets: np.ndarray
    probes: np.ndarray
    probe_masks: np.ndarray

    @property
    def count(self) -> int:
        """Number of lists."""
        return len(self.offsets) - 1

    @property
    def groups(self) -> int:
        """Number of query groups."""
        return len(self.group_offsets) - 1


def build_index(h: torch.Tensor, plan: IvfPlan, s: int) -> InvertedIndex:
    """Lists, query groups and probes for the rows of ``h`` (see the module docstring).

    With ``plan.hubs`` the rows of the largest norms form list 0, which every group scans first.
    """
    m = h.shape[0]
    generator = torch.Generator().manual_seed(SEED)
    stored, queries = search_keys(h, plan.mips)
    rest = torch.arange(m, device=h.device)
    if plan.hubs:
        by_norm = torch.argsort(h.norm(dim=1), descending=True, stable=True)
        hubs, rest = torch.sort(by_norm[: plan.hubs]).values, torch.sort(by_norm[plan.hubs :]).values
    coarse = train_coarse(stored[rest], plan, generator)
    home = coarse.assign(stored[rest])
    order = rest[torch.argsort(home, stable=True)]
    sorted_home = torch.sort(home).values
    pieces, _ = split_oversized_lists(sorted_home, coarse.lists)
    nlist = coarse.lists.shape[0]
    list_sizes = torch.bincount(home, minlength=nlist)
    first_piece = np.concatenate([[0], pieces_per_list(list_sizes).cumsum(0).cpu().numpy()])
    sizes = torch.bincount(pieces, minlength=int(first_piece[-1])).cpu().numpy()
    list_sizes = list_sizes.cpu().numpy()
    del stored, sorted_home, pieces
    if plan.mips or plan.hubs:
        query_home = coarse.assign(queries)
    else:
        query_home = torch.empty(m, dtype=torch.int64, device=h.device)
        query_home[rest] = home
    del home
    wanted = min(max(plan.candidates, s + 1) - plan.hubs, m - plan.hubs)
    chosen = row_probes(queries, query_home, coarse.lists, list_sizes, wanted)
    del query_home, queries
    group_rows, group_offsets, probe_offsets, probes, masks = group_by_probes(chosen, nlist)
    del chosen
    probe_offsets, probes, masks = expand_pieces(probe_offsets, probes, masks, first_piece)
    keep = sizes[probes] > 0  # empty pieces (a list no row chose as its home) cost a loop turn each
    group = np.repeat(np.arange(len(probe_offsets) - 1), np.diff(probe_offsets))
    probe_offsets = offsets_of(group[keep], probe_offsets)
    probes, masks = probes[keep], masks[keep]
    if plan.hubs:  # list 0: the hubs, first in every group's probes, for all its rows
        order = torch.cat([hubs, order])
        sizes = np.concatenate([[plan.hubs], sizes])
        groups = len(probe_offsets) - 1
        probes = np.insert(probes + 1, probe_offsets[:-1], 0)
        masks = np.insert(masks, probe_offsets[:-1], -1)
        probe_offsets = probe_offsets + np.arange(groups + 1)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return InvertedIndex(order, offsets, torch.from_numpy(group_rows), group_offsets, probe_offsets, probes, masks)


def row_probes(
    queries: torch.Tensor, home: torch.Tensor, centroids: torch.Tensor, sizes: np.ndarray, wanted: int
) -> np.ndarray:
    """Each query row's lists, most similar centroid first, until they hold ``wanted`` rows (all lists
    when no fewer reach it): ``M x width`` list ids, -1 after a row's last.

    A row ranks only the lists nearest its home list (``home``), not all ``nlist``: at 10^7 rows
    ranking every centroid would cost more than the search.
    """
    count = centroids.shape[0]
    mean = float(sizes[sizes > 0].mean())
    depth = min(count, 2 * math.ceil(wanted / mean) + 8)
    near = top_centroids(centroids, centroids, min(count, 2 * depth))
    m = queries.shape[0]
    out = np.full((m, depth), -1, dtype=np.int32)
    sizes_t = torch.from_numpy(sizes.astype(np.int64)).to(queries.device)
    step = max(1, _BLOCK_SCORES // max(1, near.shape[1] * queries.shape[1]))
    short = []
    for start in range(0, m, step):
        candidates = near[home[start : start + step]]
        scores = torch.einsum("bd,brd->br", queries[start : start + step], centroids[candidates])
        ranked = candidates.gather(1, scores.topk(depth, dim=1).indices)
        held = sizes_t[ranked].cumsum(1)
        take = ((held < wanted).sum(dim=1) + 1).clamp(max=depth)
        columns = torch.arange(depth, device=queries.device)
        out[start : start + step] = torch.where(columns < take[:, None], ranked, -1).cpu().numpy()
        short.append(torch.nonzero(held[:, -1] < wanted).squeeze(1).cpu().numpy() + start)
    short = np.concatenate(short)
    if len(short):  # too few rows among the nearest lists (tiny lists): every list, nearest first
        ranked = top_centroids(queries[torch.from_numpy(short).to(queries.device)], centroids, count).cpu().numpy()
        out = np.concatenate([out, np.full((m, count - depth), -1, dtype=np.int32)], axis=1)
        held = np.cumsum(sizes[ranked], axis=1)
        take = np.minimum((held < wanted).sum(axis=1) + 1, count)
        out[short] = np.where(np.arange(count) < take[:, None], ranked, -1)
    return out


def group_by_probes(probes: np.ndarray, nlist: int) -> tuple[np.ndarray, ...]:
    """Query groups of ``GROUP_SIZE`` rows that chose similar lists, and each group's union of them.

    Rows are sorted by their first three lists, so a group's rows share most of theirs; the group
    scans the union, each list (``probe_masks``: bit ``j`` for the group's row ``j``) scored only
    against the rows that chose it, so every row is searched exactly over its own lists. Returns
    ``(group_rows, group_offsets, probe_offsets, probes, probe_masks)``, a group's lists ordered by
    how many of its rows chose them (the threshold then rises early).
    """
    m = probes.shape[0]
    keys = [probes[:, c] for c in range(min(3, probes.shape[1]) - 1, -1, -1)]
    group_rows = np.lexsort(keys) if keys else np.arange(m)
    group_offsets = np.minimum(np.arange(-(-m // GROUP_SIZE) + 1) * GROUP_SIZE, m)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    step = GROUP_SIZE * 4096  # bounds the (row, list) pairs sorted at once
    for first in range(0, m, step):
        chosen = probes[group_rows[first : first + step]]
        row = np.arange(chosen.shape[0])[:, None]
        valid = chosen >= 0
        group = (first + row) // GROUP_SIZE
        key = (np.broadcast_to(group, chosen.shape)[valid].astype(np.int64) * nlist + chosen[valid]).ravel()
        bit = np.left_shift(np.int64(1), np.broadcast_to(row % GROUP_SIZE, chosen.shape)[valid].astype(np.int64))
        order = np.argsort(key, kind="stable")
        key, bit = key[order], bit[order]
        starts = np.flatnonzero(np.diff(key, prepend=-1))
        unique = key[starts]
        masks = np.bitwise_or.reduceat(bit, starts)
        counts = np.diff(np.append(starts, len(key)))
        groups, lists = unique // nlist, unique % nlist
        order = np.lexsort((lists, -counts, groups))
        parts.append((groups[order], lists[order], masks[order]))
    groups, lists, masks = (np.concatenate(p) for p in zip(*parts, strict=True))
    probe_offsets = offsets_of(groups, group_offsets)
    return group_rows, group_offsets, probe_offsets, lists, masks


def expand_pieces(
    probe_offsets: np.ndarray, probes: np.ndarray, masks: np.ndarray, first_piece: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probes of lists as probes of their pieces (``split_oversized_lists``), each with its list's mask."""
    pieces = np.diff(first_piece)[probes]
    within = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    expanded = np.repeat(first_piece[probes], pieces) + within
    group = np.repeat(np.arange(len(probe_offsets) - 1), np.diff(probe_offsets))
    return offsets_of(np.repeat(group, pieces), probe_offsets), expanded, np.repeat(masks, pieces)


def offsets_of(group: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Bounds of each group's entries given each entry's (ascending) group, for ``len(like) - 1`` groups."""
    return np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(like) - 1))]).astype(np.int64)


def search_index(
    h: torch.Tensor,
    s: int,
    index: InvertedIndex,
    kernel_context: Callable[[], AbstractContextManager[None]] | None = None,
) -> Generator[tuple[torch.Tensor, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(row ids, neighbour ids, similarities)`` per step of groups: each row's approximate top
    ``s`` other rows by ``h_i · h_j``, sorted by decreasing similarity, every row exactly once.

    On a CPU with numba the fused ``probed_knn`` kernel runs (inside ``kernel_context()``, which
    sets its threads); elsewhere a torch product per group on ``h``'s device.
    """
    kernel = _import_kernel() if h.device.type == "cpu" else None
    if kernel is not None:
        yield from _kernel_search(kernel, h, s, index, kernel_context or nullcontext)
    else:
        yield from _torch_search(h, s, index)


def steps(index: InvertedIndex) -> int:
    """Progress steps ``search_index`` yields."""
    return -(-index.groups // _GROUPS_PER_STEP)


def _kernel_search(kernel, h, s, index, kernel_context):
    points = h.contiguous().numpy()
    lists = kernel.pack_lists(points, index.order.numpy(), index.offsets)
    blocks = kernel.query_blocks(
        points, index.group_rows.numpy(), index.group_offsets, index.probe_offsets, index.probes, index.probe_masks
    )
    # blocks of one step: those of _GROUPS_PER_STEP consecutive groups
    edges = np.searchsorted(blocks.group, np.arange(0, index.groups, _GROUPS_PER_STEP))
    edges = np.append(edges, len(blocks.group))
    for start, stop in zip(edges[:-1], edges[1:], strict=True):
        with kernel_context():
            rows, scores, ids = kernel.probed_top_s(blocks, lists, s, int(start), int(stop))
        yield torch.from_numpy(rows), torch.from_numpy(ids), torch.from_numpy(scores)


def _torch_search(h, s, index):
    device = h.device
    order = index.order.to(device)
    grouped = h[order]  # stored rows list by list: a list is a contiguous slice
    offsets = index.offsets
    for step in range(steps(index)):
        out_rows, out_ids, out_values = [], [], []
        for g in range(step * _GROUPS_PER_STEP, min(index.groups, (step + 1) * _GROUPS_PER_STEP)):
            probed = slice(index.probe_offsets[g], index.probe_offsets[g + 1])
            lists = index.probes[probed]
            slots = torch.from_numpy(np.concatenate([np.arange(offsets[c], offsets[c + 1]) for c in lists])).to(device)
            rows = index.group_rows[index.group_offsets[g] : index.group_offsets[g + 1]].to(device)
            candidates = order[slots]
            masks = torch.from_numpy(np.repeat(index.probe_masks[probed], np.diff(offsets)[lists])).to(device)
            chose = (masks[None, :] >> torch.arange(rows.shape[0], device=device)[:, None]) & 1
            scores = h[rows] @ grouped[slots].t()
            scores[chose == 0] = float("-inf")  # each row is searched over the lists it chose only
            scores[candidates[None, :] == rows[:, None]] = float("-inf")  # the row itself is not an edge
            values, columns = torch.topk(scores, s, dim=1)
            out_rows.append(rows)
            out_ids.append(candidates[columns])
            out_values.append(values)
        yield torch.cat(out_rows), torch.cat(out_ids), torch.cat(out_values)


def approximate_top_s(
    h: torch.Tensor,
    s: int,
    mips: bool,
    kernel_context: Callable[[], AbstractContextManager[None]] | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's approximate top ``s`` other rows by ``h_i · h_j``: ``(ids, similarities)``, ``M x s``
    int64 / float32 on the CPU, sorted by decreasing similarity. ``s`` must be below ``M``."""
    m = h.shape[0]
    index = build_index(h, ivf_plan(m, s, mips), s)
    ids = torch.empty((m, s), dtype=torch.int64)
    values = torch.empty((m, s), dtype=torch.float32)
    with tqdm(total=steps(index), desc="pseudo graph (lists)", unit="step", disable=not progress) as bar:
        for rows, found, top in search_index(h, s, index, kernel_context or nullcontext):
            rows = rows.cpu()
            ids[rows] = found.cpu()
            values[rows] = top.cpu()
            bar.update(1)
    return ids, values


def _import_kernel():
    try:
        from fedgl_secure.engine import probed_knn
    except ImportError:
        return None
    return probed_knn
