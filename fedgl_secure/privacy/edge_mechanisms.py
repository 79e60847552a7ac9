"""Edge-level DP at the source: randomised response on node pairs, FGCL's Laplace edge weights, the posteriors.

:func:`randomized_response_edges` is the ε-edge-DP release of a bank's adjacency (paid once, everything
after it is post-processing); :func:`laplace_edge_weights` is the FGCL paper's weight perturbation, which
hides weights but not whether an edge exists; :func:`randomized_response_posterior` and
:func:`randomized_response_posteriors` weight released edges from public quantities only. The samplers are in
:mod:`fedgl_secure.privacy.secure_noise`, the adjacency checks and the degree bound in
:mod:`fedgl_secure.privacy.graph_sensitivity`.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from fedgl_secure.privacy.graph_sensitivity import _symmetric, _upper_edges
from fedgl_secure.privacy.secure_noise import (
    RandomBytes,
    laplace_scale,
    secure_integers,
    secure_laplace,
    secure_uniform,
)

# --- pair indexing ---------------------------------------------------------------------------


def _pair_index(i: np.ndarray, j: np.ndarray, n: int) -> np.ndarray:
    """Row-major index of the pair (i, j), i < j, among the n(n−1)/2 upper-triangle pairs."""
    return i * n - i * (i + 1) // 2 + (j - i - 1)


def _pair_from_index(t: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`_pair_index`; the float root is corrected in exact integer arithmetic."""
    t = np.asarray(t, dtype=np.int64)
    b = 2 * n - 1
    i = np.floor((b - np.sqrt(np.maximum(float(b) * b - 8.0 * t, 0.0))) / 2).astype(np.int64)
    i = np.clip(i, 0, n - 2)

    def start(row: np.ndarray) -> np.ndarray:
        return row * n - row * (row + 1) // 2

    i = np.where(start(i) > t, i - 1, i)
    i = np.where(start(i + 1) <= t, i + 1, i)
    return i, t - start(i) + i + 1


# --- edge-level DP: randomised response -------------------------------------------------------


def flip_probability(epsilon: float) -> float:
    r"""Randomised-response flip probability :math:`p = 1 / (1 + e^{\varepsilon})` for an ε-DP bit."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"edge-DP epsilon must be a positive finite number, got {epsilon}")
    return math.exp(-epsilon) / (1.0 + math.exp(-epsilon))  # = 1/(1 + e^ε), without overflow for large ε


def _distinct_integers(count: int, high: int, random_bytes: RandomBytes | None) -> np.ndarray:
    """A uniformly random ``count``-subset of ``[0, high)``: the first ``count`` distinct values of i.i.d. draws."""
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < count:
        draws = np.concatenate(
            [chosen, secure_integers(2 * (count - chosen.size) + 8, high, _random_bytes=random_bytes)]
        )
        # Keep first occurrences in draw order: the first `count` distinct values of an i.i.d. uniform
        # sequence form a uniform random subset, which sorting-then-truncating would not give.
        _, first = np.unique(draws, return_index=True)
        chosen = draws[np.sort(first)]
    return chosen[:count]


def randomized_response_edges(
    adjacency: sp.spmatrix | sp.sparray,
    epsilon: float,
    *,
    max_edges: int = 50_000_000,
    _random_bytes: RandomBytes | None = None,
) -> sp.csr_matrix:
    r"""Randomised response on every unordered node pair: ε-edge-DP for the whole adjacency, paid once.

    Each of the n(n−1)/2 pairs is flipped independently with probability :math:`p = 1/(1+e^\varepsilon)`
    (edge kept with probability 1−p, non-edge becomes an edge with probability p). Two graphs that
    differ in one edge differ in one independent bit, whose output likelihood ratio is at most
    :math:`(1-p)/p = e^\varepsilon`: the released graph is **ε-edge-DP** (pure, δ = 0), and everything
    computed from it afterwards (training, P_k, H_k, W_k in every round) is post-processing with
    respect to edges, so edge privacy costs ε once per bank — record it with
    ``PrivacyLedger.record_pure("edges", epsilon)``. It protects *edges only*: node features and
    labels, and node-level membership, are not covered (removing a node flips up to n−1 bits).

    Non-edges are never materialised: the number that turn into edges is drawn as
    Binomial(#non-edges, p) and that many distinct non-edge pairs are then chosen uniformly (which
    has exactly the law of independent flips). Small ε makes the output dense (≈ p·n²/2 edges); the
    function refuses, rather than exhausting memory, when the expected output exceeds ``max_edges``.

    Randomness comes from the OS CSPRNG; ``_random_bytes`` replaces it, as for the other samplers, in
    tests and reproducible simulations only — a release made with a known byte source is not private.
    Bernoulli and binomial draws use 52-bit uniforms, so probabilities are exact to ~2^-52.
    Returns a binary, symmetric, loop-free CSR matrix.
    """
    p = flip_probability(epsilon)
    random_bytes = _random_bytes
    n, i, j = _upper_edges(adjacency)
    num_pairs = n * (n - 1) // 2
    num_non_edges = num_pairs - i.size
    expected = (1 - p) * i.size + p * num_non_edges
    if expected > max_edges:
        raise ValueError(
            f"randomised response at epsilon={epsilon} on {n} nodes would release about {expected:.3g} edges "
            f"(> max_edges={max_edges}); raise epsilon, or raise max_edges if the memory is there"
        )
    survive = secure_uniform(i.size, _random_bytes=random_bytes) >= p
    u = secure_uniform(1, _random_bytes=random_bytes)[0]
    from scipy.stats import binom  # here: scipy.stats costs a node seconds at start-up, and only edge DP needs it

    num_added = int(binom.ppf(u, num_non_edges, p)) if num_non_edges else 0
    # Choose the new edges by rank among non-edges, then map ranks to pair indices by skipping the
    # (sorted) existing edges: rank r lands on pair r + #{existing pairs at or before it}.
    existing = np.sort(_pair_index(i, j, n))
    ranks = _distinct_integers(num_added, num_non_edges, random_bytes) if num_added else np.empty(0, np.int64)
    added = ranks + np.searchsorted(existing - np.arange(existing.size), ranks, side="right")
    add_i, add_j = _pair_from_index(added, n)
    return _symmetric(n, np.concatenate([i[survive], add_i]), np.concatenate([j[survive], add_j]))


# --- edge weights: the FGCL paper's Laplace mechanism ----------------------------------------


def laplace_edge_weights(
    adjacency: sp.spmatrix | sp.sparray, epsilon: float, *, _random_bytes: RandomBytes | None = None
) -> sp.csr_matrix:
    r"""FGCL's edge perturbation: :math:`\tilde A_{ij} = \max(0, A_{ij} + \mathrm{Lap}(1/\varepsilon))` on the edges.

    Yang et al., "Mitigating the performance sacrifice in DP-satisfied federated settings through graph
    contrastive learning" (Information Sciences 2023, arXiv 2207.11836), perturb the adjacency's values
    with Laplace noise. One noise draw per unordered pair (the result stays symmetric); clamping at 0
    is post-processing. It is ε-DP for a change of **one edge's weight** by at most 1; it releases
    *which* pairs are edges as they are, so it does not hide an edge's existence (that is
    :func:`randomized_response_edges`). Used as a view augmentation by FGCL, and as the ``laplace``
    option of ``[dp.edges]``. Pairs whose weight falls to 0 are dropped from the sparse result.
    """
    n, i, j = _upper_edges(adjacency)
    matrix = sp.csr_matrix(adjacency, dtype=np.float64)
    weights = np.asarray(matrix[i, j]).ravel() if i.size else np.empty(0)
    noisy = np.maximum(weights + secure_laplace(i.size, laplace_scale(epsilon), _random_bytes=_random_bytes), 0.0)
    keep = noisy > 0
    rows = np.concatenate([i[keep], j[keep]])
    cols = np.concatenate([j[keep], i[keep]])
    return sp.csr_matrix((np.concatenate([noisy[keep], noisy[keep]]), (rows, cols)), shape=(n, n))


# --- posteriors of randomised response (post-processing) -------------------------------------


def randomized_response_posterior(num_nodes: int, released_edges: int, epsilon: float) -> float:
    r"""P(true edge | released edge) after :func:`randomized_response_edges`, from public quantities only.

    With P = n(n−1)/2 pairs, flip probability p and m' released edges, the true edge count is estimated
    without bias by :math:`\hat m = (m' - pP)/(1 - 2p)` (clipped to [1, P]); with the density
    :math:`\pi = \hat m / P` as prior, Bayes gives
    :math:`w = (1-p)\pi / ((1-p)\pi + p(1-\pi))`. Weighting every released edge by w is post-processing
    of the release (it uses n, m', ε only), so it costs no budget; it keeps a graph whose released edges
    are mostly random from drowning the node's own features (at small ε, w → 0 and the GCN tends to an
    MLP; at ε = 8 on a Cora-sized bank w ≈ 0.7). The same idea, with per-node degree priors, is Blink
    (Zhu et al., "Blink: link local differential privacy in graph neural networks via Bayesian
    estimation", CCS 2023).
    """
    if num_nodes < 2:
        return 1.0
    pairs = num_nodes * (num_nodes - 1) / 2
    return float(randomized_response_posteriors(np.array([released_edges]), np.array([pairs]), epsilon, 1.0)[0])


def randomized_response_posteriors(
    released: np.ndarray, pairs: np.ndarray, epsilon: float, min_true_edges: float = 0.0
) -> np.ndarray:
    r"""The posterior of :func:`randomized_response_posterior` for several groups of pairs at once: group g has
    ``pairs[g]`` pairs of which ``released[g]`` were released. Its true edge count
    :math:`\hat m_g = (m'_g - pP_g)/(1 - 2p)` is clipped to [``min_true_edges``, P_g]; with
    :math:`\pi_g = \hat m_g / P_g`, :math:`w_g = (1-p)\pi_g / ((1-p)\pi_g + p(1-\pi_g))`.
    A group without pairs gets weight 0."""
    p = flip_probability(epsilon)
    released = np.asarray(released, dtype=np.float64)
    pairs = np.asarray(pairs, dtype=np.float64)
    estimate = np.minimum(np.maximum((released - p * pairs) / (1.0 - 2.0 * p), min_true_edges), pairs)
    with np.errstate(divide="ignore", invalid="ignore"):
        prior = estimate / pairs
        weights = (1.0 - p) * prior / ((1.0 - p) * prior + p * (1.0 - prior))
    return np.where(pairs > 0, np.nan_to_num(weights), 0.0)
