"""Quantised, packed CKKS slots: several fixed-point values per slot, summed exactly (pure functions).

A CKKS slot holds a real number with an *absolute* error (the encryption noise); with one 60-bit
data prime and a scale of 2^40 most of its bits carry that error's headroom, not data. Packing
turns the slot into an exact integer register instead:

1. **quantise** (fixed point, per kind): a bank's pre-weighted value ``x ∈ [lower, upper]`` becomes
   ``u = rint((x − lower) / δ) ∈ [0, L]``, ``δ = 2^−step_bits``, ``L = ⌈(upper − lower)/δ⌉``.
   The offset ``lower`` handles the sign: ``u`` is never negative. Out-of-range values are refused
   (fail closed), never clipped.
2. **pack** (base 2^b): ``m`` consecutive values go into one *register* as ``P = Σ_j u_j · 2^(b·j)``, with
   the digit width ``b = bit_length(K_max · L)`` so that the sum over up to ``K_max`` banks,
   ``Σ_k u_{k,j} ≤ K_max · L < 2^b``, never carries into the next digit. A CKKS slot is a *complex*
   number, so it holds two registers, ``z = P_{2i} + i·P_{2i+1}``: N/2 slots carry N registers, twice what
   the real part alone would (TenSEAL's vectors use only the real part) for the same encryption.
3. the slot is encrypted at scale ``2^g`` (``g`` guard bits): the sum of ``K`` fresh ciphertexts
   decrypts to ``z + e`` with ``|Re e|, |Im e| < 1/2`` (:func:`guard_bits`), so ``rint`` recovers both
   registers exactly (the encryption error is as large in the imaginary part as in the real part).
4. **unpack**: digits ``D_j = ⌊P / 2^(b·j)⌋ mod 2^b``, and the sum of the values is
   ``Σ_k x_{k,j} ≈ D_j · δ + K · lower``.

**Error bound** (the only error left; CKKS noise is rounded away): each bank's rounding is at most
``δ/2``, so a decoded sum over ``K ≤ K_max`` banks is within ``K · δ/2`` of the exact sum
(:attr:`KindLayout.error_bound` states it at ``K_max``). A sum over more than ``K_max`` banks could
have carried across digits, so :func:`unpack` refuses it (:class:`~fedgl_secure.errors.PackingOverflow`).

**Slot budget.** The key authority's one-time pad lives in the plaintext ring, not in the slots
(``masking.py``), so a register holds the packed sum alone: ``P ∈ [0, 2^T)``, ``T = m·b``. The aggregator
decodes it after removing the pad, with the real part centred on the public ``2^(T−1)``
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

import numpy as np

from fedgl_secure.errors import CiphertextError, PackingOverflow

# Per-slot error of ONE fresh public-key CKKS encryption (times the scale), as a multiple of N. Measured
# with TenSEAL 0.3.18 (SEAL 4.x, σ = 3.2) at N = 4096 over 36,864 slots: standard deviation 0.167·N, but
# heavy-tailed: the largest single error was 8.8 standard deviations, and over a Cora benchmark (6 banks,
# 20 rounds, masked) 10.5. The model, 8 x 0.35·N·√K, is 16.8 measured standard deviations: ≥ 1.6x the
# worst seen. tests/test_packing.py decodes 7-bank sums through it (unpack refuses anything beyond it).
NOISE_STD_PER_DEGREE = 0.35
NOISE_SIGMAS = 8.0
# The key authority's fresh RLWE error on every reply (ring_mask.decrypt_rerandomised): SEAL's σ = 3.2 per
# coefficient, so 3.2·√(N/2) per slot, independent of the banks' errors.
REPLY_ERROR_STD = 3.2
MAX_EXACT_BITS = 50  # P < 2^50: float64 (53-bit mantissa) holds it with room for the noise's fraction


def noise_bound(poly_modulus_degree: int, banks: int) -> float:
    """``|e|`` bound, in scale units, of a sum of ``banks`` fresh encryptions and the key authority's reply
    error (+1: slack for decoding).

    Independent errors add in variance (√K); the one-time pad is added and removed exactly in the ring."""
    encryptions = (NOISE_STD_PER_DEGREE * poly_modulus_degree) ** 2 * max(1, banks)
    reply = REPLY_ERROR_STD**2 * poly_modulus_degree / 2
    return NOISE_SIGMAS * math.sqrt(encryptions + reply) + 1.0


def guard_bits(poly_modulus_degree: int, max_banks: int) -> int:
    """Smallest ``g`` with ``noise_bound < 2^(g−1)``: the decrypted slot rounds to the exact integer."""
    return math.ceil(math.log2(noise_bound(poly_modulus_degree, max_banks))) + 1


def slot_bits(poly_modulus_degree: int, data_bits: int, max_banks: int) -> int:
    """Bits a register (half a complex slot) offers to the packed sum: ``min(log2 Q − 2 − g, 50)`` (module
    docstring: a slot's modulus reaches √5 · 2^(T−1) with the real part centred)."""
    return min(data_bits - 2 - guard_bits(poly_modulus_degree, max_banks), MAX_EXACT_BITS)


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
) -> KindLayout:
    """The layout, or ``ValueError`` saying why one value of ``kind`` does not fit a slot."""
    if not upper > lower:
        raise ValueError(f"{kind}: upper ({upper}) must exceed lower ({lower})")
    levels = quantisation_levels(lower, upper, step_bits)
    width = digit_bits(levels, max_banks)
    available = slot_bits(poly_modulus_degree, data_bits, max_banks)
    if width > available:
        raise ValueError(
            f"{kind}: one value needs {width} bits ({levels + 1} levels x {max_banks} banks) but a slot offers "
            f"{available} (data primes {data_bits} bits - 2 - {guard_bits(poly_modulus_degree, max_banks)} guard "
            f"bits, at most {MAX_EXACT_BITS}); lower step_bits, narrow [lower, upper], or lower max_banks"
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
        scale_bits=guard_bits(poly_modulus_degree, max_banks),
        noise_bound=noise_bound(poly_modulus_degree, max_banks) / 2.0 ** guard_bits(poly_modulus_degree, max_banks),
    )


def quantise(values: np.ndarray, layout: KindLayout) -> np.ndarray:
    """``u = rint((x − lower)/δ)`` as int64; refuses values outside ``[lower, upper]`` (never clips)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(flat)):
        raise CiphertextError(f"{layout.kind}: refusing to quantise NaN or infinite values")
    if flat.size and (flat.min() < layout.lower or flat.max() > layout.upper):
        raise CiphertextError(
            f"{layout.kind}: values in [{flat.min():.6g}, {flat.max():.6g}] leave the packed range "
            f"[{layout.lower:g}, {layout.upper:g}]; widen he.precision.{layout.kind} (lower/upper) in the policy "
            "or set he.packing = 'none'"
        )
    return np.rint((flat - layout.lower) * 2.0**layout.step_bits).astype(np.int64)


def dequantise_sum(digit_sums: np.ndarray, layout: KindLayout, contributors: int) -> np.ndarray:
    """``Σ_k x_k ≈ D · δ + K · lower`` from the digit sums of ``K`` contributors."""
    return np.asarray(digit_sums, dtype=np.float64) * layout.step + contributors * layout.lower


def pack(quantised: np.ndarray, layout: KindLayout) -> np.ndarray:
    """Complex slot values ``z_i = P_{2i} + i·P_{2i+1}``, registers ``P = Σ_j u_j · 2^(b·j)`` (exact in
    float64: ``P < 2^T ≤ 2^50``), ``m`` values per register; a missing last register is 0."""
    flat = np.asarray(quantised, dtype=np.int64).reshape(-1)
    padded = np.zeros(2 * layout.slots(flat.size) * layout.per_slot, dtype=np.int64)
    padded[: flat.size] = flat
    digits = padded.reshape(-1, layout.per_slot)
    shifts = np.arange(layout.per_slot, dtype=np.int64) * layout.digit_bits
    registers = (digits << shifts).sum(axis=1).astype(np.float64)
    return registers[0::2] + 1j * registers[1::2]


def encode(values: np.ndarray, layout: KindLayout) -> np.ndarray:
    """A bank's complex slot vector for ``values``: quantise, then pack."""
    return pack(quantise(values, layout), layout)


def unpack(slot_values: np.ndarray, layout: KindLayout, length: int, contributors: int) -> np.ndarray:
    """The decoded sums of ``length`` values from the (unmasked, decoded) complex slots of ``contributors`` banks.

    Refuses (:class:`PackingOverflow`) a sum over more banks than the digits have headroom for — its
    digits may have carried into each other — and registers outside ``[0, 2^T)`` or farther from an integer
    than the noise bound allows, which only a wrong pad, wrong parameters or an overflow produce.
    """
    if contributors > layout.max_banks:
        raise PackingOverflow(
            f"{layout.kind}: a packed sum over {contributors} banks may have overflowed its digits (headroom for "
            f"he.max_banks = {layout.max_banks}); refusing to decode it — raise he.max_banks in the policy"
        )
    slots = np.asarray(slot_values, dtype=np.complex128).reshape(-1)
    if slots.size != layout.slots(length):
        raise CiphertextError(f"{layout.kind}: {slots.size} slots cannot hold {length} packed values")
    registers = np.stack([slots.real, slots.imag], axis=1).reshape(-1)  # P_0, P_1, ... (the padding too)
    rounded = np.rint(registers)
    worst = float(np.abs(registers - rounded).max())
    top = 2.0**layout.payload_bits
    if worst > layout.noise_bound or rounded.min() < 0 or rounded.max() >= top:
        raise PackingOverflow(
            f"{layout.kind}: decrypted slots are not packed sums (off an integer by up to {worst:.3g}, range "
            f"[{rounded.min():.6g}, {rounded.max():.6g}] vs [0, 2^{layout.payload_bits})): overflow, noise beyond "
            "the guard bits, or a wrong one-time pad"
        )
    packed = rounded.astype(np.int64)
    shifts = np.arange(layout.per_slot, dtype=np.int64) * layout.digit_bits
    digits = (packed[:, None] >> shifts) & ((1 << layout.digit_bits) - 1)
    return dequantise_sum(digits.reshape(-1)[:length], layout, contributors)


def slot_length(layout: KindLayout | None, length: int) -> int:
    """CKKS slots that ``length`` values of a kind take: complex packed slots, or ``length`` when unpacked."""
    return layout.slots(length) if layout is not None else length


def decode_sum(slot_values: np.ndarray, layout: KindLayout | None, length: int, contributors: int) -> np.ndarray:
    """The sum of ``length`` values from unmasked, decoded slots (complex when packed; unchanged when unpacked)."""
    if layout is None:
        return np.asarray(slot_values, dtype=np.float64)
    return unpack(slot_values, layout, length, contributors)


def bytes_per_value(layout: KindLayout | None, bytes_per_slot: float) -> float:
    """Wire bytes per value in full chunks: a slot's bytes over the values it carries (two registers of
    ``m`` when packed, 1 when unpacked)."""
    return bytes_per_slot / (layout.values_per_slot if layout is not None else 1)
