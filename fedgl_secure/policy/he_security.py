"""Security level of RLWE parameters, from the HomomorphicEncryption.org standard table.

Source: M. Albrecht et al., "Homomorphic Encryption Security Standard", HomomorphicEncryption.org,
Toronto, November 2018, Table 1 (classical security, uniform ternary secret, error σ ≈ 3.2): the
largest total coefficient modulus ``log2 q`` that still gives 128-bit security for each ring
dimension N. SEAL's ``CoeffModulus::MaxBitCount(N, sec_level_type::tc128)`` uses the same numbers.
The whole modulus counts, special (key-switching) prime included, because an attacker sees keys
at the top level.
"""

from __future__ import annotations

from collections.abc import Sequence

# N -> max total bits of q for 128-bit classical security (ternary secret). Read-only.
MAX_LOG_Q_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}


def max_total_bits(poly_modulus_degree: int) -> int:
    """Largest ``Σ log2 q_i`` allowed at 128-bit security for ring dimension N (KeyError-free)."""
    if poly_modulus_degree not in MAX_LOG_Q_128:
        supported = ", ".join(str(n) for n in MAX_LOG_Q_128)
        raise ValueError(f"poly_modulus_degree {poly_modulus_degree} is not in the standard table ({supported})")
    return MAX_LOG_Q_128[poly_modulus_degree]


def security_check(poly_modulus_degree: int, bit_sizes: Sequence[int]) -> None:
    """Raise ``ValueError`` unless (N, moduli) reach 128-bit classical security.

    A larger total modulus for the same N makes the lattice problem easier, so the check is an
    upper bound on ``Σ bit_sizes``; the message says how far over the bound the parameters are.
    """
    limit = max_total_bits(poly_modulus_degree)
    total = sum(bit_sizes)
    if total > limit:
        raise ValueError(
            f"total modulus {total} bits exceeds {limit} bits, the 128-bit security bound for "
            f"N={poly_modulus_degree} (HomomorphicEncryption.org standard); use fewer/smaller primes or a larger N"
        )
