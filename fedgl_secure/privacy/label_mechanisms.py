"""Label-level DP at the source: k-ary randomised response and RRWithPrior (Ghazi et al., NeurIPS 2021).

Each released label costs ε once (parallel composition over labels); the noise matrices and likelihoods
here depend on public quantities (ε, the number of classes, the prior) only, so training on them is
post-processing. The samplers are in :mod:`fedgl_secure.privacy.secure_noise`; the staged release that fits the
prior is :mod:`fedgl_secure.privacy.label_release`.
"""

from __future__ import annotations

import math

import numpy as np

from fedgl_secure.privacy.secure_noise import RandomBytes, secure_integers, secure_uniform

# --- label-level DP: k-ary randomised response -----------------------------------------------


def label_keep_probability(epsilon: float, num_classes: int) -> float:
    r"""k-ary randomised response: keep the true label with :math:`e^\varepsilon / (e^\varepsilon + k - 1)`.

    Every other class is reported with :math:`1/(e^\varepsilon + k - 1)`, so the likelihood ratio of any
    output under two labels is at most :math:`e^\varepsilon` (Warner 1965; Ghazi et al., NeurIPS 2021, §3).
    """
    if num_classes < 2:
        raise ValueError(f"randomised response needs at least 2 classes, got {num_classes}")
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"label-DP epsilon must be a positive finite number, got {epsilon}")
    # e^ε / (e^ε + k − 1) written with e^−ε, so a large ε does not overflow
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def label_noise_matrix(epsilon: float, num_classes: int) -> np.ndarray:
    """T[i, j] = P(reported j | true i) of :func:`randomized_response_labels` (public: depends on ε and k only)."""
    keep = label_keep_probability(epsilon, num_classes)
    other = (1.0 - keep) / (num_classes - 1)
    matrix = np.full((num_classes, num_classes), other)
    np.fill_diagonal(matrix, keep)
    return matrix


def randomized_response_labels(
    labels: np.ndarray,
    epsilon: float,
    num_classes: int,
    mask: np.ndarray | None = None,
    *,
    _random_bytes: RandomBytes | None = None,
) -> np.ndarray:
    r"""k-ary randomised response on every label where ``mask`` is true: ε-label-DP, paid once.

    A label is kept with :func:`label_keep_probability`, else replaced by one of the other k − 1
    classes uniformly. Labels outside ``mask`` (and negative ones, "unlabelled") are returned
    unchanged; the input is not modified. Randomness from the OS CSPRNG (``_random_bytes``: tests only).
    """
    labels = np.asarray(labels, dtype=np.int64)
    chosen = np.ones(labels.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).copy()
    chosen &= labels >= 0
    if (labels[chosen] >= num_classes).any():
        raise ValueError(f"labels must be in [0, {num_classes}), got {int(labels[chosen].max())}")
    keep = label_keep_probability(epsilon, num_classes)
    index = np.flatnonzero(chosen)
    flip = secure_uniform(index.size, _random_bytes=_random_bytes) >= keep
    flipped = index[flip]
    # one of the k − 1 other classes, uniformly: shift by 1..k−1 modulo k
    shift = 1 + secure_integers(flipped.size, num_classes - 1, _random_bytes=_random_bytes)
    released = labels.copy()
    released[flipped] = (labels[flipped] + shift) % num_classes
    return released


# --- label-level DP with a prior: RRWithPrior (Ghazi et al., NeurIPS 2021) ----------------------


def _check_priors(priors: np.ndarray) -> np.ndarray:
    priors = np.asarray(priors, dtype=np.float64)
    if priors.ndim != 2 or priors.shape[1] < 2:
        raise ValueError(f"priors must be a (nodes x classes) matrix with at least 2 classes, got {priors.shape}")
    if not np.isfinite(priors).all() or (priors < 0).any():
        raise ValueError("priors must be finite and non-negative")
    return priors


def rr_with_prior_top_k(priors: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    r"""RRWithPrior's candidate set per row: :math:`k^* = \arg\max_{k} \frac{e^\varepsilon}{e^\varepsilon + k - 1}
    \sum_{j \le k} p_{(j)}` (Ghazi et al., "Deep Learning with Label Differential Privacy", NeurIPS 2021, Alg. 2).

    ``priors`` is (nodes × classes), each row a prior p (any non-negative scale: the argmax does not change
    when a row is scaled). Returns ``(order, k)``: the classes of each row sorted by decreasing prior (ties
    by class index, so the set is a function of the prior alone) and k* per row (the smallest maximiser).
    A row of zeros gives the full set (k* = C, plain randomised response).
    """
    priors = _check_priors(priors)
    keep = np.array([label_keep_probability(epsilon, k) if k > 1 else 1.0 for k in range(1, priors.shape[1] + 1)])
    order = np.argsort(-priors, axis=1, kind="stable")
    mass = np.cumsum(np.take_along_axis(priors, order, axis=1), axis=1)
    objective = keep[None, :] * mass
    # a zero prior row makes every objective 0: take the whole set (plain RR) rather than k* = 1
    k = np.where(mass[:, -1] > 0, np.argmax(objective, axis=1) + 1, priors.shape[1])
    return order, k


def rr_with_prior_likelihood(priors: np.ndarray, released: np.ndarray, epsilon: float) -> np.ndarray:
    r"""L[i, y] = P(RRWithPrior outputs ``released[i]`` | true label y) under row i's prior (Ghazi et al. 2021, Alg. 2).

    With :math:`Y_k` the top-k* classes of the prior (:func:`rr_with_prior_top_k`) and o the output (always in
    :math:`Y_k`): :math:`e^\varepsilon/(e^\varepsilon + k^* - 1)` for y = o, :math:`1/(e^\varepsilon + k^* - 1)` for
    the other :math:`y \in Y_k`, :math:`1/k^*` for :math:`y \notin Y_k`. It depends on the prior and the output
    only, so a bank may train on it (the exact likelihood of what it released): post-processing.
    """
    order, k = rr_with_prior_top_k(priors, epsilon)
    released = np.asarray(released, dtype=np.int64)
    rows, classes = order.shape
    keep = np.array([label_keep_probability(epsilon, int(size)) if size > 1 else 1.0 for size in k])
    other = np.where(k > 1, (1.0 - keep) / np.maximum(k - 1, 1), 0.0)
    inside = np.zeros((rows, classes), dtype=bool)
    np.put_along_axis(inside, order, np.arange(classes)[None, :] < k[:, None], axis=1)
    if not inside[np.arange(rows), released].all():
        raise ValueError("a released label outside its prior's top-k* set: RRWithPrior never outputs one")
    likelihood = np.where(inside, other[:, None], 1.0 / k[:, None])
    likelihood[np.arange(rows), released] = keep
    return likelihood


def rr_with_prior_matrix(prior: np.ndarray, epsilon: float) -> np.ndarray:
    r"""M[y, o] = P(RRWithPrior outputs o | true label y) for one prior p (Ghazi et al. 2021, Alg. 2).

    With :math:`Y_k` the top-k* classes of p: for :math:`y \in Y_k`, o = y with
    :math:`e^\varepsilon/(e^\varepsilon + k^* - 1)` and each other :math:`o \in Y_k` with
    :math:`1/(e^\varepsilon + k^* - 1)`; for :math:`y \notin Y_k`, o uniform on :math:`Y_k` (1/k*); classes
    outside :math:`Y_k` are never output (column of zeros). Every non-zero column's largest entry is at most
    :math:`e^\varepsilon` times its smallest, which is the ε-label-DP of the release for a prior that does not
    depend on y.
    """
    prior = np.asarray(prior, dtype=np.float64)[None, :]
    order, k = rr_with_prior_top_k(prior, epsilon)
    top = order[0, : int(k[0])]
    matrix = np.zeros((prior.shape[1], prior.shape[1]))
    matrix[:, top] = rr_with_prior_likelihood(np.repeat(prior, top.size, axis=0), top, epsilon).T
    return matrix


def rr_with_prior_labels(
    labels: np.ndarray,
    priors: np.ndarray,
    epsilon: float,
    mask: np.ndarray | None = None,
    *,
    _random_bytes: RandomBytes | None = None,
) -> np.ndarray:
    r"""RRWithPrior (Ghazi et al., NeurIPS 2021, Alg. 2) on every label where ``mask`` is true: ε-label-DP, paid once.

    Row i of ``priors`` (nodes × classes) is the prior of node i's label; it **must not depend on that
    label** (it may depend on features, links and other nodes' *released* labels), otherwise the guarantee
    does not hold. The true label is kept with :math:`e^\varepsilon/(e^\varepsilon + k^* - 1)` when it is among
    the top-k* classes of the prior (:func:`rr_with_prior_top_k`), else replaced by another of them uniformly;
    a label outside them is replaced by one of them uniformly (:func:`rr_with_prior_matrix`). A uniform prior
    gives k* = C, i.e. :func:`randomized_response_labels`. Labels outside ``mask`` (and negative ones) are
    returned unchanged. Randomness from the OS CSPRNG (``_random_bytes``: tests only).
    """
    labels = np.asarray(labels, dtype=np.int64)
    priors = _check_priors(priors)
    if priors.shape[0] != labels.shape[0]:
        raise ValueError(f"{priors.shape[0]} prior rows for {labels.shape[0]} labels")
    num_classes = priors.shape[1]
    chosen = np.ones(labels.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).copy()
    chosen &= labels >= 0
    if (labels[chosen] >= num_classes).any():
        raise ValueError(f"labels must be in [0, {num_classes}), got {int(labels[chosen].max())}")
    index = np.flatnonzero(chosen)
    order, k = rr_with_prior_top_k(priors[index], epsilon)
    released = labels.copy()
    u = secure_uniform(index.size, _random_bytes=_random_bytes)
    # rows grouped by k*, so each group draws exactly uniform integers below its own bound
    for size in np.unique(k):
        rows = np.flatnonzero(k == size)
        top = order[rows, :size]
        truth = labels[index[rows]]
        inside = (top == truth[:, None]).any(axis=1)
        keep = label_keep_probability(epsilon, int(size)) if size > 1 else 1.0
        stays = inside & (u[rows] < keep)
        # inside and not kept: one of the size − 1 others (shift the true label's rank by 1..size−1);
        # outside: one of the top-size classes uniformly
        moved = np.flatnonzero(inside & ~stays)
        outside = np.flatnonzero(~inside)
        out = truth.copy()
        if moved.size:
            rank = np.argmax(top[moved] == truth[moved, None], axis=1)
            shift = 1 + secure_integers(moved.size, int(size) - 1, _random_bytes=_random_bytes)
            out[moved] = top[moved, (rank + shift) % size]
        if outside.size:
            out[outside] = top[outside, secure_integers(outside.size, int(size), _random_bytes=_random_bytes)]
        released[index[rows]] = out
    return released
