"""The packing layout of each upload kind under given CKKS parameters: how many quantised values a slot
holds, at which scale, and the worst-case error (pure functions of the policy's numbers; the encoding itself is
:mod:`fedgl_secure.crypto.packing`, whose docstring explains the scheme). It sits with the policy because
``policy check`` and the policy's validation compute it, below every layer that encrypts.

**Slot budget.** No mask shares the slots, so a register holds the packed sum alone: ``P ∈ [0, 2^T)``,
``T = m·b``. The aggregator decodes the fused plaintext with the real part centred on the public ``2^(T−1)``
(:attr:`KindLayout.centre`; a real constant is a constant polynomial, exact in the ring), so the decoder
meets slots with ``|Re z| ≤ 2^(T−1)`` and ``0 ≤ Im z < 2^T``, ``|z| ≤ √5 · 2^(T−1) < 2^(T+0.17)``, i.e.
polynomial coefficients of magnitude below ``2^(T+0.17+g)`` plus the noise (a coefficient is at most the
scale times the largest slot modulus: ``m_k = (2/N)·Re Σ_j z_j ζ_j^−k``). That must stay below ``Q/2``,
about ``2^(log2 Q − 1)`` for SEAL's primes (the largest below ``2^bits`` that are 1 mod 2N):
:func:`slot_bits` keeps ``T ≤ log2 Q − 2 − g``, so the coefficients use at most ``2^−0.83`` of it — room
for the noise and for primes below their power of two — and ``T ≤ 50`` so float64 holds the decoded
value exactly enough. (Real slots alone allowed one bit more, ``T ≤ log2 Q − 1 − g``; the default
policy's layouts use 36 bits either way.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Per-slot error of ONE fresh public-key CKKS encryption (times the scale), as a multiple of N. Measured
# with TenSEAL 0.3.18 (SEAL 4.x, σ = 3.2) at N = 4096 over 36,864 slots: standard deviation 0.167·N, but
# heavy-tailed: the largest single error was 8.8 standard deviations, and over a Cora benchmark (6 banks,
# 20 rounds, masked) 10.5. The model, 8 x 0.35·N·√K, is 16.8 measured standard deviations: ≥ 1.6x the
# worst seen. tests/test_packing.py decodes 7-bank sums through it (unpack refuses anything beyond it).
NOISE_STD_PER_DEGREE = 0.35
NOISE_SIGMAS = 8.0
MAX_EXACT_BITS = 50  # P < 2^50: float64 (53-bit mantissa) holds it with room for the noise's fraction
MIN_STATISTICAL_SECURITY = 30  # bits; OpenFHE's and Li–Micciancio–Schultz–Sorrell's recommended floor


def ciphertext_error_bound(poly_modulus_degree: int, banks: int) -> float:
    """``t``: a bound on the coefficients of a decrypted sum's error (the part that depends on the key).

    The measured per-slot model above (``0.35·N`` per encryption, :data:`NOISE_SIGMAS` out) in coefficient
    units: a polynomial whose coefficients have standard deviation ``c`` has slots of ``√(N/2)·c``."""
    per_coefficient = NOISE_STD_PER_DEGREE * poly_modulus_degree / math.sqrt(poly_modulus_degree / 2)
    return NOISE_SIGMAS * per_coefficient * math.sqrt(max(1, banks))


def flooding_std(poly_modulus_degree: int, banks: int, statistical_security: int, queries: int) -> float:
    """σ of the noise flooding every decryption reply: ``√(12τ) · 2^(s/2) · t``.

    Li, Micciancio, Schultz and Sorrell, "Securing Approximate Homomorphic Encryption Using Differential
    Privacy", CRYPTO 2022 (Corollary 2, with the √(2n) factor removed as OpenFHE's CKKS_NOISE_FLOODING.md
    notes): ``τ`` decryption queries reveal at most ``2^−s`` about the key (statistical distance) when every
    reply carries discrete Gaussian noise of this width on each coefficient; ``t`` is
    :func:`ciphertext_error_bound`. OpenFHE's ``NOISE_FLOODING_DECRYPT`` mode uses the same formula."""
    if statistical_security < MIN_STATISTICAL_SECURITY or queries < 1:
        raise ValueError(
            f"noise flooding needs statistical security >= {MIN_STATISTICAL_SECURITY} bits and >= 1 query, got "
            f"{statistical_security} bits and {queries}"
        )
    return (
        math.sqrt(12 * queries) * 2.0 ** (statistical_security / 2) * ciphertext_error_bound(poly_modulus_degree, banks)
    )


def noise_bound(poly_modulus_degree: int, banks: int, flooding: float = 0.0, decryptors: int = 1) -> float:
    """``|e|`` bound, in scale units, of one slot of a decrypted sum: ``banks`` fresh encryptions plus the flooding
    noise (σ ``flooding`` per coefficient) of each of ``decryptors`` replies (+1: slack for decoding).

    Independent errors add in variance (√K); a fused decryption carries the key authority's and t banks' flooding
    (``HEParameters.fused_flooding_std``)."""
    encryptions = (NOISE_STD_PER_DEGREE * poly_modulus_degree) ** 2 * max(1, banks)
    replies = flooding**2 * poly_modulus_degree / 2 * max(1, decryptors)
    return NOISE_SIGMAS * math.sqrt(encryptions + replies) + 1.0


def guard_bits(poly_modulus_degree: int, max_banks: int, flooding: float) -> int:
    """Smallest ``g`` with ``noise_bound < 2^(g−1)``: the decrypted slot rounds to the exact integer."""
    return math.ceil(math.log2(noise_bound(poly_modulus_degree, max_banks, flooding))) + 1


def slot_bits(poly_modulus_degree: int, data_bits: int, max_banks: int, flooding: float) -> int:
    """Bits a register (half a complex slot) offers to the packed sum: ``min(log2 Q − 2 − g, 50)`` (module
    docstring: a slot's modulus reaches √5 · 2^(T−1) with the real part centred)."""
    return min(data_bits - 2 - guard_bits(poly_modulus_degree, max_banks, flooding), MAX_EXACT_BITS)


def quantisation_levels(lower: float, upper: float, step_bits: int) -> int:
    """``L``: a bank's quantised value lies in ``[0, L]``."""
    return math.ceil((upper - lower) * 2.0**step_bits)


def digit_bits(levels: int, max_banks: int) -> int:
    """``b``: the width that holds a sum of ``max_banks`` values of ``[0, levels]`` without carrying."""
    return (max_banks * levels).bit_length()


@dataclass(frozen=True)
class KindLayout:
    """How one kind's values are quantised and packed under given CKKS parameters."""

    kind: str
    lower: float
    upper: float
    step_bits: int
    levels: int  # L
    digit_bits: int  # b
    per_slot: int  # m
    max_banks: int  # K_max
    scale_bits: int  # g: the ciphertexts' scale is 2^g
    noise_bound: float  # |CKKS error| of a sum over max_banks banks, in slot units (< 1/2 by the guard bits)

    @property
    def step(self) -> float:
        """δ = 2^−step_bits."""
        return 2.0**-self.step_bits

    @property
    def values_per_slot(self) -> int:
        """``2m``: a complex slot holds two registers of ``m`` values."""
        return 2 * self.per_slot

    @property
    def payload_bits(self) -> int:
        """``T = m · b``: the packed sum is below ``2^T``."""
        return self.per_slot * self.digit_bits

    @property
    def error_bound(self) -> float:
        """Worst-case |decoded sum − exact sum| per value, over ``K_max`` banks: ``K_max · δ / 2``."""
        return self.max_banks * self.step / 2

    @property
    def centre(self) -> float:
        """``2^(T−1)``: the middle of the packed range, subtracted before decoding and added back (public)."""
        return 2.0 ** (self.payload_bits - 1)

    def registers(self, length: int) -> int:
        """Packed registers that ``length`` values take: ``⌈length / m⌉`` (at least one)."""
        return max(1, -(-length // self.per_slot))

    def slots(self, length: int) -> int:
        """Complex CKKS slots that ``length`` values take: two registers a slot, ``⌈⌈length / m⌉ / 2⌉``."""
        return -(-self.registers(length) // 2)


def kind_layout(
    kind: str,
    lower: float,
    upper: float,
    step_bits: int,
    *,
    poly_modulus_degree: int,
    data_bits: int,
    max_banks: int,
    flooding: float,
) -> KindLayout:
    """The layout, or ``ValueError`` saying why one value of ``kind`` does not fit a slot."""
    if not upper > lower:
        raise ValueError(f"{kind}: upper ({upper}) must exceed lower ({lower})")
    levels = quantisation_levels(lower, upper, step_bits)
    width = digit_bits(levels, max_banks)
    available = slot_bits(poly_modulus_degree, data_bits, max_banks, flooding)
    guard = guard_bits(poly_modulus_degree, max_banks, flooding)
    if width > available:
        raise ValueError(
            f"{kind}: one value needs {width} bits ({levels + 1} levels x {max_banks} banks) but a slot offers "
            f"{available} (data primes {data_bits} bits - 2 - {guard} guard bits for the noise flooding, at most "
            f"{MAX_EXACT_BITS}); add data primes, lower step_bits, narrow [lower, upper], or lower max_banks"
        )
    return KindLayout(
        kind=kind,
        lower=float(lower),
        upper=float(upper),
        step_bits=step_bits,
        levels=levels,
        digit_bits=width,
        per_slot=available // width,
        max_banks=max_banks,
        scale_bits=guard,
        noise_bound=noise_bound(poly_modulus_degree, max_banks, flooding) / 2.0**guard,
    )
