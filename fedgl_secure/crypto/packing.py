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

The layout (digit width, values per slot, guard bits, the slot budget and the noise model) is computed by
:mod:`fedgl_secure.policy.packing_layout`, from the policy's parameters.
"""

from __future__ import annotations

import numpy as np

from fedgl_secure.errors import CiphertextError, PackingOverflow
from fedgl_secure.policy.packing_layout import (  # the layout is the policy's; the encoding is here
    KindLayout,
    digit_bits,
    guard_bits,
    kind_layout,
    noise_bound,
    quantisation_levels,
    slot_bits,
)

__all__ = [
    "KindLayout",
    "bytes_per_value",
    "decode_sum",
    "dequantise_sum",
    "digit_bits",
    "encode",
    "guard_bits",
    "kind_layout",
    "noise_bound",
    "pack",
    "quantisation_levels",
    "quantise",
    "slot_bits",
    "slot_length",
    "unpack",
]


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
