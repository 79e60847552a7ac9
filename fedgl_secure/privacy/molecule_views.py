r"""Edge-level randomised response on molecules: the FGCL paper's DP views for graph classification.

Unit of privacy: **one bond of one molecule** (two datasets are neighbours when one molecule's adjacency
differs in one atom pair). A release flips every unordered atom pair of a molecule independently with
:math:`p = 1/(1+e^{\varepsilon})` (Eq. RR, :func:`~fedgl_secure.privacy.edge_mechanisms.flip_probability`), with
uniforms from the OS CSPRNG (:func:`~fedgl_secure.privacy.secure_noise.secure_uniform`): the one bit that
differs between neighbours has likelihood ratio at most :math:`e^{\varepsilon}`, so one release is
ε-edge-DP (pure, δ = 0), and molecules are disjoint, so releasing all of them costs ε (parallel
composition). Each molecule is released **once**, before training; every epoch and round after it is
post-processing. Two fresh releases of the same molecule (FGCL's two views at ε₀ and ε₁) compose:
:func:`views_epsilon` = ε₀ + ε₁ (basic composition, tight for pure DP of two independent releases of
the same bit in the worst case). Features, labels and which molecules a bank holds are not protected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedgl_secure.privacy.edge_mechanisms import flip_probability
from fedgl_secure.privacy.secure_noise import secure_uniform

__all__ = ["flip_pairs", "molecule_pairs", "randomized_response_molecule", "release_views", "views_epsilon"]

RandomBytes = Callable[[int], bytes]


def molecule_pairs(num_atoms: int) -> tuple[np.ndarray, np.ndarray]:
    """All n(n−1)/2 unordered atom pairs ``(i, j)``, i < j, in row-major order."""
    return np.triu_indices(num_atoms, k=1)


def flip_pairs(present: np.ndarray, epsilon: float, *, _random_bytes: RandomBytes | None = None) -> np.ndarray:
    r"""Randomised response on a vector of bits: each flipped independently with :math:`p = 1/(1+e^{\varepsilon})`."""
    flips = secure_uniform(present.size, _random_bytes=_random_bytes) < flip_probability(epsilon)
    return present.astype(bool) ^ flips


def randomized_response_molecule(
    num_atoms: int, edges: np.ndarray, epsilon: float, *, _random_bytes: RandomBytes | None = None
) -> np.ndarray:
    """One ε-edge-DP release of a molecule's adjacency: RR over all its atom pairs; returns the released bonds
    (m' × 2, i < j). ``_random_bytes`` replaces the OS CSPRNG in tests only."""
    i, j = molecule_pairs(num_atoms)
    present = np.zeros((num_atoms, num_atoms), dtype=bool)
    if len(edges):
        present[edges[:, 0], edges[:, 1]] = True
    kept = flip_pairs(present[i, j], epsilon, _random_bytes=_random_bytes)
    return np.stack([i[kept], j[kept]], axis=1).astype(np.int64)


def release_views(
    atoms: Sequence[int], edges: Sequence[np.ndarray], epsilon: float, *, _random_bytes: RandomBytes | None = None
) -> list[np.ndarray]:
    """One release of every molecule (the bonds of each), at ε each: ε-edge-DP for the whole set."""
    return [
        randomized_response_molecule(n, e, epsilon, _random_bytes=_random_bytes)
        for n, e in zip(atoms, edges, strict=True)
    ]


def views_epsilon(view_epsilons: Sequence[float]) -> float:
    """ε spent per bond by fresh releases of the same molecules at ``view_epsilons`` (basic composition: the sum)."""
    return float(sum(view_epsilons))
