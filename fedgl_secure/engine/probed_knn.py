"""Top-s inner-product neighbours of groups of rows over a few probed lists, in one numba kernel.

Eq. 15 keeps, per row ``i`` of ``H̄``, the ``s`` largest ``h_i · h_j`` (``j ≠ i``). The approximate
backend (``approximate_knn``) narrows each row's candidates to the rows of a few inverted lists;
this module scores a group of query rows against exactly those lists, the way ``fused_knn`` scores
a block of rows against all columns: every ``4 x CHUNK`` tile of scores lives in L1, eight scores
at a time are compared with each row's running s-th best, and only those above it enter the row's
candidate buffer. No score is written to memory, and the cost per score is the exact kernel's.

Layout (``pack_lists``): the columns are ``H̄``'s rows list by list, each list padded to whole
chunks of ``CHUNK`` columns (``chunk_width`` says how many are real), so a list is a contiguous
run of chunks and a group's candidates are a few such runs. Work items are blocks of at most
``BLOCK`` query rows of one group; every block is scanned by one thread, over its group's probed
lists in the given order (the nearest list first, so the threshold rises early), so the result
does not depend on the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import trailing_zeros

from fedgl_secure.engine.fused_knn import BLOCK, CAPACITY_FACTOR, CHUNK, LOWEST, TILE, keep_best, pack_rows, tile_scores
from fedgl_secure.engine.simd import LANES, above_mask


@dataclass(frozen=True)
class PackedLists:
    """Rows of ``H̄`` as score columns, list by list.

    Attributes:
        chunks: ``(chunks, D', CHUNK)`` float32, ``fused_knn.pack_columns``' layout.
        chunk_width: real columns per chunk (the rest of a list's last chunk is zero padding).
        list_chunks: ``lists + 1`` bounds: list ``l`` is chunks ``list_chunks[l]:list_chunks[l + 1]``.
        slot_row: row of ``H̄`` at each column slot (``chunk * CHUNK + column``), -1 for padding.
        position: the inverse, each row's slot (to skip the row itself).
    """

    chunks: np.ndarray
    chunk_width: np.ndarray
    list_chunks: np.ndarray
    slot_row: np.ndarray
    position: np.ndarray


def pack_lists(points: np.ndarray, order: np.ndarray, offsets: np.ndarray) -> PackedLists:
    """Pack ``points`` (``M x D`` float32) as columns: list ``l`` is rows ``order[offsets[l]:offsets[l + 1]]``."""
    m, d = points.shape
    sizes = np.diff(offsets).astype(np.int64)
    per_list = -(-sizes // CHUNK)
    list_chunks = np.concatenate([[0], np.cumsum(per_list)]).astype(np.int64)
    total = int(list_chunks[-1])
    # slot of the k-th row of list l: its list's first slot plus k
    list_of = np.repeat(np.arange(len(sizes)), sizes)
    rank = np.arange(m) - np.repeat(offsets[:-1], sizes)
    slots = list_chunks[list_of] * CHUNK + rank
    slot_row = np.full(total * CHUNK, -1, dtype=np.int64)
    slot_row[slots] = order
    position = np.empty(m, dtype=np.int64)
    position[order] = slots
    padded = np.zeros((total * CHUNK, -(-d // 8) * 8), dtype=np.float32)
    padded[slots, :d] = points[order]
    chunks = np.ascontiguousarray(padded.reshape(total, CHUNK, -1).transpose(0, 2, 1))
    width = np.zeros(total, dtype=np.int64)
    last = list_chunks[1:] - 1
    width[:] = CHUNK
    has_rows = sizes > 0
    width[last[has_rows]] = sizes[has_rows] - (per_list[has_rows] - 1) * CHUNK
    return PackedLists(chunks, width, list_chunks, slot_row, position)


@dataclass(frozen=True)
class QueryBlocks:
    """Query rows grouped for the kernel.

    Attributes:
        rows: ``fused_knn.pack_rows`` of the query rows in block order (plus padding for the last tile).
        row_ids: row of ``H̄`` of each packed row (``rows.shape[0]`` may be larger: padding).
        first: first packed row of each block; ``count`` its rows (at most ``BLOCK``).
        group: the group whose probes a block scans.
        probe_offsets, probes: group ``g`` scans lists ``probes[probe_offsets[g]:probe_offsets[g + 1]]``.
        probe_masks: per probe, bit ``j`` set when the block's row ``j`` scans that list (rows choose
            their own lists; a block scans the union of its rows' and scores each list only against
            the rows that chose it).
    """

    rows: np.ndarray
    row_ids: np.ndarray
    first: np.ndarray
    count: np.ndarray
    group: np.ndarray
    probe_offsets: np.ndarray
    probes: np.ndarray
    probe_masks: np.ndarray


def query_blocks(
    points: np.ndarray,
    group_rows: np.ndarray,
    group_offsets: np.ndarray,
    probe_offsets: np.ndarray,
    probes: np.ndarray,
    probe_masks: np.ndarray,
) -> QueryBlocks:
    """One block per group (rows ``group_rows[group_offsets[g]:group_offsets[g + 1]]``, at most ``BLOCK``)."""
    sizes = np.diff(group_offsets).astype(np.int64)
    if len(sizes) and sizes.max() > BLOCK:
        raise ValueError(f"query_blocks: groups hold at most {BLOCK} rows (one bit each in probe_masks)")
    per_group = -(-sizes // BLOCK)
    group = np.repeat(np.arange(len(sizes)), per_group)
    index_in_group = np.arange(len(group)) - np.repeat(np.cumsum(per_group) - per_group, per_group)
    first = group_offsets[:-1][group] + index_in_group * BLOCK
    count = np.minimum(BLOCK, group_offsets[1:][group] - first)
    # TILE zero rows more: a block's last tile reads up to three rows past its end
    packed = np.concatenate([pack_rows(points[group_rows]), np.zeros((TILE, _padded(points)), dtype=np.float32)])
    return QueryBlocks(
        packed,
        group_rows.astype(np.int64),
        first.astype(np.int64),
        count.astype(np.int64),
        group.astype(np.int64),
        probe_offsets.astype(np.int64),
        probes.astype(np.int64),
        probe_masks.astype(np.int64),
    )


def _padded(points: np.ndarray) -> int:
    return pack_rows(points[:0]).shape[1]


def probed_top_s(
    blocks: QueryBlocks, lists: PackedLists, s: int, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks ``start:stop``: ``(row ids, scores, neighbour ids)``, each row's ``s`` best among its
    group's probed lists, itself excluded, sorted by decreasing score.

    Every group's probed lists must hold at least ``s + 1`` rows (the caller plans so); scores must
    not overflow float32 (the caller checks).
    """
    first = int(blocks.first[start])
    last = int(blocks.first[stop - 1] + blocks.count[stop - 1])
    scores = np.empty((last - first, s), dtype=np.float32)
    slots = np.full((last - first, s), -1, dtype=np.int64)
    capacity = max(CAPACITY_FACTOR * s, s + 1)
    _probed_kernel(
        blocks.rows,
        blocks.row_ids,
        blocks.first[start:stop] - first,
        first,
        blocks.count[start:stop],
        blocks.group[start:stop],
        blocks.probe_offsets,
        blocks.probes,
        blocks.probe_masks,
        lists.chunks,
        lists.chunk_width,
        lists.list_chunks,
        lists.position,
        s,
        capacity,
        scores,
        slots,
    )
    if (slots < 0).any():
        raise RuntimeError("probed_top_s: a row had fewer than s candidates; its group's probes are too few")
    return blocks.row_ids[first:last], scores, lists.slot_row[slots]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _probed_kernel(
    rows,
    row_ids,
    block_first,
    row_offset,
    block_count,
    block_group,
    probe_offsets,
    probes,
    probe_masks,
    columns,
    chunk_width,
    list_chunks,
    position,
    s,
    capacity,
    out_scores,
    out_slots,
):  # pragma: no cover - compiled
    """``out_*[r - row_offset]``: the top s of packed row ``r`` over its block's probed lists."""
    groups = rows.shape[1] // 8
    for block in prange(block_first.shape[0]):
        first = block_first[block] + row_offset
        count = block_count[block]
        g = block_group[block]
        values = np.empty((BLOCK, capacity), dtype=np.float32)
        members = np.empty((BLOCK, capacity), dtype=np.int32)
        held = np.zeros(BLOCK, dtype=np.int64)
        threshold = np.full(BLOCK, LOWEST, dtype=np.float32)
        spare_values = np.empty(capacity, dtype=np.float32)
        spare_members = np.empty(capacity, dtype=np.int32)
        tile = np.empty((TILE, CHUNK), dtype=np.float32)
        # the rows that chose the list being scanned, gathered so that tiles stay full
        chosen = np.zeros((BLOCK + TILE, rows.shape[1]), dtype=np.float32)
        chosen_local = np.empty(BLOCK, dtype=np.int64)
        for p in range(probe_offsets[g], probe_offsets[g + 1]):
            lst = probes[p]
            mask = probe_masks[p]
            n_chosen = 0
            for j in range(count):
                if (mask >> j) & 1:
                    chosen[n_chosen] = rows[first + j]
                    chosen_local[n_chosen] = j
                    n_chosen += 1
            for chunk in range(list_chunks[lst], list_chunks[lst + 1]):
                start = chunk * CHUNK
                width = chunk_width[chunk]
                for offset in range(0, n_chosen, TILE):
                    tile_scores(chosen, offset, columns[chunk], groups, tile)
                    for u in range(min(TILE, n_chosen - offset)):
                        local = chosen_local[offset + u]
                        scores = tile[u]
                        # Neither the row itself nor a list's zero padding may be admitted.
                        own = position[row_ids[first + local]] - start
                        if 0 <= own < CHUNK:
                            scores[own] = LOWEST
                        for c in range(width, CHUNK):
                            scores[c] = LOWEST
                        bar = threshold[local]
                        n = held[local]
                        for c0 in range(0, CHUNK, LANES):
                            hits = above_mask(scores, c0, bar)
                            while hits != 0:
                                lane = trailing_zeros(hits)
                                hits &= hits - 1
                                values[local, n] = scores[c0 + lane]
                                members[local, n] = start + c0 + lane
                                n += 1
                                if n == capacity:
                                    bar = keep_best(values[local], members[local], n, s, spare_values, spare_members)
                                    n = s
                                    hits &= above_mask(scores, c0, bar)
                        held[local] = n
                        threshold[local] = bar
        for local in range(count):
            n = held[local]
            if n > s:
                keep_best(values[local], members[local], n, s, spare_values, spare_members)
            kept = min(n, s)
            order = np.argsort(-values[local, :kept], kind="mergesort")
            out = first + local - row_offset
            for k in range(kept):
                out_scores[out, k] = values[local, order[k]]
                out_slots[out, k] = members[local, order[k]]
