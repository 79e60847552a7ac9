"""Refine approximate top-k neighbour lists by neighbours' neighbours (NN-descent rounds).

Eq. 15 keeps each row's ``s`` most similar other rows. ``approximate_knn``'s inverted lists find
most of them, but on rows whose neighbourhoods are truly high-dimensional (16-dimensional Gaussian
clusters, the hardest data of docs/results/pseudo_graph_*.json) any partition of the space misses
neighbours just across a list's border, and probing more lists buys recall only linearly in time:
measured, 16,384 candidates per row gave recall 0.97 at 10^6 rows but 0.82 at 2.5·10^6. A
neighbour of a neighbour, though, is very likely a neighbour (the premise of NN-descent, Dong,
Charikar and Li, WWW 2011). One round scores, for every row ``i``, the first ``fan`` neighbours of
each of its first ``fan`` neighbours and of up to ``fan`` rows that list ``i`` among their first
``fan`` (reverse neighbours, and those rows themselves), and keeps the best ``k`` of those and its
current list. Each round's cost per row is fixed (about ``2 fan²`` inner products), so the search
stays linear in ``M``.

Every row reads the others' lists from a snapshot of their first ``fan`` columns taken before the
round and writes only its own list, so rows are refined in parallel without locks and the result
does not depend on the thread count. Scores are exact inner products; a row never lists itself and
never lists a row twice. Rows should be numbered so that similar rows are near each other (the
caller numbers them in inverted-list order): neighbours' neighbours then sit in nearby memory.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Rows per parallel work item (numba hands items out one at a time under ``parallel_chunksize(1)``).
CHUNK = 1024


def refine(points: np.ndarray, ids: np.ndarray, scores: np.ndarray, fan: int, rounds: int, settle: float) -> list[int]:
    """Up to ``rounds`` rounds, in place: each row's ``(ids, scores)`` (``M x k``, int64 / float32,
    sorted by decreasing score) become its best ``k`` among them and its neighbours' and reverse
    neighbours' first ``fan`` neighbours. Stops early once a round changes fewer than ``settle`` of
    the entries. Returns the entries each round changed. Runs on numba's current threads.

    As in NN-descent, a round after the first pairs only what is new: a neighbour's list is read
    whole only when that neighbour is new in ``i``'s first ``fan`` (else only its new entries), since
    the old-with-old pairs were all scored in an earlier round.
    """
    m, k = ids.shape
    fan = max(1, min(fan, k))
    previous = np.full((m, fan), -1, dtype=np.int32)
    changes = []
    for _ in range(rounds):
        snapshot = np.ascontiguousarray(ids[:, :fan]).astype(np.int32)
        fresh = _fresh(snapshot, previous)
        offsets, listers, listed_fresh = _reverse(snapshot, fresh)
        changed = np.zeros(-(-m // CHUNK), dtype=np.int64)
        _refine_kernel(points, ids, scores, snapshot, fresh, offsets, listers, listed_fresh, changed)
        previous = snapshot
        changes.append(int(changed.sum()))
        if changes[-1] < settle * m * k:
            break
    return changes


@njit(parallel=True, cache=True)
def _fresh(snapshot, previous):  # pragma: no cover - compiled
    """Which entries of each row's snapshot were not in its previous one."""
    m, fan = snapshot.shape
    fresh = np.ones((m, fan), dtype=np.bool_)
    for i in prange(m):
        for a in range(fan):
            for b in range(fan):
                if snapshot[i, a] == previous[i, b]:
                    fresh[i, a] = False
                    break
    return fresh


@njit(cache=True)
def _reverse(snapshot, fresh):  # pragma: no cover - compiled
    """CSR of the rows listing each row in their snapshot (those listing it earliest first), and
    whether that listing is new."""
    m, fan = snapshot.shape
    counts = np.zeros(m + 1, dtype=np.int64)
    for i in range(m):
        for k in range(fan):
            counts[snapshot[i, k] + 1] += 1
    offsets = np.cumsum(counts)
    fill = offsets[:-1].copy()
    listers = np.empty(offsets[-1], dtype=np.int32)
    listed_fresh = np.empty(offsets[-1], dtype=np.bool_)
    for k in range(fan):
        for i in range(m):
            j = snapshot[i, k]
            listers[fill[j]] = i
            listed_fresh[fill[j]] = fresh[i, k]
            fill[j] += 1
    return offsets, listers, listed_fresh


@njit(fastmath=True, cache=True, inline="always")
def _offer(points, i, x, ids, scores, k):  # pragma: no cover - compiled
    """Score row ``x`` for row ``i``; insert it into ``i``'s sorted list if it beats the last entry
    and is not listed yet. Returns 1 when inserted."""
    if x == i:
        return 0
    d = points.shape[1]
    total = np.float32(0.0)
    for c in range(d):
        total += points[i, c] * points[x, c]
    if not total > scores[i, k - 1]:
        return 0
    for p in range(k):  # rare: only candidates that beat the current k-th best get here
        if ids[i, p] == x:
            return 0
    p = k - 1
    while p > 0 and scores[i, p - 1] < total:
        scores[i, p] = scores[i, p - 1]
        ids[i, p] = ids[i, p - 1]
        p -= 1
    scores[i, p] = total
    ids[i, p] = x
    return 1


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _refine_kernel(points, ids, scores, snapshot, fresh, offsets, listers, listed_fresh, changed):  # pragma: no cover
    m, k = ids.shape
    fan = snapshot.shape[1]
    for item in prange(changed.shape[0]):
        count = 0
        for i in range(item * CHUNK, min(m, (item + 1) * CHUNK)):
            for a in range(fan):
                hop = snapshot[i, a]
                whole = fresh[i, a]
                for b in range(fan):
                    if whole or fresh[hop, b]:
                        count += _offer(points, i, snapshot[hop, b], ids, scores, k)
            last = min(offsets[i + 1], offsets[i] + fan)
            for r in range(offsets[i], last):
                hop = listers[r]
                whole = listed_fresh[r]
                if whole:
                    count += _offer(points, i, hop, ids, scores, k)
                for b in range(fan):
                    if whole or fresh[hop, b]:
                        count += _offer(points, i, snapshot[hop, b], ids, scores, k)
        changed[item] = count
