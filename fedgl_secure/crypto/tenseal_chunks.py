"""TenSEAL's chunk wire format: one serialised CKKS vector (TenSEAL's protobuf ``CKKSVectorProto``) holding one
SEAL ciphertext, read from its bytes and written the way TenSEAL does.

The aggregator adds uploads residue by residue (:mod:`~fedgl_secure.crypto.residue_sum`) and a decryptor checks
an upload's ``c1`` (:func:`c1_residues`), both from :func:`read_chunk`, which reads the protobuf fields and the
SEAL ciphertext inside them with every check SEAL's and TenSEAL's loaders make, without a round trip through SEAL.
:func:`tenseal_chunk` wraps a SEAL ciphertext (for complex slots, encrypted by
:mod:`~fedgl_secure.crypto.seal_residues`) in TenSEAL's serialisation, so every other party reads it as any chunk.
It sits above :mod:`~fedgl_secure.crypto.seal_residues`, whose ciphertext layout it reads.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from fedgl_secure.crypto.residues import RingLevel, check_residues
from fedgl_secure.crypto.seal_residues import _SEAL_FAILURES, _ciphertext_members, ciphertext_bytes
from fedgl_secure.errors import CiphertextError


def c1_residues(chunk: bytes, level: RingLevel, where: str) -> np.ndarray:
    """The second polynomial ``c1`` (NTT form, (k, N)) of one serialised TenSEAL chunk, read from its bytes
    (:func:`read_chunk`).

    ``c1`` carries only encryption randomness (``u·a + e1``), never the message: it is what a decryptor may see of
    a single upload to check that what it decrypts is a real sum."""
    return read_chunk(chunk, level, where).polys[1]


@dataclass(frozen=True)
class ChunkCiphertext:
    """One serialised TenSEAL chunk read from its bytes: both polynomials ``(c0, c1)`` in NTT form, shape (2, k, N),
    how many values it holds and its scale."""

    polys: np.ndarray
    size: int
    scale: float


def read_chunk(chunk: bytes, level: RingLevel, where: str) -> ChunkCiphertext:
    """One serialised TenSEAL chunk — TenSEAL's ``CKKSVectorProto`` holding one SEAL ciphertext
    (:func:`tenseal_chunk`) — read from its bytes, with every check SEAL's own loader makes for a CKKS ciphertext
    (parameters id of the data level, two polynomials in NTT form, every residue below its prime, a scale within
    the modulus, no correction factor) and TenSEAL's (one ciphertext, one size, the vector's scale the
    ciphertext's): :class:`CiphertextError` naming the problem otherwise.

    A fifth of the cost of loading the chunk through TenSEAL, and the residues come out as numbers: the aggregator
    adds uploads residue by residue (:mod:`~fedgl_secure.crypto.residue_sum`) instead of loading, adding and
    saving them again through SEAL (whose save always compresses)."""
    if not isinstance(chunk, bytes | bytearray | memoryview):
        raise CiphertextError(f"{where}: expected ciphertext bytes, got {type(chunk).__name__}")
    try:
        return _read_chunk(bytes(chunk), level, where)
    except CiphertextError as error:
        detail = str(error).removeprefix(f"{where}: ")
        size = len(chunk)
        raise CiphertextError(f"{where}: not a CKKS ciphertext of this context ({size} bytes): {detail}") from None


def _read_chunk(chunk: bytes, level: RingLevel, where: str) -> ChunkCiphertext:
    fields = list(_proto_fields(chunk, where))
    ciphertexts = [value for number, value in fields if number == 2]
    if len(ciphertexts) != 1:
        raise CiphertextError(f"{where}: a CKKS vector of {len(ciphertexts)} ciphertexts, expected one")
    sizes = [value for number, value in fields if number == 1]
    if len(sizes) != 1:
        raise CiphertextError(f"{where}: a CKKS vector without one packed size field")
    size, end = _read_varint(sizes[0], 0, where)
    if end != len(sizes[0]):
        raise CiphertextError(f"{where}: a CKKS vector of several sizes, expected one")
    scales = [value for number, value in fields if number == 3]
    if len(scales) != 1 or len(scales[0]) != 8:
        raise CiphertextError(f"{where}: a CKKS vector without its scale")
    members = _ciphertext_members(ciphertexts[0], level, 2)
    (vector_scale,) = struct.unpack("<d", scales[0])
    total_bits = sum(prime.bit_length() for prime in level.moduli)
    if not members.ntt_form:
        raise CiphertextError(f"{where}: a CKKS ciphertext not in NTT form")
    if members.correction != 1:
        raise CiphertextError(f"{where}: a CKKS ciphertext with correction factor {members.correction}, expected 1")
    if not (np.isfinite(members.scale) and members.scale > 0 and np.log2(members.scale) < total_bits):
        raise CiphertextError(f"{where}: a CKKS ciphertext of scale {members.scale!r}, outside (0, 2^{total_bits})")
    if vector_scale != members.scale:
        raise CiphertextError(f"{where}: the vector's scale {vector_scale!r} is not its ciphertext's {members.scale!r}")
    if not 0 < size <= level.degree // 2:
        raise CiphertextError(f"{where}: a CKKS vector of {size} values, a chunk holds 1 to {level.degree // 2}")
    polys = check_residues(level, members.polys, 2, where)
    return ChunkCiphertext(polys, int(size), float(members.scale))


def _read_varint(data: bytes, offset: int, where: str) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data) or shift > 63:
            raise CiphertextError(f"{where}: truncated or malformed CKKS vector (varint at offset {offset})")
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset, shift = offset + 1, shift + 7
        if not byte & 0x80:
            return value, offset


def _proto_fields(data: bytes, where: str) -> Iterator[tuple[int, bytes]]:
    """(field number, value) of a protobuf message's length-delimited and 64-bit fields (all TenSEAL's vector
    uses); anything else is a :class:`CiphertextError`."""
    offset = 0
    while offset < len(data):
        tag, offset = _read_varint(data, offset, where)
        number, wire_type = tag >> 3, tag & 0x7
        if wire_type == 2:
            length, offset = _read_varint(data, offset, where)
            if offset + length > len(data):
                raise CiphertextError(f"{where}: truncated CKKS vector (field {number} runs past the end)")
            yield number, data[offset : offset + length]
            offset += length
        elif wire_type == 1:
            if offset + 8 > len(data):
                raise CiphertextError(f"{where}: truncated CKKS vector (field {number})")
            yield number, data[offset : offset + 8]
            offset += 8
        else:
            raise CiphertextError(f"{where}: not a TenSEAL CKKS vector (field {number} of wire type {wire_type})")


def protobuf_varint(value: int) -> bytes:
    """``value`` as a protobuf varint (TenSEAL's serialisations are protobuf messages)."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tenseal_chunk(ciphertext: sealapi.Ciphertext, size: int) -> bytes:
    """One ciphertext holding ``size`` slots as TenSEAL serialises a CKKS vector (its protobuf
    ``CKKSVectorProto``: 1 packed sizes, 2 SEAL ciphertexts, 3 scale as a double), so ``ts.ckks_vector_from``
    reads it back — byte for byte what ``CKKSVector.serialize`` writes (``tests/test_seal_residues.py``)."""
    raw = ciphertext_bytes(ciphertext)
    sizes = protobuf_varint(size)
    scale = struct.pack("<d", ciphertext.scale)
    return b"".join(
        (b"\x0a", protobuf_varint(len(sizes)), sizes, b"\x12", protobuf_varint(len(raw)), raw, b"\x19", scale)
    )


def tenseal_ciphertext(context: ts.Context, chunk: bytes, where: str) -> tuple[object, int]:
    """The SEAL ciphertext inside one serialised TenSEAL CKKS vector, and how many slots it uses."""
    if not isinstance(chunk, bytes | bytearray | memoryview):
        raise CiphertextError(f"{where}: expected ciphertext bytes, got {type(chunk).__name__}")
    try:
        vector = ts.ckks_vector_from(context, bytes(chunk))
        inner: Sequence = vector.ciphertext()
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"{where}: not a CKKS vector of this context ({len(chunk)} bytes): {error}") from None
    if len(inner) != 1:
        raise CiphertextError(f"{where}: a CKKS vector of {len(inner)} ciphertexts, expected one")
    return inner[0], int(vector.size())
