"""A one-time mask on every summed ciphertext, so the key authority never sees a sum in clear.

DESIGN §5.1 lets the key authority learn *ciphertexts of sums only*. Before asking for a
decryption the aggregator adds a fresh mask ``r`` — drawn uniformly from ``[-R, R]`` per value
with the operating system's CSPRNG — to the summed ciphertext as a CKKS *plaintext* (no
encryption needed: the key authority only ever sees what it decrypts); it decrypts ``s + r``,
and only the aggregator, which kept ``r``, can remove it. The mask costs one encoding per chunk
and no precision (CKKS error is absolute, not relative).

Statistical hiding, not perfect: for ``|s_i| ≤ S`` the key authority's view of a value is within
total-variation distance ``S / R`` of a pure mask. Headroom keeps ``|s + r|`` below the wrap-around
bound: banks keep their terms below ``sum_bound / (2 · participants)`` (``upload.check_magnitude``),
so ``|s| ≤ sum_bound / 2``, and ``R = sum_bound / 4``.

Packed kinds (``crypto/packing.py``) hold integers in ``[0, 2^T)`` per slot; their mask is uniform in
``[−R, R)`` with ``R = 2^(T+κ−1)`` plus the public shift ``−2^(T−1)``, which hides a slot's packed sum up
to total-variation distance ``2^−κ`` (``κ`` = ``he.mask_bits``; the lower digits of a slot far better).
:func:`masked_decryption` is the whole aggregator side: mask, have the sum decrypted, unmask, unpack.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import ckks, packing
from fedgl_secure.crypto.ckks_params import sum_bound
from fedgl_secure.errors import CiphertextError

MASK_SHARE = 0.25  # R as a share of the sum bound; the banks' terms may use half of it
TERMS_SHARE = 0.5


def mask_bound(bit_sizes: Sequence[int], scale_bits: int) -> float:
    """``R``: the largest mask value under these CKKS parameters."""
    return sum_bound(bit_sizes, scale_bits) * MASK_SHARE


def draw_mask(length: int, bound: float) -> np.ndarray:
    """``length`` values uniform in ``[-bound, bound)`` from ``os.urandom`` (53 random bits each)."""
    raw = np.frombuffer(os.urandom(8 * length), dtype=np.uint64)
    unit = (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (2.0 * unit - 1.0) * bound


def mask_sum(
    context: ts.Context, summed_chunks: Sequence[bytes], length: int, bound: float, shift: float = 0.0
) -> tuple[list[bytes], np.ndarray]:
    """``(Enc(s) + r, r)``: the masked sum for the key authority and the mask the aggregator keeps
    (``r`` uniform in ``[shift − bound, shift + bound)``)."""
    mask = draw_mask(length, bound) + shift
    slots = ckks.slot_count(context)
    if len(summed_chunks) != ckks.chunk_count(length, slots):
        raise CiphertextError(f"{len(summed_chunks)} chunks cannot hold {length} values ({slots} per chunk)")
    masked = []
    for index, chunk in enumerate(summed_chunks):
        vector = ts.ckks_vector_from(context, bytes(chunk))
        part = mask[index * slots : (index + 1) * slots]
        if vector.size() != part.size:
            raise CiphertextError(f"chunk {index}: holds {vector.size()} values, the mask {part.size}")
        masked.append((vector + part).serialize())
    return masked, mask


def unmask(decrypted: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``s`` from the key authority's ``s + r``."""
    return np.asarray(decrypted, dtype=np.float64) - mask


def masked_decryption(
    context: ts.Context,
    summed_chunks: Sequence[bytes],
    length: int,
    layout: packing.KindLayout | None,
    unpacked_bound: float,
    contributors: int,
    decrypt: Callable[[list[bytes], int], np.ndarray],
) -> np.ndarray:
    """The aggregator's side of one kind's decryption: mask ``Enc(s)``, have ``decrypt(masked chunks,
    slot values)`` (the key authority) decrypt it, unmask, and unpack ``length`` values when packed."""
    slots = packing.slot_length(layout, length)
    bound, shift = (layout.mask_bound, layout.mask_shift) if layout is not None else (unpacked_bound, 0.0)
    masked, mask = mask_sum(context, summed_chunks, slots, bound, shift)
    return packing.decode_sum(unmask(decrypt(masked, slots), mask), layout, length, contributors)
