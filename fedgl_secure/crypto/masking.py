"""A one-time pad on every summed ciphertext, so the key authority's view is independent of the sum.

DESIGN §5.1 lets the key authority learn *ciphertexts of sums only*. Before asking for a decryption
the aggregator adds a fresh polynomial ``r`` to the summed ciphertext as a plaintext (``c0 + r``), with
every residue of ``r`` uniform in ``[0, q_i)`` from the OS CSPRNG (:func:`ring_mask.uniform_residues`).
The key authority decrypts ``m + e + r mod q`` and returns those *residues* without decoding them;
the aggregator subtracts ``r mod q`` and only then decodes the CKKS slots (and unpacks them when the kind
is packed).

**Perfect hiding.** For any fixed ``m + e``, adding an independent uniform element of the finite group
``Z_Q[X]/(X^N + 1)`` gives a uniform element: the key authority's decryption has exactly the same
distribution for every sum (statistical distance 0), and so does the ciphertext it receives, ``(c0 + r,
c1)``, since ``c0 + r`` is uniform and ``c1`` comes from the banks' encryption randomness alone. Hiding
needs no slot headroom: the mask never passes through the decoder, so it cannot wrap anything. What
must not wrap is the sum itself (``crypto/upload.py`` and ``crypto/packing.py`` keep it below ``q/2``).

**The reply is flooded.** The aggregator knows the ciphertext it sent, and ``c0 + r + c1·s`` is
linear in the secret key: an exact decryption would give it ``s`` in one reply, and a small fresh error
averages away over repeated replies. The key authority therefore decrypts only exact sums of receipted
uploads (their ``c1`` checked), each ciphertext once, and adds noise flooding to every reply
(:func:`ring_mask.decrypt_flooded`), wide enough for the policy's query budget; the decoded sum carries it
as extra CKKS noise (``packing.noise_bound`` counts it, the guard bits absorb it).

**Failing closed.** Unmasking with a wrong pad (or decrypting with a wrong key) gives uniform residues,
whose slots are far outside any sum: packed kinds are refused by :func:`packing.unpack`, unpacked ones
here, when a value reaches the wrap-around bound ``Q / (2·scale)``.

**Central DP noise** is the key authority's: it adds the CKKS encoding of its noise to what it decrypts
(``key_authority.py``), which the pad leaves uniform; the aggregator's result is ``s + noise``.

:func:`masked_decryption` is the whole aggregator side: mask, have the sum decrypted, unmask, decode, unpack.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import ckks, packing, ring_mask
from fedgl_secure.errors import CiphertextError


@dataclass(frozen=True)
class MaskedSum:
    """A padded sum: the ciphertexts for the key authority and what only the aggregator keeps."""

    chunks: list[bytes]  # SEAL ciphertexts (c0 + r, c1): all the key authority receives
    pads: np.ndarray  # r: (chunks, data primes, N) residues, never sent or stored
    scales: tuple[float, ...]
    sizes: tuple[int, ...]  # slots each chunk holds
    level: ring_mask.RingLevel


def mask_sum(context: ts.Context, summed_chunks: Sequence[bytes], slots: int) -> MaskedSum:
    """Pad every chunk of a summed ciphertext (``slots`` values in TenSEAL chunks) with a fresh uniform ``r``."""
    per_chunk = ckks.slot_count(context)
    if len(summed_chunks) != ckks.chunk_count(slots, per_chunk):
        raise CiphertextError(f"{len(summed_chunks)} chunks cannot hold {slots} values ({per_chunk} per chunk)")
    level = ring_mask.data_level(context)
    pads = ring_mask.uniform_residues(level, len(summed_chunks))
    masked, scales, sizes = [], [], []
    for index, chunk in enumerate(summed_chunks):
        ciphertext, size = ring_mask.tenseal_ciphertext(context, chunk, f"chunk {index}")
        expected = min(per_chunk, slots - index * per_chunk)
        if size != expected:
            raise CiphertextError(f"chunk {index}: holds {size} values, expected {expected}")
        masked.append(ring_mask.ciphertext_bytes(ring_mask.add_residues(context, ciphertext, level, pads[index])))
        scales.append(float(ciphertext.scale))
        sizes.append(size)
    return MaskedSum(masked, pads, tuple(scales), tuple(sizes), level)


def unmask(
    context: ts.Context, masked: MaskedSum, view: np.ndarray, offset: float = 0.0, complex_slots: bool = False
) -> np.ndarray:
    """The slot values from the key authority's ``view`` (residues of ``m + e + r``): subtract ``r``, decode.

    ``offset`` is a public constant the sum's slots are known to lie around (packed kinds: the middle of
    ``[0, 2^T)`` in the real part). It is subtracted in the ring before decoding — the NTT form of a constant
    polynomial is that constant at every point, and it is real in every slot — and added back after, so the
    decoder only meets centred real parts. ``complex_slots`` (packed kinds) returns the complex slots."""
    level = masked.level
    observed = ring_mask.check_residues(level, view, len(masked.chunks), "the key authority's reply")
    values = []
    for index, (scale, size) in enumerate(zip(masked.scales, masked.sizes, strict=True)):
        plain = ring_mask.sub_mod(observed[index], masked.pads[index], level)
        if offset:
            plain = ring_mask.sub_mod(plain, ring_mask.constant_residues(round(offset * scale), level), level)
        slots = ring_mask.decode(context, level, plain, scale, complex_slots)[:size]
        bound = math.prod(level.moduli) / (2.0 * scale)  # no sum decodes beyond it: it would have wrapped
        reach = float(max(np.abs(slots.real).max(), np.abs(slots.imag).max())) if slots.size else 0.0
        if not reach < bound:
            raise CiphertextError(
                f"chunk {index}: decrypted values reach {reach:.3g}, beyond the wrap-around bound "
                f"{bound:.3g}: a wrong mask, a wrong key, or a sum that wrapped"
            )
        values.append(slots + offset)
    return np.concatenate(values) if values else np.zeros(0)


def masked_decryption(
    context: ts.Context,
    summed_chunks: Sequence[bytes],
    length: int,
    layout: packing.KindLayout | None,
    contributors: int,
    decrypt: Callable[[list[bytes], int], np.ndarray],
) -> np.ndarray:
    """The aggregator's side of one kind's decryption: pad ``Enc(s)``, have ``decrypt(padded chunks, slot
    values)`` (the key authority) return the padded plaintext's residues, unmask, decode, and unpack
    ``length`` values when packed."""
    slots = packing.slot_length(layout, length)
    masked = mask_sum(context, summed_chunks, slots)
    view = decrypt(masked.chunks, slots)
    offset = layout.centre if layout is not None else 0.0
    slot_values = unmask(context, masked, view, offset, complex_slots=layout is not None)
    return packing.decode_sum(slot_values, layout, length, contributors)
