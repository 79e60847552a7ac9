"""RNS residue arithmetic in numpy: the ring ``Z_Q[X]/(X^N + 1)`` of CKKS plaintexts as one vector of ``N``
residues per data prime ``q_i``.

A ciphertext at the data level decrypts (``c0 + c1·s``, SEAL keeps both in NTT form) to the plaintext polynomial
``m + e``; threshold decryption works in that ring (``threshold.py``, ``partial_decryption.py``, ``shamir.py``).
This module holds the level itself (:class:`RingLevel`, :func:`data_level`) and the exact arithmetic on residues
that needs no SEAL object: uniform residues by rejection sampling, sums and differences modulo each prime, signed
and centred coefficients, and pointwise products in uint64 (:func:`multiply_pointwise`). It sits at the bottom of
``crypto/``'s residue code: :mod:`~fedgl_secure.crypto.seal_residues` (SEAL objects to and from residues) and
:mod:`~fedgl_secure.crypto.tenseal_chunks` (TenSEAL's chunk wire format) build on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from fedgl_secure.errors import CiphertextError


@dataclass(frozen=True)
class RingLevel:
    """Where fresh ciphertexts live: SEAL's parameters id of the data level, its primes and the degree ``N``."""

    parms_id: tuple[int, ...]
    moduli: tuple[int, ...]
    degree: int

    @property
    def shape(self) -> tuple[int, int]:
        """One ciphertext's residues: (data primes, N)."""
        return len(self.moduli), self.degree

    @property
    def size(self) -> int:
        return len(self.moduli) * self.degree

    def column(self) -> np.ndarray:
        """The primes as a (k, 1) uint64 column, to broadcast against residues of shape (..., k, N)."""
        return np.asarray(self.moduli, dtype=np.uint64).reshape(-1, 1)


def data_level(context: ts.Context) -> RingLevel:
    """The level TenSEAL encrypts at (SEAL's first data level: every prime but the special one)."""
    seal = context.seal_context().data
    parms_id = seal.first_parms_id()
    parms = seal.get_context_data(parms_id).parms()
    moduli = tuple(int(prime.value()) for prime in parms.coeff_modulus())
    return RingLevel(tuple(int(word) for word in parms_id), moduli, int(parms.poly_modulus_degree()))


def uniform_residues(level: RingLevel, count: int, random_bytes: Callable[[int], bytes] = os.urandom) -> np.ndarray:
    """``count`` ring elements with every residue exactly uniform in ``[0, q_i)``: shape (count, k, N).

    Rejection sampling on ``bit_length(q_i)``-bit words of the OS CSPRNG (``q_i > 2^(bits−1)``, so more than
    half are kept): no modulo bias, so the pad is perfect. ``random_bytes`` replaces the CSPRNG in tests only."""
    out = np.empty((count, *level.shape), dtype=np.uint64)
    for row, prime in enumerate(level.moduli):
        need = count * level.degree
        keep = np.uint64((1 << prime.bit_length()) - 1)
        drawn: list[np.ndarray] = []
        have = 0
        while have < need:
            short = need - have  # SEAL's primes sit just below 2^bits: almost every word is kept
            words = np.frombuffer(random_bytes(8 * (short + short // 8 + 64)), dtype="<u8") & keep
            accepted = words[words < np.uint64(prime)]
            drawn.append(accepted)
            have += accepted.size
        out[:, row, :] = np.concatenate(drawn)[:need].reshape(count, level.degree)
    return out


def check_residues(level: RingLevel, residues: np.ndarray, count: int, what: str) -> np.ndarray:
    """``residues`` as (count, k, N) uint64, each below its prime; otherwise :class:`CiphertextError`."""
    flat = np.asarray(residues)
    if flat.dtype != np.uint64:
        raise CiphertextError(f"{what}: residues must be uint64, got {flat.dtype}")
    if flat.size != count * level.size:
        raise CiphertextError(
            f"{what}: {flat.size} residues, expected {count} ciphertexts x {len(level.moduli)} primes x {level.degree}"
        )
    shaped = flat.reshape(count, *level.shape)
    if np.any(shaped >= level.column()):
        raise CiphertextError(f"{what}: residues at or above their prime (not reduced modulo the data primes)")
    return shaped


def add_mod(a: np.ndarray, b: np.ndarray, level: RingLevel) -> np.ndarray:
    """``(a + b) mod q_i`` for reduced residues (no overflow: SEAL's primes are below 2^61)."""
    return (a + b) % level.column()


def sub_mod(a: np.ndarray, b: np.ndarray, level: RingLevel) -> np.ndarray:
    """``(a − b) mod q_i`` for reduced residues."""
    return (a + (level.column() - b)) % level.column()


def constant_residues(value: int, level: RingLevel) -> np.ndarray:
    """The NTT form of the constant polynomial ``value``: ``value mod q_i`` at every evaluation point."""
    return np.broadcast_to((np.asarray([value % q for q in level.moduli], dtype=np.uint64)).reshape(-1, 1), level.shape)


def signed_residues(level: RingLevel, coefficients: np.ndarray) -> np.ndarray:
    """Signed int64 coefficients (|c| < 2^62) as residues modulo every data prime: shape (k, N)."""
    signed = np.asarray(coefficients, dtype=np.int64).reshape(1, -1)
    return (signed % np.asarray(level.moduli, dtype=np.int64).reshape(-1, 1)).astype(np.uint64)


def centred_coefficients(level: RingLevel, residues: np.ndarray) -> np.ndarray:
    """The centred integer coefficients (Python ints in an object array) of coefficient-form residues (k, N):
    Garner's CRT over the data primes. For tests and attacks: exact, not fast."""
    shaped = np.asarray(residues, dtype=np.uint64).reshape(level.shape)
    value, modulus = shaped[0].astype(object), level.moduli[0]
    for row, prime in enumerate(level.moduli[1:], start=1):
        step = ((shaped[row].astype(object) - value) * pow(modulus, -1, prime)) % prime
        value, modulus = value + modulus * step, modulus * prime
    return np.where(value > modulus // 2, value - modulus, value)


FLOAT_QUOTIENT_MAX_BITS = 50  # primes up to this size take :func:`_products_by_float_quotient`


def multiply_pointwise(level: RingLevel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a · b`` for NTT-form residues (…, k, N) — products of ring elements, point by point modulo each prime — in
    exact uint64 arithmetic, no 128-bit product: a float64 estimate of the quotient for primes of at most
    :data:`FLOAT_QUOTIENT_MAX_BITS` bits (:func:`_products_by_float_quotient`, a third of the cost), Horner over
    digits for larger ones (:func:`_products_by_digits`). The same numbers as SEAL's ``multiply_plain``
    (``tests/test_seal_residues.py``), without its serialisation round trip per call."""
    left, right = np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64)
    if left.shape[-2:] != level.shape or right.shape[-2:] != level.shape:
        raise CiphertextError(f"residues of shapes {left.shape} and {right.shape}, expected (…, {level.shape})")
    left, right = np.broadcast_arrays(left, right)
    out = np.empty(left.shape, dtype=np.uint64)
    for row, prime in enumerate(level.moduli):
        bits = prime.bit_length()
        if bits > 62:
            raise CiphertextError(f"prime {prime} of {bits} bits: pointwise products need primes below 2^62")
        q = np.uint64(prime)
        x, y = left[..., row, :] % q, right[..., row, :] % q
        if bits <= FLOAT_QUOTIENT_MAX_BITS:
            out[..., row, :] = _products_by_float_quotient(x, y, prime)
        else:
            out[..., row, :] = _products_by_digits(x, y, prime)
    return out


def _products_by_float_quotient(x: np.ndarray, y: np.ndarray, prime: int) -> np.ndarray:
    """``x·y mod q`` for reduced ``x, y < q < 2^50``: ``x·y − ⌊x·y/q⌋·q`` taken modulo 2^64, where it is exact, with
    the quotient estimated in float64. Three roundings of relative error 2^−53 put the estimate of a quotient below
    2^50 within 3/8 of the true one, so its floor is off by at most one and the difference lies in [−q, 2q):
    two conditional additions of ``q`` (by the sign bit) bring it into [0, q)."""
    modulus = np.int64(prime)
    estimate = x.astype(np.float64)
    estimate *= y
    estimate *= 1.0 / prime
    np.floor(estimate, out=estimate)
    remainder = (x * y).view(np.int64)  # both products wrap modulo 2^64; their difference is the true one
    remainder -= estimate.astype(np.int64) * modulus
    remainder += (remainder >> 63) & modulus
    remainder -= modulus
    remainder += (remainder >> 63) & modulus
    return remainder.view(np.uint64)


def _products_by_digits(x: np.ndarray, y: np.ndarray, prime: int) -> np.ndarray:
    """``x·y mod q`` for reduced ``x, y < q < 2^62``: Horner over ``y``'s digits of ``w = 63 − bits(q)`` bits, every
    intermediate below ``2^64``."""
    bits = prime.bit_length()
    width = 63 - bits
    q, mask = np.uint64(prime), np.uint64((1 << width) - 1)
    acc = np.zeros(x.shape, dtype=np.uint64)
    for digit in reversed(range(-(-bits // width))):
        acc = (acc << np.uint64(width)) % q  # acc < q < 2^bits: the shift stays below 2^63
        part = (y >> np.uint64(digit * width)) & mask
        acc = (acc + (x * part) % q) % q  # x · part < 2^(bits + width) = 2^63; the sum below 2q
    return acc
