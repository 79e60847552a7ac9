"""How far one neighbouring change moves a GCN release: the degree bound, the rows it couples, the L2 sensitivities.

Graph coupling. A GCN row is not a function of one node: message passing mixes a node's data into
the rows of its L-hop neighbourhood. The sensitivities below therefore count *how many rows one
change can move* (:func:`affected_rows`) under a degree bound, and the guarantees hold only for
graphs that satisfy that bound (see :func:`bound_degree` for what the projection does and does not
give). The adjacency checks shared with :mod:`fedgl_secure.privacy.edge_mechanisms` (``_upper_edges``,
``_symmetric``) live here with :func:`bound_degree`, their first user, so that the edge mechanisms build on
this module and not the reverse. Clipping and noise are in :mod:`fedgl_secure.privacy.secure_noise`.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import scipy.sparse as sp

from fedgl_secure.privacy.secure_noise import _check_bound

Neighbouring = Literal["node", "features", "edge"]
NEIGHBOURING: tuple[str, ...] = ("node", "features", "edge")


# --- graph structure helpers ------------------------------------------------------------------


def _upper_edges(adjacency: sp.spmatrix | sp.sparray) -> tuple[int, np.ndarray, np.ndarray]:
    """Check that ``adjacency`` is a square, symmetric, loop-free pattern; return (n, i, j) with i < j."""
    matrix = sp.csr_matrix(adjacency)
    n, m = matrix.shape
    if n != m:
        raise ValueError(f"adjacency must be square, got shape {matrix.shape}")
    matrix.eliminate_zeros()
    pattern = (matrix != 0).astype(np.int8)
    if pattern.diagonal().any():
        raise ValueError("adjacency has self loops; remove them first (the GCN adds its own)")
    if (pattern != pattern.T).nnz:
        raise ValueError("adjacency must be symmetric (an undirected graph)")
    upper = sp.triu(pattern, k=1).tocoo()
    return n, upper.row.astype(np.int64), upper.col.astype(np.int64)


def _symmetric(n: int, i: np.ndarray, j: np.ndarray) -> sp.csr_matrix:
    """Binary symmetric CSR adjacency from upper-triangle pairs (i < j)."""
    rows = np.concatenate([i, j])
    cols = np.concatenate([j, i])
    return sp.csr_matrix((np.ones(rows.size, dtype=np.float64), (rows, cols)), shape=(n, n))


def bound_degree(adjacency: sp.spmatrix | sp.sparray, max_degree: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Drop edges so that every node has degree at most ``max_degree`` (greedy, random edge order).

    Edges are visited in a random order and kept while both endpoints are below the bound (the
    edge-addition projection of Day, Li & Lyu, SIGMOD 2016); edges whose endpoints both already
    satisfy the bound are always kept. Returns a binary symmetric CSR matrix.

    What this buys: the sensitivities in this module assume a maximum degree D. If a bank's graph
    already has degree ≤ D, the projection is the identity and the guarantees hold as stated. If
    not, the projection itself depends on the data (removing one node can change which other edges
    survive), so the guarantee holds *with respect to the projected graph* — the "bounded-degree
    neighbouring" relation — and not for arbitrary neighbours of the raw graph. ``rng`` only picks
    the visiting order, not privacy noise, so a seeded generator is fine here.
    """
    if max_degree < 1:
        raise ValueError(f"max_degree must be at least 1, got {max_degree}")
    n, i, j = _upper_edges(adjacency)
    degree = np.bincount(np.concatenate([i, j]), minlength=n)
    safe = (degree[i] <= max_degree) & (degree[j] <= max_degree)
    kept = np.bincount(np.concatenate([i[safe], j[safe]]), minlength=n)
    contested = np.flatnonzero(~safe)
    keep = safe.copy()
    # Only edges touching an over-degree node need the sequential greedy pass.
    for e in contested[rng.permutation(contested.size)]:
        u, v = i[e], j[e]
        if kept[u] < max_degree and kept[v] < max_degree:
            keep[e] = True
            kept[u] += 1
            kept[v] += 1
    return _symmetric(n, i[keep], j[keep])


# --- sensitivities under graph coupling -------------------------------------------------------


def affected_rows(
    max_degree: int, num_layers: int = 2, neighbouring: Neighbouring = "node", num_rows: int | None = None
) -> int:
    r"""Most rows of an L-layer GCN output that one neighbouring change can move, for max degree D.

    GCN propagation :math:`\hat A = \tilde D^{-1/2}(A+I)\tilde D^{-1/2}` moves a value one hop per layer,
    and because the normalisation uses degrees, changing a node's edges also changes the weights on
    its neighbours' other edges — one extra hop. With :math:`s_L = \sum_{j=0}^{L}(D-1)^j`:

    * ``"features"`` — one node's features change, the graph fixed: the rows within L hops,
      :math:`K = 1 + D\,s_{L-1}` (two layers: :math:`1 + D^2`).
    * ``"node"`` — one node added or removed with all its edges: L hops plus the normalisation hop,
      :math:`K = 1 + D\,s_L` (two layers: :math:`1 + D + D(D-1) + D(D-1)^2`).
    * ``"edge"`` — one edge (u, v) added or removed: the rows within L hops of u or v (the
      normalisation hop is the first of them), :math:`K = 2\,s_L` (two layers: :math:`2(1 + (D-1) + (D-1)^2)`).

    D must bound the degree of *every* graph the release propagates over in both neighbouring
    datasets — if the release ran on FedGL's fused graph that would include the pseudo-graph edges of
    Eq. 9 (in- and out-degree), which is why DP releases are computed on the bank's own graph
    (``engine/round_pipeline.public_model_outputs``) and DP-SGD refuses the pseudo graph. The result is capped at
    ``num_rows`` when given.
    The counts are attained (the tests build the worst-case trees), so they cannot be lowered.
    """
    if max_degree < 0 or num_layers < 1:
        raise ValueError(f"need max_degree >= 0 and num_layers >= 1, got {max_degree}, {num_layers}")
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}")
    d = max_degree

    def reach(hops: int) -> int:  # s_hops = Σ_{j=0}^{hops} (D−1)^j, with D = 0 treated as no neighbours
        return sum(max(d - 1, 0) ** k for k in range(hops + 1)) if d else 0

    if neighbouring == "features":
        count = 1 + d * reach(num_layers - 1)
    elif neighbouring == "node":
        count = 1 + d * reach(num_layers)
    else:
        count = 2 * reach(num_layers) if d else 2
    return count if num_rows is None else min(count, num_rows)


def row_release_sensitivity(clip_bound: float, rows_changed: int) -> float:
    r"""L2 sensitivity of a row-clipped matrix release when at most ``rows_changed`` rows move: :math:`2C\sqrt{K}`.

    Every row lies in the C-ball before and after, so each moved row contributes at most 2C, and the
    Frobenius norm of the difference is at most :math:`\sqrt{K}\,2C` (rows that appear or vanish
    contribute only C; 2C covers them).
    """
    if rows_changed < 1:
        raise ValueError(f"rows_changed must be at least 1, got {rows_changed}")
    return 2.0 * _check_bound(clip_bound) * math.sqrt(rows_changed)


def prediction_sensitivity(
    clip_bound: float,
    max_degree: int,
    num_layers: int = 2,
    neighbouring: Neighbouring = "node",
    num_rows: int | None = None,
) -> float:
    r"""L2 sensitivity of a bank's row-clipped P_k or H_k (predictions, embeddings; one release): :math:`2C\sqrt{K}`.

    K is :func:`affected_rows` (max_degree, num_layers, neighbouring). **Assumption** (the guarantee
    does not hold without it): the model weights used to compute P_k do not depend on the protected
    data beyond what is already accounted — they are public (e.g. the received global W̄), or they
    are the output of a DP mechanism recorded in the same ledger (DP-SGD, or the noised weights
    channel); adaptive composition then covers weights + predictions. If P_k is computed with local
    weights trained non-privately on the bank's data, one node can move *every* row and the only
    honest bound is ``row_release_sensitivity(C, N_k)`` (pass ``max_degree = N_k`` or ``num_rows``).

    Softmax rows already have L2 norm ≤ 1, so clipping P at C ≥ 1 changes nothing; embedding rows are
    unbounded, so for H the clip is what bounds them (``num_layers = 2`` for the default H, the output
    layer before softmax, 1 for the hidden-layer option; 2 covers both). Sensitivity is of
    the unweighted matrix: if the upload is pre-weighted by w_k, the noise must be scaled by w_k too,
    and w_k must itself be public (N_k changes when a node is added).
    """
    return row_release_sensitivity(clip_bound, affected_rows(max_degree, num_layers, neighbouring, num_rows))


def weight_update_sensitivity(clip_bound: float) -> float:
    """L2 sensitivity of a bank's clipped weight update ``clip_vector(W_k − W̄, C)``: 2C.

    Both updates lie in the C-ball, so this holds for *any* change of the bank's data — one edge,
    one node, or all of it — with no degree assumption. As for predictions, it is the sensitivity of
    the unweighted update; pre-weighting by w_k scales it.
    """
    return 2.0 * _check_bound(clip_bound)


def graph_dp_sgd_noise_multiplier(
    noise_multiplier: float, max_degree: int, num_layers: int = 2, neighbouring: Neighbouring = "node"
) -> float:
    r"""Effective noise multiplier of DP-SGD on a GCN, to record with ``sample_rate = 1``.

    Opacus calibrates noise std σC to add/remove of *one* example whose clipped gradient (norm ≤ C) is
    the only term that moves. In a GCN, node v's data enters the losses of the K =
    :func:`affected_rows` training nodes around it; for node add/remove its own gradient appears
    (≤ C) and K−1 others move (≤ 2C each), so the summed gradient moves by at most (2K−1)C
    (2KC for feature or edge neighbouring) and the effective multiplier is σ/(2K−1) (σ/2K).

    No amplification by subsampling is claimed: the Poisson-subsampling theorem assumes a node
    influences only its own example, which message passing breaks (Daigavane et al., 2021 derive a
    specialised bound; it is not implemented). Recording with ``sample_rate = 1`` is valid but
    pessimistic. Assumes per-example gradients are per-node-loss gradients ∇ℓ_i, each clipped to C.
    """
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier}")
    k = affected_rows(max_degree, num_layers, neighbouring)
    factor = 2 * k - 1 if neighbouring == "node" else 2 * k
    return float(noise_multiplier) / factor
