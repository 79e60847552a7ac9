"""The aggregator's homomorphic sum (DESIGN §5.3 step 3), residue by residue.

A CKKS sum is the sum of the ciphertexts' polynomials modulo each data prime. Each upload is read once from its
bytes (:func:`tenseal_chunks.read_chunk`: every check SEAL's loader makes), the ``c1`` its receipt binds is checked from
the same residues, and the sum is ``numpy`` additions — instead of loading every chunk through TenSEAL, adding
there and saving the sum again through SEAL, whose save always compresses (the fusion then read it back once more).
No key is involved: the aggregator adds what it cannot read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import ckks, residues, tenseal_chunks
from fedgl_secure.errors import CiphertextError


@dataclass(frozen=True)
class ChunkedCiphertext:
    """One upload (or a sum of uploads) of one kind: ``polys`` (chunks, 2, k, N) — each chunk's ``(c0, c1)`` in NTT
    form at the data level — the values each chunk holds, and their common scale."""

    polys: np.ndarray
    sizes: tuple[int, ...]
    scale: float

    @property
    def c1(self) -> np.ndarray:
        """Every chunk's ``c1`` (chunks, k, N): encryption randomness only, what decryptors are sent."""
        return self.polys[:, 1]

    @property
    def c0(self) -> np.ndarray:
        """Every chunk's ``c0`` (chunks, k, N): what the aggregator adds the partial decryptions to."""
        return self.polys[:, 0]


def read_upload(context: ts.Context, chunks: Sequence[bytes], slots: int, where: str) -> ChunkedCiphertext:
    """One upload's chunks, read and checked: ciphertexts of ``context``'s data level, as many chunks as ``slots``
    CKKS values take, each holding its share of them, all at one scale. :class:`CiphertextError` names the
    problem otherwise."""
    level = residues.data_level(context)
    per_chunk = ckks.slot_count(context)
    expected = ckks.chunk_count(slots, per_chunk)
    if len(chunks) != expected:
        raise CiphertextError(f"{where}: {len(chunks)} ciphertext chunks, expected {expected} for {slots} values")
    read = [tenseal_chunks.read_chunk(chunk, level, f"{where}, chunk {index}") for index, chunk in enumerate(chunks)]
    for index, chunk in enumerate(read):
        want = min(per_chunk, slots - index * per_chunk)
        if chunk.size != want:
            raise CiphertextError(f"{where}, chunk {index}: holds {chunk.size} values, expected {want}")
    scales = {chunk.scale for chunk in read}
    if len(scales) != 1:
        raise CiphertextError(f"{where}: chunks at different scales {sorted(scales)}")
    return ChunkedCiphertext(np.stack([chunk.polys for chunk in read]), tuple(c.size for c in read), scales.pop())


def add(context: ts.Context, uploads: Sequence[ChunkedCiphertext]) -> ChunkedCiphertext:
    """The homomorphic sum of several banks' uploads of one kind: their polynomials added modulo each prime. The
    uploads must agree on chunks, sizes and scale (CKKS adds only ciphertexts at one scale)."""
    if not uploads:
        raise CiphertextError("nothing to add: no upload given")
    first = uploads[0]
    for position, upload in enumerate(uploads[1:], start=1):
        if upload.polys.shape != first.polys.shape or upload.sizes != first.sizes:
            raise CiphertextError(
                f"upload {position}: chunks holding {list(upload.sizes)} values, the first upload's {list(first.sizes)}"
            )
        if upload.scale != first.scale:
            raise CiphertextError(f"upload {position}: scale {upload.scale!r}, the first upload's {first.scale!r}")
    level = residues.data_level(context)
    total = first.polys.copy()
    for upload in uploads[1:]:
        total = residues.add_mod(total, upload.polys, level)
    return ChunkedCiphertext(total, first.sizes, first.scale)
