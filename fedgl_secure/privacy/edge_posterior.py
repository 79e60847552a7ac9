"""Weights for a graph released by randomised response, from the features its nodes carry (post-processing).

:func:`~fedgl_secure.privacy.edge_mechanisms.randomized_response_posterior` gives every released edge the same
weight P(true edge | released): from n, the released count and ε, it cannot tell a true edge from one of the
≈ p·n²/2 random ones. The features can: under the edge unit they are not protected (only links are), so a bank may
read them when it post-processes its release. Customers who transact tend to look alike, so the share of true
edges among the pairs of a given feature similarity rises with the similarity. Binning all pairs by the cosine
similarity of their features, randomised response keeps the arithmetic of the global estimate **within each
bin** b of P_b pairs, m'_b of them released:

    m̂_b = (m'_b − p·P_b) / (1 − 2p),    π_b = m̂_b / P_b,    w_b = (1 − p)·π_b / ((1 − p)·π_b + p·(1 − π_b)),

the unbiased count of true edges among the bin's pairs, its density, and the posterior of a released edge of that
bin (Bayes with π_b as prior): the global estimate is the one-bin case. Released edges between dissimilar customers
(where the release is mostly noise) fall towards weight 0, those between similar ones keep more. This is the idea of
Blink (Zhu et al., "Blink: link local differential privacy in graph neural networks via Bayesian estimation",
CCS 2023), which estimates per-edge priors from noisy degrees; here the prior comes from the features, which cost
no budget. Everything used — the released graph, the features, n, ε — is outside the edge unit or its output, so
the weights are post-processing and the release's ε is unchanged.

P_b is counted over all pairs for a small bank and estimated from a uniform sample of pairs for a large one (the
sample only estimates counts; it is not privacy noise).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedgl_secure.privacy.edge_mechanisms import randomized_response_posteriors

BINS = 20  # quantile bins of the all-pairs similarity
EXACT_PAIRS_UP_TO = 5_000  # nodes: below this every pair's similarity is computed; above, a sample
SAMPLE_PAIRS = 2_000_000
_BLOCK_ROWS = 1_000


def pair_similarities(unit: sp.csr_matrix, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Cosine similarity of each pair (i[t], j[t]) of rows of ``unit`` (rows of unit L2 norm), in blocks."""
    out = np.empty(i.size, dtype=np.float64)
    step = 200_000
    for start in range(0, i.size, step):
        stop = min(start + step, i.size)
        out[start:stop] = np.asarray(unit[i[start:stop]].multiply(unit[j[start:stop]]).sum(axis=1)).ravel()
    return out


def all_pair_similarities(unit: sp.csr_matrix) -> np.ndarray:
    """The cosine similarity of every pair i < j (n(n−1)/2 values), a block of rows at a time."""
    n = unit.shape[0]
    parts = []
    for start in range(0, n, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n)
        block = (unit[start:stop] @ unit.T).toarray()
        rows, cols = np.triu_indices(stop - start, k=1, m=n - start)
        parts.append(block[:, start:][rows, cols])
    return np.concatenate(parts) if parts else np.empty(0)


def sampled_pair_similarities(unit: sp.csr_matrix, count: int, rng: np.random.Generator) -> np.ndarray:
    """The cosine similarity of ``count`` pairs i ≠ j drawn uniformly (with replacement)."""
    n = unit.shape[0]
    i = rng.integers(0, n, size=count)
    j = (i + rng.integers(1, n, size=count)) % n  # uniform over j ≠ i
    return pair_similarities(unit, i, j)


def feature_posterior_weights(
    released: sp.spmatrix,
    features: sp.spmatrix | np.ndarray,
    epsilon: float,
    rng: np.random.Generator,
    *,
    bins: int = BINS,
    exact_up_to: int = EXACT_PAIRS_UP_TO,
    sample_pairs: int = SAMPLE_PAIRS,
) -> sp.csr_matrix:
    """The released graph (symmetric, 0/1) with each edge weighted by its similarity bin's posterior (module doc).

    ``rng`` draws the pair sample of a bank above ``exact_up_to`` nodes (an estimate of counts, not privacy
    noise)."""
    upper = sp.triu(sp.csr_matrix(released), k=1).tocoo()
    n = released.shape[0]
    if n < 2 or upper.nnz == 0:
        return sp.csr_matrix(released, dtype=np.float64)
    # deferred: importing scikit-learn costs ~1.7 s in every node process, and only this release needs it
    from sklearn.preprocessing import normalize

    unit = normalize(sp.csr_matrix(features, dtype=np.float64), norm="l2")  # zero rows stay zero
    if unit.shape[0] != n:
        raise ValueError(f"features have {unit.shape[0]} rows for a graph of {n} nodes")
    total_pairs = n * (n - 1) / 2
    if n <= exact_up_to:
        reference = all_pair_similarities(unit)
    else:
        reference = sampled_pair_similarities(unit, sample_pairs, rng)
    edges = pair_similarities(unit, upper.row, upper.col)
    # quantile bin edges of the all-pairs similarity; ties (e.g. many pairs sharing no feature) merge bins
    cuts = np.unique(np.quantile(reference, np.linspace(0.0, 1.0, bins + 1)[1:-1]))
    pairs_per_bin = np.bincount(np.searchsorted(cuts, reference, side="right"), minlength=cuts.size + 1)
    pairs_per_bin = pairs_per_bin * (total_pairs / reference.size)
    edge_bin = np.searchsorted(cuts, edges, side="right")
    released_per_bin = np.bincount(edge_bin, minlength=cuts.size + 1)
    weights = randomized_response_posteriors(released_per_bin, pairs_per_bin, epsilon)[edge_bin]
    upper_weighted = sp.coo_matrix((weights, (upper.row, upper.col)), shape=(n, n))
    return sp.csr_matrix(upper_weighted + upper_weighted.T)
