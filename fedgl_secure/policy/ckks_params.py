"""CKKS parameter constraints for additions-only aggregation (pure functions, no TenSEAL).

The coefficient modulus is a chain of primes ``[q_0, ..., q_{L-1}, p]``: the last prime ``p`` is
SEAL's special (key-switching) prime, the others are *data* primes whose product ``Q`` holds the
encrypted values. A real value ``x`` is encoded as the integer ``round(x · 2^scale)``; because the
aggregation only adds, no rescaling happens and the only constraints are:

* SEAL encodes only if ``bits(|x|·2^scale) + 1 < log2 Q`` (else "encoded values are too large"),
  so one upload needs ``|x| < 2^(log2 Q − scale − 2)``;
* a decrypted sum wraps around modulo ``Q`` silently unless ``|Σ x| < 2^(log2 Q − scale − 1)``;
* the absolute error of a fresh ciphertext is about ``N·σ / 2^scale`` (σ ≈ 3.2), so the scale sets
  the precision (2^40 gives ≈ 1e-8) while the data bits above it set the range.

The special prime ``p`` may be smaller than the data primes. SEAL encrypts under the public key at the key level
and drops ``p`` by dividing with rounding, leaving ``v/p + r0 + r1·s`` of noise, ``|r_i| ≤ 1/2``. For P key
holders (ternary secrets, the collective public key's error a sum of P Gaussians of σ = 3.2) the key-level noise
``v = e·u + e0 + e1·s`` has σ ≈ 3.2·√(4NP/3) and the rounding term σ ≈ √(NP/18): ``v/p`` is ``15.7/p`` of the
rounding term whatever N and P, under 0.1 % for the smallest prime SEAL can use at N = 4096 (14 bits). ``p`` only
ever switches keys, which aggregation by additions never does, so the 128-bit budget is better spent on data
primes: the default chain's 16-bit ``p`` leaves 93 bits of data modulus, where 37 bits left 72.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PRIME_BITS = 60  # SEAL's largest supported prime (SEAL_USER_MOD_BIT_COUNT_MAX)
MIN_SCALE_BITS = 25  # below this, fresh-encryption noise reaches ~1e-3 and fused sums lose 1e-4 accuracy


def min_prime_bits(poly_modulus_degree: int) -> int:
    """Smallest prime size SEAL can find: primes must be ≡ 1 (mod 2N), hence above 2N."""
    return poly_modulus_degree.bit_length() + 1


def data_bits(bit_sizes: Sequence[int]) -> int:
    """``log2 Q``: the bits of the data primes (all but the last, special prime)."""
    return sum(bit_sizes[:-1])


def moduli_problems(poly_modulus_degree: int, bit_sizes: Sequence[int]) -> list[str]:
    """Everything SEAL/TenSEAL would reject (or handle badly) about a prime chain, as messages."""
    problems = []
    if len(bit_sizes) < 2:
        problems.append("needs at least 2 primes: one data prime and the special (key-switching) prime")
    low, high = min_prime_bits(poly_modulus_degree), MAX_PRIME_BITS
    outside = [b for b in bit_sizes if not low <= b <= high]
    if outside:
        problems.append(f"prime sizes {outside} outside [{low}, {high}] bits (primes ≡ 1 mod 2N, at most 60 bits)")
    return problems


def scale_problems(bit_sizes: Sequence[int], scale_bits: int) -> list[str]:
    """Why ``2^scale_bits`` does not fit the data primes, as messages (empty when it does)."""
    if scale_bits < MIN_SCALE_BITS:
        return [f"{scale_bits} bits is below {MIN_SCALE_BITS}: CKKS noise would exceed the 1e-4 precision target"]
    available = data_bits(bit_sizes)
    if scale_bits >= available - 2:
        return [
            f"{scale_bits} bits leaves no room for values: the data primes hold {available} bits and encoding "
            f"needs scale + 2 + bits(|x|) < {available}; lower the scale or enlarge the data prime"
        ]
    return []


def upload_bound(bit_sizes: Sequence[int], scale_bits: int) -> float:
    """Largest ``|x|`` one ciphertext can encode (strict): ``2^(log2 Q − scale − 2)``."""
    return float(2 ** (data_bits(bit_sizes) - scale_bits - 2))


def sum_bound(bit_sizes: Sequence[int], scale_bits: int) -> float:
    """Largest ``|Σ x|`` that decrypts without wrapping around (strict): ``2^(log2 Q − scale − 1)``."""
    return float(2 ** (data_bits(bit_sizes) - scale_bits - 1))
