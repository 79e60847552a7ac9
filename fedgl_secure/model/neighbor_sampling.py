"""Layer-wise neighbour sampling for mini-batch GCN training: the rows of Â a batch of seed nodes needs.

A 2-layer GCN's output at node i reads Â's row i (layer 2), and the hidden layer at each node of that row reads
its own row of Â (layer 1): the 2-hop neighbourhood. Going outwards from the seeds, each layer keeps, for each of
its target nodes ``t``, the self-loop ``Â_tt`` and at most ``fanout`` of the other entries of row ``t``, drawn
uniformly without replacement; a kept entry of a row with ``d_t > fanout`` off-diagonal entries is scaled by
``d_t / fanout``, so that

    E[Σ_j Ŝ_tj h_j] = Σ_j Â_tj h_j

(the sampled row is an unbiased estimate of the full one; GraphSAGE's sampler, Hamilton et al. 2017, with the GCN's
weights in place of its mean). Rows with at most ``fanout`` entries are kept whole, exactly. So a batch of ``B``
seeds touches at most ``B (1 + f₂)`` hidden-layer nodes and ``B (1 + f₂)(1 + f₁)`` input nodes, whatever the
graph's size or its hubs' degrees: the memory bound of mini-batch training.

Pure numpy on the operator's CSR arrays: the operator is whatever the GCN would multiply by (Â, or Eq. 9's fused
``Â + β·D̄^-1/2 Ā D̄^-1/2``: pseudo-graph entries are neighbours like any other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class SampledLayer:
    """One layer's sampled operator: ``rows`` (its target nodes) by ``columns`` (the nodes it reads).

    ``operator`` is ``len(targets) x len(sources)``; ``sources`` starts with ``targets`` in the same order (every
    node reads itself through the self-loop), followed by the sampled neighbours not among them.
    """

    targets: np.ndarray
    sources: np.ndarray
    operator: sp.csr_matrix


@dataclass(frozen=True)
class SampledBatch:
    """The layers of one batch, input-side first: ``layers[0]`` maps input nodes to hidden nodes, ``layers[-1]``
    hidden nodes to the seeds. ``input_nodes`` are the rows of X the batch reads."""

    seeds: np.ndarray
    layers: tuple[SampledLayer, ...]

    @property
    def input_nodes(self) -> np.ndarray:
        return self.layers[0].sources


def row_entries(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in a CSR's ``indices``/``data`` of every entry of ``rows`` (in row order) and, for each, the index
    into ``rows`` of its row; vectorised (no loop over rows)."""
    starts = indptr[rows].astype(np.int64)
    lengths = indptr[rows + 1].astype(np.int64) - starts
    owner = np.repeat(np.arange(rows.shape[0], dtype=np.int64), lengths)
    offsets = np.arange(owner.shape[0], dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return starts[owner] + offsets, owner


def sample_layer(operator: sp.csr_matrix, targets: np.ndarray, fanout: int, rng: np.random.Generator) -> SampledLayer:
    """Row ``t`` of ``operator`` for each of ``targets``: the diagonal entry plus at most ``fanout`` others, scaled
    as the module docstring says. ``targets`` must be distinct node ids."""
    if fanout < 1:
        raise ValueError(f"fanout: must be at least 1, got {fanout}")
    positions, owner = row_entries(operator.indptr, targets)
    columns = operator.indices[positions].astype(np.int64)
    values = operator.data[positions].astype(np.float64)
    off_diagonal = columns != targets[owner]
    off_owner = owner[off_diagonal]
    degree = np.bincount(off_owner, minlength=targets.shape[0])
    keep = np.ones(columns.shape[0], dtype=bool)
    keep[off_diagonal] = _ranks_below(degree, rng.random(off_owner.shape[0]), fanout)
    scale = np.maximum(degree / fanout, 1.0)
    values = np.where(off_diagonal, values * scale[owner], values)[keep]
    columns, owner = columns[keep], owner[keep]
    # the node ids this layer reads beyond its targets, ascending: a mark per node of the graph, O(entries), where a
    # sort-based set difference spent a third of a 5,000,000-node bank's mini-batch round (py-spy)
    reads = np.zeros(operator.shape[1], dtype=bool)
    reads[columns] = True
    reads[targets] = False
    sources = np.concatenate([targets, np.flatnonzero(reads)])
    local_index = np.empty(operator.shape[1], dtype=np.int64)  # only the entries at ``sources`` are ever read
    local_index[sources] = np.arange(sources.shape[0])
    matrix = sp.csr_matrix(
        (values.astype(np.float32), (owner, local_index[columns])), shape=(targets.shape[0], sources.shape[0])
    )
    return SampledLayer(targets=targets, sources=sources, operator=matrix)


def _ranks_below(degree: np.ndarray, keys: np.ndarray, fanout: int) -> np.ndarray:
    """For entries grouped by row, in row order (``degree`` entries per row, one uniform ``key`` each): whether an
    entry is among the ``fanout`` smallest keys of its row — a uniform sample without replacement.

    Rows with at most ``fanout`` entries are kept whole. The longer ones are ranked a degree at a time: the rows of one
    degree ``d`` form a ``rows x d`` matrix of keys, sorted along its rows (stable, so ties go to the earlier entry, as
    a lexsort by row then key would): many short sorts instead of one lexsort of every entry (the whole sampler
    against the sort-based one: docs/results/neighbor_sampling_5m.json)."""
    kept = np.ones(keys.shape[0], dtype=bool)
    long_rows = np.flatnonzero(degree > fanout)
    if long_rows.size == 0:
        return kept
    row_start = np.cumsum(degree) - degree
    lengths = degree[long_rows]
    by_length = np.argsort(lengths, kind="stable")
    for rows in np.split(long_rows[by_length], np.flatnonzero(np.diff(lengths[by_length])) + 1):
        length = int(degree[rows[0]])
        entries = row_start[rows][:, None] + np.arange(length)
        order = np.argsort(keys[entries], axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(length), axis=1)
        kept[entries] = rank < fanout
    return kept


def sample_batch(
    operator: sp.csr_matrix, seeds: np.ndarray, fanouts: tuple[int, ...], rng: np.random.Generator
) -> SampledBatch:
    """The sampled layers a ``len(fanouts)``-layer GCN needs for ``seeds``; ``fanouts`` input-side first (as
    ``training.fanouts``): the seeds' own rows use ``fanouts[-1]``."""
    layers: list[SampledLayer] = []
    targets = np.asarray(seeds, dtype=np.int64)
    for fanout in reversed(fanouts):
        layer = sample_layer(operator, targets, fanout, rng)
        layers.append(layer)
        targets = layer.sources
    return SampledBatch(seeds=np.asarray(seeds, dtype=np.int64), layers=tuple(reversed(layers)))


def csr_rows(matrix: sp.csr_matrix, rows: np.ndarray) -> sp.csr_matrix:
    """``matrix[rows]`` without scipy's fancy-indexing copies of the whole index arrays."""
    positions, owner = row_entries(matrix.indptr, rows)
    indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=rows.shape[0]), out=indptr[1:])
    return sp.csr_matrix(
        (matrix.data[positions], matrix.indices[positions], indptr), shape=(rows.shape[0], matrix.shape[1])
    )
