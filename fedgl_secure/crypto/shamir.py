"""Shamir secret sharing of ring elements, residue by residue (the banks' t-of-n part of the threshold key).

A ring element in NTT form at one level is a vector of ``N`` residues per prime ``q_i``; every residue is an
element of the field ``Z_{q_i}``, and Shamir's scheme runs on each independently: party ``j`` (``1 ≤ j ≤ n``,
the bank's index is its evaluation point) receives ``f(j)`` where ``f(X) = secret + c_1 X + … + c_{t−1} X^{t−1}``
with every ``c_k`` uniform in ``Z_{q_i}``. Sharing is linear, so shares of several secrets add up to shares of
their sum, and any ``t`` shares give it back as ``Σ_j λ_j f(j)`` with the Lagrange coefficients at 0 of the
chosen evaluation points; ``t − 1`` shares are uniformly distributed whatever the secret (Mouchet, Bertrand and
Hubaux, "An Efficient Threshold Access-Structure for RLWE-Based Multiparty Homomorphic Encryption",
J. Cryptology 2023, run over the RNS residues as Lattigo does).

The residues are SEAL's (``residues.RingLevel``): 60-bit primes make products overflow uint64, so the scalar
products here run on Python integers (numpy object arrays) — exact, and only ``O(t·n·k·N)`` of them. This
module offers no reconstruction: the protocol never rebuilds a shared secret, it only multiplies shares by
their Lagrange coefficients inside partial decryptions (``threshold.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from fedgl_secure.crypto.residues import RingLevel, add_mod, multiply_pointwise, uniform_residues
from fedgl_secure.errors import CiphertextError, CryptoError


def check_access_structure(threshold: int, parties: int, level: RingLevel | None = None) -> None:
    """``2 ≤ t ≤ n``, and every evaluation point ``1..n`` a distinct non-zero element of each prime's field.

    ``t = 1`` would hand the whole shared secret to every single party; ``t > n`` could never be met."""
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise CryptoError(f"the threshold must be an integer, got {type(threshold).__name__}")
    if isinstance(parties, bool) or not isinstance(parties, int):
        raise CryptoError(f"the number of parties must be an integer, got {type(parties).__name__}")
    if threshold < 2:
        raise CryptoError(f"threshold t = {threshold}: needs 2 <= t (t = 1 gives every party the whole secret)")
    if threshold > parties:
        raise CryptoError(f"threshold t = {threshold} exceeds the {parties} parties: it could never be met")
    if level is not None and parties >= min(level.moduli):
        raise CryptoError(f"{parties} parties: evaluation points must stay below every prime ({min(level.moduli)})")


def check_indices(indices: Sequence[int], threshold: int, parties: int) -> tuple[int, ...]:
    """A decrypting set: at least ``t`` distinct party indices, each in ``1..n``; returned sorted."""
    chosen = tuple(indices)
    for index in chosen:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise CryptoError(f"party index {index!r} is not an integer")
    unknown = sorted({int(index) for index in chosen if not 1 <= index <= parties})
    if unknown:
        raise CryptoError(f"unknown party indices {unknown}: the parties are 1..{parties}")
    duplicates = sorted({int(index) for index in chosen if chosen.count(index) > 1})
    if duplicates:
        raise CryptoError(f"party indices {duplicates} appear more than once in the set {list(chosen)}")
    if len(chosen) < threshold:
        raise CryptoError(f"{len(chosen)} parties {sorted(chosen)} are fewer than the threshold t = {threshold}")
    return tuple(sorted(int(index) for index in chosen))


def check_element(level: RingLevel, residues: np.ndarray, what: str) -> np.ndarray:
    """One ring element at ``level``: uint64 of shape (k, N), every residue below its prime."""
    if not isinstance(residues, np.ndarray):
        raise CiphertextError(f"{what}: expected a numpy array of residues, got {type(residues).__name__}")
    if residues.dtype != np.uint64:
        raise CiphertextError(f"{what}: residues must be uint64, got {residues.dtype}")
    if residues.shape != level.shape:
        raise CiphertextError(f"{what}: residues of shape {residues.shape}, expected {level.shape} (primes, N)")
    if np.any(residues >= level.column()):
        raise CiphertextError(f"{what}: residues at or above their prime (not reduced modulo {list(level.moduli)})")
    return residues


def scale_rows(level: RingLevel, residues: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    """``residues[i] · factors[i] mod q_i`` for each prime ``i``: exact (:func:`residues.multiply_pointwise`, a
    product of the element with the constant ``factors`` in NTT form)."""
    column = np.asarray([int(factor) % prime for prime, factor in zip(level.moduli, factors, strict=True)], np.uint64)
    return multiply_pointwise(level, residues, np.broadcast_to(column.reshape(-1, 1), level.shape))


def share(
    level: RingLevel,
    secret: np.ndarray,
    threshold: int,
    parties: int,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> np.ndarray:
    """Deal ``secret`` (k, N) to parties ``1..n``: shape (n, k, N), row ``j − 1`` for party ``j``.

    Step "share" of the t-out-of-N setup: a fresh polynomial of degree ``t − 1`` per residue, its non-constant
    coefficients uniform in ``Z_{q_i}`` (``residues.uniform_residues``, OS CSPRNG), evaluated by Horner's
    rule at ``j``. ``random_bytes`` replaces the CSPRNG in tests only."""
    check_access_structure(threshold, parties, level)
    check_element(level, secret, "secret to share")
    coefficients = uniform_residues(level, threshold - 1, random_bytes)
    shares = np.empty((parties, *level.shape), dtype=np.uint64)
    for party in range(1, parties + 1):
        value = coefficients[-1]
        for coefficient in coefficients[-2::-1]:
            value = add_mod(scale_rows(level, value, [party] * len(level.moduli)), coefficient, level)
        shares[party - 1] = add_mod(scale_rows(level, value, [party] * len(level.moduli)), secret, level)
    return shares


def lagrange_coefficients(indices: Sequence[int], prime: int) -> dict[int, int]:
    """``λ_j = Π_{m ≠ j} m / (m − j) mod q`` for each ``j`` of ``indices``: ``f(0) = Σ_j λ_j f(j)`` in ``Z_q``
    for every polynomial of degree below ``len(indices)``. ``indices`` must be distinct and non-zero mod ``q``."""
    chosen = [int(index) for index in indices]
    if len(set(chosen)) != len(chosen) or any(index % prime == 0 for index in chosen):
        raise CryptoError(f"Lagrange coefficients need distinct non-zero points mod {prime}, got {chosen}")
    out = {}
    for index in chosen:
        numerator, denominator = 1, 1
        for other in chosen:
            if other != index:
                numerator = numerator * other % prime
                denominator = denominator * (other - index) % prime
        out[index] = numerator * pow(denominator, -1, prime) % prime
    return out


def lagrange_factors(level: RingLevel, indices: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Each index's Lagrange coefficient at 0 modulo every prime of ``level``: ``{j: (λ_j mod q_1, …)}``."""
    per_prime = [lagrange_coefficients(indices, prime) for prime in level.moduli]
    return {int(index): tuple(table[int(index)] for table in per_prime) for index in indices}
