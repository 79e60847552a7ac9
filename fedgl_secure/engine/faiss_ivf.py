"""Approximate top-s neighbours for Eq. 15 through faiss' inverted file (``backend="faiss_ivf"``).

Eq. 15 keeps, per row ``i`` of ``H̄`` (``M x D``), the ``s`` largest ``h_i · h_j`` (``j ≠ i``;
``cosine`` normalises the rows first). Exact search is ``O(M² D)``, hours at ``2.5·10^6`` rows on
a CPU. faiss' ``IndexIVFFlat`` cuts the rows into ``nlist`` k-means lists and scores each row
exactly against the rows of its ``nprobe`` nearest lists only.

**Maximum inner product as nearest neighbour.** An L2 index needs a metric, and ``dot`` is not
one: a few high-norm rows are everybody's top-s (DESIGN §3), and lists of similar directions miss
them. The standard reduction (Bachrach et al. 2014) stores each row as ``[h, √(Φ² − ‖h‖²)]``
(``Φ`` the largest norm) and queries it as ``[h, 0]``; then
``‖q_i − x_j‖² = ‖h_i‖² + Φ² − 2 h_i · h_j``, so the nearest stored rows in L2 are exactly the
rows of the largest inner product. ``cosine`` goes the same way with unit rows (``Φ = 1``; the
extra coordinate is 0, or 1 for an all-zero row), so both similarities share one index type.

**Hubs, for dot.** The ``HUB_ROWS`` rows of the largest norms are also searched exactly by every
row (a faiss ``IndexFlatIP``), and their best join the lists' candidates: a cheap guarantee that
the rows that dominate ``dot`` are never lost to a list boundary.

**Only the candidates are approximate.** Every candidate's similarity is recomputed exactly from
``H̄`` (``best_candidates``), so Eq. 15's weights never carry the float32 cancellation of the L2
distances above.

**Parameters from the target recall** (``benchmarks/knn_sweep.py``, docs/results/knn_sweep.json;
10^5 rows, D = 16, recall of the exact top-s on 500 sampled rows). ``nlist = 4√M`` (faiss'
guideline), ``nprobe = NPROBE``: at 64 probes recall was 0.9969–1.0 for {clustered, banks} x
{dot, cosine} x {s = 10, 100} (at 16: 0.893–0.994, at 32: 0.976–1.0), 104–198 CPU seconds per
10^6 rows searched. faiss' ``IndexHNSWFlat`` on the same lifted rows reached only 0.942–0.9998
at a breadth of 384, for 526–801 CPU seconds per 10^6 rows (clustered dot was its worst case, and
adding the hub scan lifted it only to 0.971 / 0.967 for s = 10 / 100); HNSW with faiss'
inner-product metric on the raw rows stalled at 0.74 for s = 100 (clustered dot, separate runs).
Lists grow as √M while a row's s nearest draw closer as ``M^(-1/D)``, so at a fixed ``nprobe`` the
scanned lists cover a row's neighbourhood at least as well at 10^7 rows as at 10^5. Acceptance at
scale (``benchmarks/pseudo_graph_recall.py``, every case from 500 sampled rows; :func:`search_rows`):
docs/results/pseudo_graph_recall_2_5m.json and pseudo_graph_recall_10m.json.

**Determinism.** faiss' k-means has a fixed seed and the search scans each row's lists in a fixed
order, so the same input on the same thread count gives the same graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

TARGET_RECALL = 0.95
# Lists scanned per row (see the module docstring for the measurement).
NPROBE = 64
# nlist = LISTS_PER_SQRT x √M, faiss' guideline (4-16 √M); fewer, larger lists keep the cost of
# assigning rows to lists small against scanning them.
LISTS_PER_SQRT = 4
# k-means sample: this many rows per list (faiss warns below 39).
TRAIN_ROWS_PER_LIST = 64
# dot: rows of the largest norms every row also scores exactly. 4096 x D products per row (one
# faiss IndexFlatIP search) cost a fraction of the lists' scan.
HUB_ROWS = 4096
# Rows added per faiss call: bounds the lifted copy of H̄ held besides the index and gives the
# build's progress bar steps.
ADD_ROWS = 1 << 18
SEED = 1234


@dataclass(frozen=True)
class IvfFlatPlan:
    """How ``M`` rows are indexed and searched."""

    nlist: int
    nprobe: int
    train_rows: int
    mips: bool
    hubs: int


def faiss_ivf_plan(m: int, mips: bool) -> IvfFlatPlan:
    """The plan for ``M = m`` rows; ``mips`` for ``dot`` similarity."""
    nlist = max(1, min(m, round(LISTS_PER_SQRT * math.sqrt(m))))
    return IvfFlatPlan(
        nlist, min(NPROBE, nlist), min(m, TRAIN_ROWS_PER_LIST * nlist), mips, min(m, HUB_ROWS) if mips else 0
    )


def largest_norm(h: np.ndarray) -> float:
    """``Φ``, the largest row norm, in float64 (the lift's ``Φ² − ‖h‖²`` must not go negative)."""
    return float(np.sqrt(np.einsum("ij,ij->i", h, h, dtype=np.float64).max())) if h.shape[0] else 0.0


def stored_vectors(h: np.ndarray, phi: float) -> np.ndarray:
    """``[h, √(Φ² − ‖h‖²)]``: rows as the index holds them (float32, ``D + 1`` columns)."""
    squares = np.einsum("ij,ij->i", h, h, dtype=np.float64)
    lift = np.sqrt(np.maximum(phi * phi - squares, 0.0))
    return np.hstack([h, lift[:, None].astype(np.float32)])


def query_vectors(h: np.ndarray) -> np.ndarray:
    """``[h, 0]``: rows as they query the index."""
    return np.hstack([h, np.zeros((h.shape[0], 1), dtype=np.float32)])


@dataclass(frozen=True)
class FaissIvfIndex:
    """The ``IndexIVFFlat`` over the lifted rows, and for ``dot`` an exact index of the hubs.

    Attributes:
        lists: the ``IndexIVFFlat`` (L2) over ``stored_vectors``.
        hubs: ``IndexFlatIP`` over the ``hub_ids`` rows, or ``None``.
        hub_ids: global ids of the hub rows (empty for ``cosine``).
    """

    lists: object
    hubs: object
    hub_ids: np.ndarray


def build_index(faiss, h: np.ndarray, plan: IvfFlatPlan, progress: bool = False) -> FaissIvfIndex:
    """The index over ``h`` (``M x D`` float32): k-means on a seeded sample, then every row added,
    ``ADD_ROWS`` at a time. For ``cosine`` the caller passes unit rows."""
    d = h.shape[1] + 1
    phi = largest_norm(h)
    lists = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, plan.nlist)
    lists.cp.seed = SEED
    lists.cp.min_points_per_centroid = 1  # the sample is sized here (faiss warns below 39 per list)
    sample = np.sort(np.random.default_rng(SEED).choice(h.shape[0], plan.train_rows, replace=False))
    lists.train(stored_vectors(h[sample], phi))
    with tqdm(total=h.shape[0], desc="pseudo graph (lists)", unit="row", disable=not progress) as bar:
        for start in range(0, h.shape[0], ADD_ROWS):
            part = h[start : start + ADD_ROWS]
            lists.add(stored_vectors(part, phi))
            bar.update(part.shape[0])
    lists.nprobe = plan.nprobe
    hubs, hub_ids = None, np.empty(0, dtype=np.int64)
    if plan.hubs:
        norms = np.einsum("ij,ij->i", h, h, dtype=np.float64)
        hub_ids = np.sort(np.argsort(-norms, kind="stable")[: plan.hubs])
        hubs = faiss.IndexFlatIP(h.shape[1])
        hubs.add(h[hub_ids])
    return FaissIvfIndex(lists, hubs, hub_ids)


def search(
    faiss, index: FaissIvfIndex, h: torch.Tensor, start: int, stop: int, s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The approximate top ``s`` other rows of rows ``start:stop``: ``(ids, exact similarities)``,
    ``rows x s``, sorted by decreasing similarity (:func:`search_rows`)."""
    return search_rows(faiss, index, h, torch.arange(start, stop), s)


def search_rows(
    faiss, index: FaissIvfIndex, h: torch.Tensor, rows: torch.Tensor, s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The approximate top ``s`` other rows of each of ``rows`` (any row ids of ``h``): ``(ids, exact
    similarities)``, ``len(rows) x s``, sorted by decreasing similarity. Each row's answer depends on that
    row and the index only, so a sample of rows gets the neighbours the whole graph gives them (the
    recall benchmark at 10^7 rows measures it so).

    Candidates are the ``s + 1`` nearest in the probed lists (the row itself is usually one) and,
    for ``dot``, the hubs' exact top ``s + 1``. A row whose probed lists hold fewer than ``s + 1``
    rows (small ``M``, uneven lists) is searched again over every list.
    """
    queries = h.numpy()[rows.numpy()]
    lifted = query_vectors(queries)
    _, found = index.lists.search(lifted, s + 1)
    short = np.flatnonzero((found < 0).any(axis=1))
    if short.size:
        everywhere = faiss.SearchParametersIVF(nprobe=index.lists.nlist)
        _, found[short] = index.lists.search(lifted[short], s + 1, params=everywhere)
    candidates = [torch.from_numpy(found)]
    if index.hubs is not None:
        _, hub_found = index.hubs.search(queries, min(s + 1, index.hub_ids.size))
        candidates.append(torch.from_numpy(index.hub_ids[hub_found]))
    return best_candidates(h, rows, torch.cat(candidates, dim=1), s)


def best_candidates(
    h: torch.Tensor, rows: torch.Tensor, candidates: torch.Tensor, s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``s`` best candidates by exact ``h_i · h_j``, the row itself and repeats left out:
    ``(ids, similarities)`` sorted by decreasing similarity. Rows need ``s`` distinct other candidates."""
    candidates = torch.sort(candidates, dim=1).values
    scores = torch.einsum("rd,rkd->rk", h[rows], h[candidates])
    repeated = torch.zeros_like(candidates, dtype=torch.bool)
    repeated[:, 1:] = candidates[:, 1:] == candidates[:, :-1]
    scores[repeated | (candidates == rows[:, None])] = float("-inf")
    scores, order = torch.topk(scores, s, dim=1, sorted=True)
    return candidates.gather(1, order), scores
