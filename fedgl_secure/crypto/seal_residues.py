"""SEAL objects to and from residues: the one module that handles SEAL's serialisation byte by byte.

Residues (:mod:`~fedgl_secure.crypto.residues`) become SEAL plaintexts and ciphertexts, and back. TenSEAL 0.3.18's
``sealapi`` has no coefficient setters and no in-memory serialisation, so residues go in through SEAL's own format:
:func:`_plaintext_bytes` writes an *uncompressed* ``Plaintext`` (the layout of SEAL 4's
``Plaintext::save_members``) to a private scratch file and SEAL loads it — and SEAL's loader checks it against the
context (parameters id, coefficient count, every residue below its prime), so a corrupt or foreign buffer is
refused, never half-read. Residues come out the same way, in bulk: SEAL saves the plaintext (zstd-compressed) and
:func:`_saved_residues` reads that layout back, checking every field. Also here: decryption to residues (exact and
flooded), encoding and decoding (only the aggregator decodes the fused plaintext to slots, :func:`decode`), SEAL's
NTT through ciphertext transforms, and complex slots (two packed registers each, ``packing.py``) encoded and
encrypted with SEAL's own encoder and the public key, since TenSEAL's vectors encode only real slots.
TenSEAL's chunk wire format is :mod:`~fedgl_secure.crypto.tenseal_chunks`. ``tests/test_seal_residues.py`` checks
every assumption against TenSEAL itself.

Scratch files are anonymous memory files on Linux (no name anywhere, only this process reaches them), elsewhere
private (0600, ``/dev/shm`` when it exists, so nothing reaches a disk) and removed at once.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from fedgl_secure.crypto.residues import RingLevel, add_mod, check_residues, signed_residues
from fedgl_secure.errors import CiphertextError, ContextError

_SEAL_FAILURES = (RuntimeError, ValueError, TypeError, IndexError, OverflowError)
_HEADER = struct.Struct("<HBBBBHQ")  # SEALHeader: magic, header size, version major/minor, compression, reserved, size
_COMPRESSION_NONE = 0
_COMPRESSION_ZSTD = 2
_PLAIN_FIELDS = struct.Struct("<4QQd")  # a Plaintext's members before its DynArray: parms_id, coeff_count, scale
_MEMORY_DIR = Path("/dev/shm")
_PROC_FDS = "/proc/self/fd"  # a string: pathlib costs more than the file operations themselves here


# --- SEAL objects --------------------------------------------------------------------------------


@contextmanager
def _scratch_file(data: bytes | None = None) -> Iterator[str]:
    """A private scratch file holding ``data``, gone on exit; SEAL's bindings read and write paths only.

    On Linux an anonymous memory file (``memfd_create``): it has no name in any file system, only this process
    reaches it (``/proc/self/fd/N``), and it costs a third less than a named one. Elsewhere a 0600 file in
    ``/dev/shm`` (or the temporary directory), removed at once."""
    if hasattr(os, "memfd_create") and os.path.isdir(_PROC_FDS):
        handle = os.memfd_create("fedgl-ring", os.MFD_CLOEXEC)
        try:
            if data is not None:
                os.write(handle, data)
            yield f"{_PROC_FDS}/{handle}"
        finally:
            os.close(handle)
        return
    base = _MEMORY_DIR if _MEMORY_DIR.is_dir() and os.access(_MEMORY_DIR, os.W_OK) else None
    handle, path = tempfile.mkstemp(prefix="fedgl-ring-", dir=base)
    try:
        with os.fdopen(handle, "wb") as out:
            if data is not None:
                out.write(data)
        yield path
    finally:
        os.unlink(path)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _header(body_size: int) -> bytes:
    seal = sealapi.Serialization.SEALHeader()  # this SEAL build's magic and version
    return _HEADER.pack(
        seal.magic,
        seal.header_size,
        seal.version_major,
        seal.version_minor,
        _COMPRESSION_NONE,
        0,
        _HEADER.size + body_size,
    )


def _plaintext_bytes(level: RingLevel, residues: np.ndarray, scale: float) -> bytes:
    """SEAL 4 ``Plaintext`` serialisation, uncompressed: parms_id, coeff_count, scale, then the DynArray."""
    data = np.ascontiguousarray(residues, dtype="<u8").reshape(-1)
    array = struct.pack("<Q", data.size) + data.tobytes()
    body = _PLAIN_FIELDS.pack(*level.parms_id, data.size, float(scale)) + _header(len(array)) + array
    return _header(len(body)) + body


def _seal(context: ts.Context) -> sealapi.SEALContext:
    return context.seal_context().data


def plaintext(context: ts.Context, level: RingLevel, residues: np.ndarray, scale: float) -> sealapi.Plaintext:
    """A SEAL plaintext (NTT form, data level, ``scale``) holding these residues, loaded and checked by SEAL."""
    shaped = check_residues(level, residues, 1, "plaintext")
    return _loaded(sealapi.Plaintext(), context, _plaintext_bytes(level, shaped, scale), "plaintext")


def _loaded(target, context: ts.Context, data: bytes, what: str):
    """``target`` (a SEAL plaintext or ciphertext) loaded from ``data`` by SEAL, which checks it against the
    context (parameters id, sizes, every residue below its prime)."""
    with _scratch_file(data) as path:
        try:
            target.load(_seal(context), path)
        except _SEAL_FAILURES as error:
            raise CiphertextError(f"SEAL refused the {what} built from residues: {error}") from None
    return target


def residues(plain: sealapi.Plaintext, level: RingLevel) -> np.ndarray:
    """A data-level NTT plaintext's residues, shape (k, N): read in bulk from SEAL's own serialisation
    (:func:`_saved_residues`), or one coefficient at a time when that serialisation is not the one expected."""
    if not plain.is_ntt_form() or tuple(plain.parms_id()) != level.parms_id or plain.coeff_count() != level.size:
        raise CiphertextError("the plaintext is not at the data level in NTT form")
    bulk = _saved_residues(plain, level)
    if bulk is not None:
        return bulk
    return np.fromiter(map(plain.data, range(level.size)), dtype=np.uint64, count=level.size).reshape(level.shape)


def _seal_body(raw: bytes, expected: int) -> bytes:
    """The body of a SEAL serialisation (the object's members), its header checked and its zstd compression (this
    TenSEAL build's default) inflated by Arrow's codec to the ``expected`` size; :class:`CiphertextError` when the
    header is not this build's or the body does not inflate."""
    if len(raw) < _HEADER.size:
        raise CiphertextError("a SEAL serialisation shorter than its header")
    magic, header_size, _, _, compression, _, size = _HEADER.unpack_from(raw)
    if magic != sealapi.Serialization.SEALHeader().magic or header_size != _HEADER.size or size != len(raw):
        raise CiphertextError("a SEAL header this build does not read")
    body = raw[_HEADER.size :]
    if compression == _COMPRESSION_NONE:
        return body
    if compression != _COMPRESSION_ZSTD:
        raise CiphertextError(f"a SEAL serialisation with unknown compression {compression}")
    import pyarrow  # a dependency already (bank data sources); imported here, where it is needed

    try:
        return pyarrow.Codec("zstd").decompress(body, decompressed_size=expected, asbytes=True)
    except (OSError, ValueError) as error:  # pyarrow's ArrowIOError for a corrupt frame
        raise CiphertextError(f"cannot inflate a SEAL serialisation: {error}") from None


def _saved_residues(plain: sealapi.Plaintext, level: RingLevel) -> np.ndarray | None:
    """The residues from ``Plaintext.save``: SEAL writes the layout :func:`_plaintext_bytes` builds, compressed
    with zstd (this TenSEAL build) or not at all; Arrow's zstd codec inflates it. Four times faster than
    N·k calls of ``Plaintext.data(i)``. ``None`` (the caller reads coefficient by coefficient) unless every
    field — header, parameters id, coefficient count, the array's own header and size — is what this level's
    plaintext must hold."""
    with _scratch_file() as path:
        plain.save(path)
        raw = _read(path)
    expected = _PLAIN_FIELDS.size + _HEADER.size + 8 + 8 * level.size
    try:
        body = _seal_body(raw, expected)
    except CiphertextError:
        return None
    magic = _HEADER.unpack_from(raw)[0]
    if len(body) != expected:
        return None
    *parms_id, coeff_count, _ = _PLAIN_FIELDS.unpack_from(body)
    inner = _HEADER.unpack_from(body, _PLAIN_FIELDS.size)
    (count,) = struct.unpack_from("<Q", body, _PLAIN_FIELDS.size + _HEADER.size)
    if (
        tuple(parms_id) != level.parms_id
        or coeff_count != level.size
        or inner[0] != magic
        or inner[4] != _COMPRESSION_NONE
        or inner[6] != _HEADER.size + 8 + 8 * level.size
        or count != level.size
    ):
        return None
    data = np.frombuffer(body, dtype="<u8", count=count, offset=_PLAIN_FIELDS.size + _HEADER.size + 8)
    return data.astype(np.uint64).reshape(level.shape)


def ciphertext_bytes(ciphertext) -> bytes:
    """SEAL's own serialisation of one ciphertext (what the key authority receives)."""
    with _scratch_file() as path:
        ciphertext.save(path)
        return _read(path)


def load_ciphertext(context: ts.Context, data: bytes, level: RingLevel, where: str) -> sealapi.Ciphertext:
    """A SEAL ciphertext of this context at the data level: two polynomials in NTT form; anything else is refused.

    SEAL's loader checks the header, the parameters id and every residue against the context."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CiphertextError(f"{where}: expected ciphertext bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) < _HEADER.size or _HEADER.unpack_from(raw)[0] != sealapi.Serialization.SEALHeader().magic:
        raise CiphertextError(f"{where}: not a CKKS ciphertext of this context ({len(raw)} bytes; no SEAL header)")
    ciphertext = sealapi.Ciphertext()
    with _scratch_file(raw) as path:
        try:
            ciphertext.load(_seal(context), path)
        except _SEAL_FAILURES as error:
            raise CiphertextError(
                f"{where}: not a CKKS ciphertext of this context ({len(raw)} bytes; malformed, truncated, or made "
                f"under other parameters): {error}"
            ) from None
    if tuple(ciphertext.parms_id()) != level.parms_id or ciphertext.size() != 2 or not ciphertext.is_ntt_form():
        raise CiphertextError(f"{where}: not a fresh-level two-polynomial CKKS ciphertext in NTT form")
    return ciphertext


def add_residues(context: ts.Context, ciphertext, level: RingLevel, values: np.ndarray) -> sealapi.Ciphertext:
    """``ciphertext + values`` (a plaintext of these residues at the ciphertext's scale) as a new SEAL ciphertext."""
    plain = plaintext(context, level, values, ciphertext.scale)
    total = sealapi.Ciphertext()
    try:
        sealapi.Evaluator(_seal(context)).add_plain(ciphertext, plain, total)
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"cannot add the plaintext to the ciphertext: {error}") from None
    return total


def encode(context: ts.Context, level: RingLevel, values: np.ndarray, scale: float) -> np.ndarray:
    """The residues of CKKS-encoding ``values`` (at most N/2) at ``scale``: the plaintext SEAL's encoder makes."""
    plain = sealapi.Plaintext()
    try:
        sealapi.CKKSEncoder(_seal(context)).encode(
            np.asarray(values, dtype=np.float64).tolist(), list(level.parms_id), float(scale), plain
        )
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"cannot encode {np.size(values)} values at scale {scale:.4g}: {error}") from None
    return residues(plain, level)


def decrypt(secret_context: ts.Context, ciphertext: sealapi.Ciphertext, level: RingLevel) -> np.ndarray:
    """The residues ``c0 + c1·s mod q_i`` of the ciphertext's plaintext — decrypted, not decoded."""
    if not secret_context.has_secret_key():
        raise ContextError("decryption needs the secret context; this one is public")
    plain = sealapi.Plaintext()
    try:
        sealapi.Decryptor(_seal(secret_context), secret_context.secret_key().data).decrypt(ciphertext, plain)
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"SEAL could not decrypt the ciphertext: {error}") from None
    return residues(plain, level)


def decrypt_flooded(
    secret_context: ts.Context, ciphertext: sealapi.Ciphertext, level: RingLevel, flooding_std: float
) -> np.ndarray:
    """The residues of ``c0 + c1·s + E``, with ``E`` fresh flooding noise (:func:`flooding_residues`): what a
    decryptor returns.

    An exact decryption ``c0 + c1·s`` of a ciphertext the requester knows hands it the secret key; a small fresh
    error (σ ≈ 3.2) averages out over repeated queries (one request of 1,000 copies of a chunk was enough). ``E``
    is wide enough that the number of queries the policy allows cannot reveal the ciphertext error, hence the key
    (Li–Micciancio–Schultz–Sorrell, CRYPTO 2022; :func:`fedgl_secure.policy.packing_layout.flooding_std`)."""
    if not secret_context.has_secret_key():
        raise ContextError("decryption needs the secret context; this one is public")
    exact = decrypt(secret_context, ciphertext, level)
    return add_mod(exact, flooding_residues(secret_context, level, 1, flooding_std)[0], level)


def flooding_residues(
    context: ts.Context,
    level: RingLevel,
    count: int,
    std: float,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> np.ndarray:
    """``count`` polynomials with coefficients i.i.d. rounded Gaussians N(0, std²) from the OS CSPRNG, in NTT
    form: shape (count, k, N).

    A rounded continuous Gaussian of this width is statistically as close to the discrete Gaussian as double
    precision can tell. The coefficients go into the NTT domain through SEAL's own transform
    (:func:`to_ntt`). ``random_bytes`` replaces the CSPRNG in tests only."""
    if not (std > 0 and np.isfinite(std)):
        raise ValueError(f"flooding standard deviation must be positive and finite, got {std}")
    seed = int.from_bytes(random_bytes(32), "little")
    generator = np.random.Generator(np.random.PCG64DXSM(seed))
    coefficients = np.rint(generator.normal(0.0, std, size=(count, level.degree))).astype(np.int64)
    return to_ntt_many(context, level, np.stack([signed_residues(level, row) for row in coefficients]))


# --- SEAL's NTT, through ciphertext transforms ------------------------------------------------------

_CIPHER_FIELDS = struct.Struct("<4QBQQQdQ")  # parms_id, is_ntt_form, size, degree, primes, scale, correction


def _ciphertext_bytes_from(level: RingLevel, polys: np.ndarray, scale: float, ntt_form: bool) -> bytes:
    """SEAL 4 ``Ciphertext`` serialisation, uncompressed: its members, then the DynArray of every residue."""
    data = np.ascontiguousarray(polys, dtype="<u8").reshape(-1)
    array = struct.pack("<Q", data.size) + data.tobytes()
    fields = _CIPHER_FIELDS.pack(
        *level.parms_id, int(ntt_form), data.size // level.size, level.degree, len(level.moduli), float(scale), 1
    )
    body = fields + _header(len(array)) + array
    return _header(len(body)) + body


def ciphertext_from(
    context: ts.Context, level: RingLevel, polys: np.ndarray, scale: float, ntt_form: bool = True
) -> sealapi.Ciphertext:
    """A SEAL ciphertext at the data level holding these residues, shape (polynomials, k, N); loaded and checked
    by SEAL (every residue below its prime)."""
    shaped = np.asarray(polys, dtype=np.uint64)
    if shaped.ndim != 3 or shaped.shape[1:] != level.shape or shaped.shape[0] < 2:
        raise CiphertextError(f"ciphertext residues of shape {shaped.shape}, expected (2+, {level.shape})")
    if np.any(shaped >= level.column()):
        raise CiphertextError("ciphertext residues at or above their prime")
    return _loaded(sealapi.Ciphertext(), context, _ciphertext_bytes_from(level, shaped, scale, ntt_form), "ciphertext")


def ciphertext_polys(ciphertext: sealapi.Ciphertext, level: RingLevel) -> np.ndarray:
    """A data-level ciphertext's residues, shape (polynomials, k, N): read in bulk from SEAL's own serialisation,
    every field checked; anything else is :class:`CiphertextError`."""
    if tuple(ciphertext.parms_id()) != level.parms_id:
        raise CiphertextError("the ciphertext is not at the data level")
    with _scratch_file() as path:
        ciphertext.save(path)
        raw = _read(path)
    return _parse_ciphertext(raw, level, int(ciphertext.size()))


@dataclass(frozen=True)
class _CiphertextMembers:
    polys: np.ndarray  # (polynomials, k, N)
    ntt_form: bool
    scale: float
    correction: int


def _parse_ciphertext(raw: bytes, level: RingLevel, polynomials: int) -> np.ndarray:
    """The residues of a SEAL-serialised data-level ciphertext of ``polynomials`` polynomials, every field
    checked (:class:`CiphertextError` otherwise): SEAL's layout read back without a round trip through SEAL."""
    return _ciphertext_members(raw, level, polynomials).polys


def _ciphertext_members(raw: bytes, level: RingLevel, polynomials: int) -> _CiphertextMembers:
    expected = _CIPHER_FIELDS.size + _HEADER.size + 8 + 8 * polynomials * level.size
    body = _seal_body(raw, expected)
    if len(body) != expected:
        raise CiphertextError(f"SEAL's ciphertext holds {len(body)} bytes, expected {expected}")
    *parms_id, ntt_form, count, degree, primes, scale, correction = _CIPHER_FIELDS.unpack_from(body)
    (values,) = struct.unpack_from("<Q", body, _CIPHER_FIELDS.size + _HEADER.size)
    if (
        tuple(parms_id) != level.parms_id
        or ntt_form not in (0, 1)
        or (count, degree, primes) != (polynomials, level.degree, len(level.moduli))
        or values != polynomials * level.size
    ):
        raise CiphertextError("SEAL's ciphertext fields do not match the data level")
    data = np.frombuffer(body, dtype="<u8", count=values, offset=_CIPHER_FIELDS.size + _HEADER.size + 8)
    polys = data.astype(np.uint64).reshape(polynomials, *level.shape)
    return _CiphertextMembers(polys, bool(ntt_form), scale, correction)


_POLYS_PER_TRANSFORM = 16  # SEAL_CIPHERTEXT_SIZE_MAX: the most polynomials one ciphertext (one transform) holds


def _transformed_many(context: ts.Context, level: RingLevel, residues: np.ndarray, to_ntt_form: bool) -> np.ndarray:
    """Every polynomial of ``residues`` (count, k, N) through SEAL's NTT (or its inverse), up to
    :data:`_POLYS_PER_TRANSFORM` of them per ciphertext: one SEAL load, transform and save per batch."""
    shaped = check_residues(level, residues, len(residues), "polynomials")
    out = np.empty_like(shaped)
    evaluator = sealapi.Evaluator(_seal(context))
    for start in range(0, len(shaped), _POLYS_PER_TRANSFORM):
        batch = shaped[start : start + _POLYS_PER_TRANSFORM]
        # a second polynomial of ones keeps a lone polynomial from making a "transparent" ciphertext SEAL refuses
        padded = batch if len(batch) > 1 else np.concatenate([batch, np.ones((1, *level.shape), dtype=np.uint64)])
        ciphertext = ciphertext_from(context, level, padded, 1.0, ntt_form=not to_ntt_form)
        try:
            if to_ntt_form:
                evaluator.transform_to_ntt_inplace(ciphertext)
            else:
                evaluator.transform_from_ntt_inplace(ciphertext)
        except _SEAL_FAILURES as error:
            raise CiphertextError(f"SEAL's NTT refused the polynomials: {error}") from None
        out[start : start + len(batch)] = ciphertext_polys(ciphertext, level)[: len(batch)]
    return out


def _transformed(context: ts.Context, level: RingLevel, residues: np.ndarray, to_ntt_form: bool) -> np.ndarray:
    shaped = check_residues(level, residues, 1, "polynomial")
    return _transformed_many(context, level, shaped, to_ntt_form)[0]


def to_ntt(context: ts.Context, level: RingLevel, coefficients: np.ndarray) -> np.ndarray:
    """Coefficient-form residues (k, N) in NTT form, by SEAL's own negacyclic NTT (no NTT written here)."""
    return _transformed(context, level, coefficients, True)


def to_ntt_many(context: ts.Context, level: RingLevel, coefficients: np.ndarray) -> np.ndarray:
    """:func:`to_ntt` of every polynomial of ``coefficients`` (count, k, N), batched through SEAL."""
    return _transformed_many(context, level, coefficients, True)


def from_ntt(context: ts.Context, level: RingLevel, values: np.ndarray) -> np.ndarray:
    """NTT-form residues (k, N) back in coefficient form, by SEAL's inverse NTT."""
    return _transformed(context, level, values, False)


def multiply_residues(context: ts.Context, level: RingLevel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a · b`` in the ring, both in NTT form (pointwise products modulo each prime), by SEAL's evaluator."""
    left = check_residues(level, a, 1, "left factor")[0]
    ciphertext = ciphertext_from(context, level, np.stack([left, np.ones(level.shape, dtype=np.uint64)]), 1.0)
    factor, product = plaintext(context, level, b, 1.0), sealapi.Ciphertext()
    try:
        sealapi.Evaluator(_seal(context)).multiply_plain(ciphertext, factor, product)
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"SEAL could not multiply the residues: {error}") from None
    return ciphertext_polys(product, level)[0]


def decode(
    context: ts.Context, level: RingLevel, values: np.ndarray, scale: float, complex_slots: bool = False
) -> np.ndarray:
    """The N/2 slots of the plaintext with these residues at ``scale`` (SEAL's CKKS decoder): their real
    parts (float64), or the complex values themselves with ``complex_slots``."""
    plain = plaintext(context, level, values, scale)
    encoder = sealapi.CKKSEncoder(_seal(context))
    try:
        if complex_slots:
            return np.asarray(encoder.decode_complex(plain), dtype=np.complex128)
        return np.asarray(encoder.decode_double(plain), dtype=np.float64)
    except _SEAL_FAILURES as error:
        raise CiphertextError(f"SEAL could not decode the plaintext: {error}") from None


def encrypt_complex(context: ts.Context, values: np.ndarray, scale: float) -> sealapi.Ciphertext:
    """A fresh public-key encryption, at the data level, of up to N/2 complex slot values at ``scale``
    (exactly what TenSEAL does for real ones: SEAL's encoder, then ``Encryptor.encrypt``)."""
    seal = _seal(context)
    plain, ciphertext = sealapi.Plaintext(), sealapi.Ciphertext()
    try:
        sealapi.CKKSEncoder(seal).encode(
            np.asarray(values, dtype=np.complex128).tolist(), seal.first_parms_id(), float(scale), plain
        )
        sealapi.Encryptor(seal, context.public_key().data).encrypt(plain, ciphertext)
    except _SEAL_FAILURES as error:  # "encoded values are too large"
        raise CiphertextError(f"cannot encode {np.size(values)} values at scale {scale:.4g}: {error}") from None
    return ciphertext
