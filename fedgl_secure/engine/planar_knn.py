"""Exact top-s neighbours for Eq. 15 when ``H̄`` has two columns (``backend="planar"``).

A consortium that scores a binary outcome (default or not, fraud or not) fuses two logits per
customer, so ``H̄`` is ``M x 2`` (DESIGN §3: H is the output layer by default). In the plane the
top s of every row can be found exactly without comparing all ``M²`` pairs:

* **cosine.** A unit row is an angle, and ``cos(θ_i − θ_j)`` falls as the circular distance
  between the angles grows, so row ``i``'s ``s`` most similar rows form an arc around ``θ_i``:
  they are among the ``s`` rows on either side of ``i`` in angle order. One sort, and ``2s``
  angle gaps compared per row (:func:`cosine_top_s`). Zero rows (no direction; similarity 0 to every row)
  are left out of the order; as queries they get ``s`` zero-weight neighbours.
* **dot.** ``h_i · h_j`` ranks the rows ``j`` by their projection on the direction of ``h_i``.
  The best point of a linear function over a point set is a vertex of its convex hull; peeling
  the hull off and repeating, the ``k``-th best lies on one of the first ``k`` hulls (**convex
  layers**): a point beneath layer ``k`` sits inside each of the ``k`` hulls above it, each of
  which has a vertex scoring at least as much. So every row's top ``s + 1`` (its own row among
  them or not) are among the points of the first ``s + 1`` layers, a few thousand. Rows of
  neighbouring angles are scored together, exactly, against those of the layers' points that
  can reach the top ``s + 1`` anywhere in their arc (:func:`dot_top_s`, :func:`arc_candidates`).

Peeling 101 layers of ``2.5·10^6`` points takes 101 hull computations of the whole set (~0.4 s
each), so :func:`convex_layer_candidates` first discards the points that provably lie on no early
layer: convex layers are monotone under taking subsets (a point extreme in the larger set and
present in the smaller is extreme there too), so the points of a random sample that survive
``L`` peels of the sample survive ``L`` peels of the whole set, and every point strictly inside
their hull stays inside each of the whole set's first ``L`` hulls.

Both similarities are exact up to the choice among tied rows (equal angles, equal projections),
as the other exact backends are. Rows are ranked in float64, which the other backends do not need:
at millions of two-column rows, float32 cannot tell the nearest apart (:func:`planar_top_s`).
Measured at 2.5·10^6 and 10^7 rows: docs/results/pseudo_graph_planar_*.json.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import torch
from scipy.spatial import ConvexHull, QhullError

# What each search yields, block by block: (rows, ids of their top s + 1, similarities).
Blocks = Generator[tuple[torch.Tensor, torch.Tensor, torch.Tensor], None, None]

# Rows ranked per block: bounds the (rows x candidates) float64 scores held at once (~256 MB at
# 2,000 candidates).
BLOCK_ROWS = 16384
# Sample whose peeled layers fence off the interior (a sample's hull costs ~15 ms at this size).
SAMPLE_ROWS = 100_000
_SAMPLE_SEED = 1234
# Points within this relative distance of the fence's edges are kept: float rounding may not
# discard a point that could be extreme.
_FENCE_MARGIN = 1e-9
# The same for a point's best score over an arc against the arc's bound (relative to the largest norm).
_ARC_MARGIN = 1e-9


def planar_top_s(rows: torch.Tensor, s: int, similarity: str, block_rows: int = BLOCK_ROWS) -> tuple[int, Blocks]:
    """The exact top ``s + 1`` of every row of ``H̄`` (``rows``, ``M x 2``) by ``similarity`` (``"dot"`` or
    ``"cosine"``), its own id possibly among them (``pseudo_graph.drop_self`` removes it); ``1 <= s < M``: how many
    blocks there are (a progress bar's total) and the blocks, each ``(rows, ids, similarities)``.

    Rows are ranked in float64 and their similarities returned as float32: at millions of rows in two
    columns, neighbours lie closer than float32 can tell apart (two unit rows less than ~3·10^-4
    radians apart both score a float32 cosine of 1.0, and hundreds of rows can lie that close).
    """
    points = rows.to(torch.float64).numpy()  # no copy of rows that already are float64
    if similarity == "cosine":
        return cosine_top_s(points, s, block_rows)
    return _block_total(len(points), block_rows), dot_top_s(points, s, block_rows)


def _block_total(rows: int, block_rows: int) -> int:
    return -(-rows // block_rows)


def cosine_top_s(points: np.ndarray, s: int, block_rows: int = BLOCK_ROWS) -> tuple[int, Blocks]:
    """:func:`planar_top_s` for cosine: the ``s`` nearest angles on either side, ranked by angle."""
    has_direction = np.any(points != 0, axis=1)
    nonzero, zero_rows = np.flatnonzero(has_direction), np.flatnonzero(~has_direction)
    angles = np.arctan2(points[nonzero, 1], points[nonzero, 0])
    by_angle = np.argsort(angles, kind="stable")
    order, angles = nonzero[by_angle], angles[by_angle]
    if len(order) <= 2 * s + 1:
        # Too few directions for two disjoint arcs: every row is a candidate of every other.
        lengths = np.linalg.norm(points, axis=1, keepdims=True)
        unit = np.divide(points, lengths, out=np.zeros_like(points), where=lengths > 0)
        candidates = _with_some(order, zero_rows, s + 1)
        return _block_total(len(points), block_rows), candidates_top_s(unit, candidates, s, block_rows)
    total = _block_total(len(order), block_rows) + (len(zero_rows) > 0)
    return total, _arc_top_s(order, angles, zero_rows, s, block_rows)


def _arc_top_s(order: np.ndarray, angles: np.ndarray, zero_rows: np.ndarray, s: int, block_rows: int) -> Blocks:
    """:func:`cosine_top_s`'s blocks: rows of no direction first, then the rows in ``order`` of their ``angles``."""
    if len(zero_rows):
        # No direction, similarity 0 to every row: any rows, all of weight 0.
        ids = torch.from_numpy(np.broadcast_to(order[: s + 1], (len(zero_rows), s + 1)).copy())
        yield torch.from_numpy(zero_rows), ids, torch.zeros(ids.shape)
    offsets = np.concatenate([np.arange(-s, 0), np.arange(1, s + 1)])
    for start in range(0, len(order), block_rows):
        positions = np.arange(start, min(start + block_rows, len(order)))
        arcs = (positions[:, None] + offsets) % len(order)
        gaps = np.abs(angles[arcs] - angles[positions, None])
        gaps = torch.from_numpy(np.minimum(gaps, 2 * np.pi - gaps))
        nearest, picked = torch.topk(gaps, s + 1, dim=1, largest=False)
        ids = torch.from_numpy(order[arcs]).gather(1, picked)
        yield torch.from_numpy(order[positions]), ids, torch.cos(nearest).to(torch.float32)


def dot_top_s(points: np.ndarray, s: int, block_rows: int = BLOCK_ROWS) -> Blocks:
    """:func:`planar_top_s` for dot: rows in blocks of neighbouring angles, each block scored against
    only those convex-layer points that can reach the top ``s + 1`` anywhere in its arc
    (:func:`arc_candidates`)."""
    layer_points = convex_layer_candidates(points, s + 1)
    angles = np.arctan2(points[:, 1], points[:, 0])
    order = np.argsort(angles, kind="stable")
    rows = torch.from_numpy(points)
    for start in range(0, len(order), block_rows):
        block = order[start : start + block_rows]
        arc = float(angles[block[0]]), float(angles[block[-1]])
        ids = torch.from_numpy(arc_candidates(points, layer_points, *arc, s + 1))
        block_ids = torch.from_numpy(block)
        values, picked = torch.topk(rows[block_ids] @ rows[ids].t(), s + 1, dim=1)
        yield block_ids, ids[picked], values.to(torch.float32)


def arc_candidates(points: np.ndarray, candidates: np.ndarray, low: float, high: float, k: int) -> np.ndarray:
    """The ``candidates`` (indices into ``points``) that can be among the top ``k`` by inner product
    with any direction of angle in ``[low, high]`` (``-π <= low <= high <= π``); ``k <= len(candidates)``.

    The ``k`` best at the arc's middle stay at or above their lowest score over the arc, ``bound``,
    so at every direction of the arc the ``k``-th best is at least ``bound``; a point whose highest
    score over the arc falls below it is never among the top ``k`` there. Over an arc ``[a, b]``
    the score ``r cos(θ − φ)`` peaks at ``r`` where ``θ`` lies inside it, else at an end, and
    bottoms at ``−r`` where ``θ + π`` lies inside, else at an end.
    """
    pool = points[candidates]
    radii = np.hypot(pool[:, 0], pool[:, 1])
    theta = np.arctan2(pool[:, 1], pool[:, 0])
    ends = np.stack([pool @ [np.cos(low), np.sin(low)], pool @ [np.cos(high), np.sin(high)]])
    middle = pool @ [np.cos((low + high) / 2), np.sin((low + high) / 2)]
    best = np.argpartition(-middle, k - 1)[:k]
    lowest = np.where(_within(theta[best] + np.pi, low, high), -radii[best], ends[:, best].min(axis=0))
    highest = np.where(_within(theta, low, high), radii, ends.max(axis=0))
    margin = _ARC_MARGIN * (float(radii.max()) or 1.0)
    return candidates[highest >= lowest.min() - margin]


def _within(angles: np.ndarray, low: float, high: float) -> np.ndarray:
    """Whether each angle lies in the arc ``[low, high]`` (``-π <= low <= high <= π``), modulo 2π."""
    return (angles - low) % (2 * np.pi) <= high - low


def candidates_top_s(points: np.ndarray, candidates: np.ndarray, s: int, block_rows: int = BLOCK_ROWS) -> Blocks:
    """Yield ``(rows, ids, similarities)``: every row's top ``s + 1`` by inner product among
    ``candidates`` (at least ``s + 1`` rows), its own id possibly among them."""
    ids = torch.from_numpy(np.sort(candidates))
    rows = torch.from_numpy(points)
    keys = rows[ids].t().contiguous()
    for start in range(0, rows.shape[0], block_rows):
        block_ids = torch.arange(start, min(start + block_rows, rows.shape[0]))
        values, picked = torch.topk(rows[block_ids] @ keys, s + 1, dim=1)
        yield block_ids, ids[picked], values.to(torch.float32)


def convex_layer_candidates(points: np.ndarray, layers: int) -> np.ndarray:
    """Indices of the points on the first ``layers`` convex layers of ``points`` (``M x 2``).

    Points strictly inside the fence (:func:`_fence`) lie on none of those layers and are never
    peeled; where the remaining points become collinear, their ``k`` extremes at either end of the
    line stand for the ``k`` layers left (a linear function along a line is monotone).
    """
    remaining = outside_fence(points, layers)
    found: list[np.ndarray] = []
    for peeled in range(layers):
        if len(remaining) == 0:
            break
        try:
            vertices = ConvexHull(points[remaining]).vertices
        except QhullError:  # fewer than three points, or all on one line
            found.append(_line_extremes(points[remaining], remaining, layers - peeled))
            break
        found.append(remaining[vertices])
        remaining = np.delete(remaining, vertices)
    return np.unique(np.concatenate(found)) if found else remaining


def outside_fence(points: np.ndarray, layers: int) -> np.ndarray:
    """Indices of the points not strictly inside the hull of a sample's ``layers``-times peeled
    remainder: the only ones that can lie on the first ``layers`` layers (module docstring)."""
    everything = np.arange(points.shape[0])
    if points.shape[0] <= SAMPLE_ROWS:
        return everything
    sample = np.sort(np.random.default_rng(_SAMPLE_SEED).choice(points.shape[0], SAMPLE_ROWS, replace=False))
    try:
        for _ in range(layers):
            sample = np.delete(sample, ConvexHull(points[sample]).vertices)
        fence = ConvexHull(points[sample])
    except QhullError:  # the sample's core is flat or empty: no fence, peel everything
        return everything
    # fence.equations: unit outward normals n and offsets c with n·x + c <= 0 inside
    normals, offsets = fence.equations[:, :2], fence.equations[:, 2]
    scale = float(np.abs(points).max()) or 1.0
    inside = np.ones(points.shape[0], dtype=bool)
    for normal, offset in zip(normals, offsets, strict=True):
        inside &= points @ normal + offset < -_FENCE_MARGIN * scale
    return np.flatnonzero(~inside)


def _line_extremes(points: np.ndarray, indices: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` points at either end of collinear ``points`` (their ``indices``)."""
    direction = points[-1] - points[0] if len(points) > 1 else np.zeros(2)
    if not np.any(direction):  # all one point, or one point repeated: all tie
        spread = points - points[0]
        direction = spread[np.argmax(np.abs(spread).sum(axis=1))]
    order = np.argsort(points @ direction, kind="stable")
    return indices[np.unique(np.concatenate([order[:k], order[-k:]]))]


def _with_some(order: np.ndarray, zero_rows: np.ndarray, count: int) -> np.ndarray:
    """All non-zero rows and enough zero rows that every row has ``count - 1`` others to choose."""
    return np.concatenate([order, zero_rows[: max(0, count - len(order))]])
