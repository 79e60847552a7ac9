r"""Node-level DP by private class sums: one Gaussian release per bank, the graph used only inside the bank.

The mechanism behind ``dp.node_mechanism = "centroids"`` (:mod:`fedgl_secure.methods.centroids`). What a
bank releases is the matrix of its training customers' feature rows summed per class,

.. math:: S_c = \sum_{i \in L,\, y_i = c} x_i, \qquad \lVert x_i \rVert_2 = 1 \quad \text{(Eq. C1)}

plus Gaussian noise :math:`\mathcal N(0, z^2 I)` drawn once, inside the bank, from the OS CSPRNG
(:func:`release`). Every later use is post-processing: the consortium adds the banks' noisy sums, each bank
scores its own customers by their cosine to the class directions and propagates the scores over its own
graph (:mod:`fedgl_secure.model.centroids`). The bank's graph and its other customers' features never enter
anything that leaves it.

**Sensitivity (Eq. C2, :data:`SENSITIVITY`).** Take neighbouring data sets D and D' = D without customer v
(its features, its label, its links). v enters S only through its own row x_v in row y_v, and only if v is a
training customer; its links enter nothing released. So S moves by at most :math:`\lVert x_v \rVert_2 = 1`
in Frobenius norm, whatever v's degree: no degree bound is needed, and the guarantee holds for the graph
as it is. The release is the Gaussian mechanism with noise multiplier z (std z · 1), accounted once
(q = 1, one step) by Opacus (:func:`releases`).

**What it does not cover.** The bank's scores for its own customers use its graph and every customer's
features exactly; they stay inside the bank (a bank scoring its own customers is not a release). A bank that
publishes those scores releases something this guarantee does not cover.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedgl_secure.privacy import secure_noise
from fedgl_secure.privacy.accounting import AccountantName, GaussianRelease, gaussian_epsilon, smallest_noise_multiplier

RandomBytes = Callable[[int], bytes]

CLASS_SUMS = "class_sums"
"""The ledger channel of the release."""

SENSITIVITY = 1.0
"""Eq. C2: the L2 (Frobenius) sensitivity of S under node add/remove, for unit-norm feature rows."""


def unit_rows(features: np.ndarray) -> np.ndarray:
    """Every row scaled to unit L2 norm (zero rows stay zero): the precondition of Eq. C2."""
    features = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return np.divide(features, norms, out=np.zeros_like(features), where=norms > 0)


def class_sums(rows: np.ndarray, labels: np.ndarray, training: np.ndarray, num_classes: int) -> np.ndarray:
    """Eq. C1: ``S[c] = Σ rows[i]`` over the training customers ``i`` with label ``c`` (``C × F``).

    ``training`` is a boolean mask or an index array; the labels of those customers must lie in [0, C).
    """
    chosen = np.asarray(training)
    chosen = np.flatnonzero(chosen) if chosen.dtype == bool else chosen.astype(np.int64)
    chosen_labels = np.asarray(labels)[chosen]
    if chosen_labels.size and (chosen_labels.min() < 0 or chosen_labels.max() >= num_classes):
        raise ValueError(f"training labels must lie in [0, {num_classes}); got {sorted(set(chosen_labels.tolist()))}")
    sums = np.zeros((num_classes, rows.shape[1]), dtype=np.float64)
    np.add.at(sums, chosen_labels, rows[chosen])
    return sums


def noise_multiplier(epsilon: float, delta: float) -> float:
    """The z with which the one release spends at most ``epsilon`` at ``delta`` (0: ``epsilon = inf``, no DP)."""
    if math.isinf(epsilon):
        return 0.0
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε = {epsilon}, δ = {delta}")
    return smallest_noise_multiplier(epsilon, delta, 1.0, 1)


def release(sums: np.ndarray, z: float, *, _random_bytes: RandomBytes | None = None) -> np.ndarray:
    """``sums`` plus N(0, (z · :data:`SENSITIVITY`)²) on every entry from the OS CSPRNG (``z = 0``: unchanged)."""
    if z == 0:
        return np.array(sums, dtype=np.float64)
    noise = secure_noise.secure_gaussian(sums.size, z * SENSITIVITY, _random_bytes=_random_bytes)
    return sums + noise.reshape(sums.shape)


def releases(z: float, round_number: int = 1) -> list[GaussianRelease]:
    """The one Gaussian release as a ledger entry (none without noise)."""
    if z == 0:
        return []
    return [GaussianRelease(round=round_number, channel=CLASS_SUMS, noise_multiplier=z, sample_rate=1.0, steps=1)]


def spent_epsilon(z: float, delta: float, accountant: AccountantName = "rdp") -> float:
    """ε at ``delta`` of the release with multiplier ``z`` (Opacus; inf without noise)."""
    return math.inf if z == 0 else gaussian_epsilon(releases(z), delta, accountant)
