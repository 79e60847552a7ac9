"""Message encodings: how values travel between the parties, whatever carries them (DESIGN §5.5).

* **ciphertext chunks** — a binary body ``b"FGC1" | u32 count | (u64 length | bytes) * count``,
  big-endian (:func:`encode_chunks` / :func:`decode_chunks`);
* **float vectors** — raw little-endian float64 (:func:`encode_float64` / :func:`decode_float64`);
* **residue vectors** — raw little-endian uint64 (:func:`encode_uint64` / :func:`decode_uint64`): what
  the key authority decrypts, the residues of a padded plaintext;
* **array bundles** — an ``.npz`` archive loaded without pickle (:func:`encode_arrays` /
  :func:`decode_arrays`);
* **metadata** next to a binary body — a pydantic model as base64url compact JSON in a header
  (:func:`encode_header` / :func:`decode_header`).

Every decoder assumes hostile input: anything malformed, truncated, oversized, non-finite or
pickled raises :class:`WireError` naming what is wrong and where (byte offset, size, field). The HTTP
conventions around them (error bodies, body limits, OpenAPI) are the services' (``services/http_conventions.py``).
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
import zipfile
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from fedgl_secure.errors import CiphertextError
from fedgl_secure.tomlio import format_validation_error

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Default cap on one request body (a summed ciphertext of ≈ 2M values at N = 8192 fits)."""

CHUNKS_MAGIC = b"FGC1"
_COUNT = struct.Struct(">I")
_LENGTH = struct.Struct(">Q")
_FLOAT64 = np.dtype("<f8")
_UINT64 = np.dtype("<u8")
_NPZ_MAGIC = b"PK\x03\x04"

ModelT = TypeVar("ModelT", bound=BaseModel)


class WireError(CiphertextError):
    """A request or response body, or a metadata header, does not follow the wire format."""


# --- ciphertext chunks --------------------------------------------------------------------------


def encode_chunks(chunks: Sequence[bytes]) -> bytes:
    """Frame serialised ciphertext chunks: magic, u32 count, then u64 length + bytes per chunk."""
    parts = [CHUNKS_MAGIC, _COUNT.pack(len(chunks))]
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise WireError(f"chunk {index}: expected bytes, got {type(chunk).__name__}")
        parts.append(_LENGTH.pack(len(chunk)))
        parts.append(bytes(chunk))
    return b"".join(parts)


def decode_chunks(body: bytes, max_chunks: int, max_chunk_bytes: int) -> list[bytes]:
    """Parse :func:`encode_chunks` framing, refusing anything malformed before copying a byte.

    ``max_chunks`` and ``max_chunk_bytes`` bound what the receiver is willing to hold (the chunk
    count a vector of the announced length needs; the size of one ciphertext under the context).
    """
    body = bytes(body)
    header = len(CHUNKS_MAGIC) + _COUNT.size
    if len(body) < header:
        raise WireError(f"ciphertext body of {len(body)} bytes is shorter than the {header}-byte header (truncated)")
    if body[: len(CHUNKS_MAGIC)] != CHUNKS_MAGIC:
        raise WireError(
            f"ciphertext body does not start with {CHUNKS_MAGIC!r} (got {body[: len(CHUNKS_MAGIC)]!r} at offset 0); "
            "not chunk-framed"
        )
    (count,) = _COUNT.unpack_from(body, len(CHUNKS_MAGIC))
    if count > max_chunks:
        raise WireError(f"ciphertext body announces {count} chunks at offset 4, more than the {max_chunks} allowed")
    chunks, offset = [], header
    for index in range(count):
        if offset + _LENGTH.size > len(body):
            raise WireError(
                f"chunk {index}: length field at offset {offset} is cut off; the body ends at {len(body)} (truncated)"
            )
        (length,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if length > max_chunk_bytes:
            raise WireError(
                f"chunk {index} at offset {offset}: {length} bytes exceeds the {max_chunk_bytes}-byte chunk limit"
            )
        if offset + length > len(body):
            raise WireError(
                f"chunk {index} at offset {offset}: announces {length} bytes but only {len(body) - offset} remain "
                "(truncated)"
            )
        chunks.append(body[offset : offset + length])
        offset += length
    if offset != len(body):
        raise WireError(f"{len(body) - offset} bytes of trailing garbage after the last chunk, at offset {offset}")
    return chunks


# --- float vectors -------------------------------------------------------------------------------


def encode_float64(values: np.ndarray) -> bytes:
    """A flat vector as little-endian float64 bytes; NaN and infinities are refused."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    _check_finite(flat, "float vector")
    return flat.astype(_FLOAT64, copy=False).tobytes()


def decode_float64(body: bytes, expected_length: int) -> np.ndarray:
    """Parse :func:`encode_float64` output of exactly ``expected_length`` finite values."""
    expected_bytes = expected_length * _FLOAT64.itemsize
    if len(body) != expected_bytes:
        raise WireError(
            f"float64 body of {len(body)} bytes; {expected_length} values need exactly {expected_bytes} bytes"
        )
    values = np.frombuffer(bytes(body), dtype=_FLOAT64).astype(np.float64)
    _check_finite(values, "float vector")
    return values


def encode_uint64(values: np.ndarray) -> bytes:
    """A flat array of unsigned 64-bit integers (ring residues) as little-endian bytes."""
    flat = np.asarray(values)
    if flat.dtype != np.uint64:
        raise WireError(f"residue vector: expected uint64 values, got {flat.dtype}")
    return flat.reshape(-1).astype(_UINT64, copy=False).tobytes()


def decode_uint64(body: bytes, expected_length: int | None = None) -> np.ndarray:
    """Parse :func:`encode_uint64` output: a whole number of values, exactly ``expected_length`` when given."""
    if len(body) % _UINT64.itemsize:
        raise WireError(f"uint64 body of {len(body)} bytes is not a whole number of 8-byte values")
    count = len(body) // _UINT64.itemsize
    if expected_length is not None and count != expected_length:
        raise WireError(f"uint64 body of {count} values; expected exactly {expected_length}")
    return np.frombuffer(bytes(body), dtype=_UINT64).astype(np.uint64)


def encode_uint64_frames(arrays: Sequence[np.ndarray]) -> bytes:
    """Several (chunks, k, N) residue arrays (one per upload) as chunk frames, one frame per (array, chunk)."""
    frames = []
    for array in arrays:
        frames += [encode_uint64(np.ascontiguousarray(poly)) for poly in np.asarray(array, dtype=np.uint64)]
    return encode_chunks(frames)


def decode_uint64_frames(body: bytes, arrays: int, chunks: int, shape: tuple[int, int]) -> list[np.ndarray]:
    """:func:`encode_uint64_frames` read back: ``arrays`` arrays of (``chunks``, *``shape``); any other frame count or
    frame size is a :class:`WireError` naming it."""
    size = shape[0] * shape[1]
    frames = decode_chunks(body, arrays * chunks, size * _UINT64.itemsize)
    if len(frames) != arrays * chunks:
        raise WireError(
            f"residue body: {len(frames)} frames; {arrays} arrays of {chunks} chunks make {arrays * chunks}"
        )
    polys = [decode_uint64(frame, size).reshape(shape) for frame in frames]
    return [np.stack(polys[i * chunks : (i + 1) * chunks]) for i in range(arrays)]


def _check_finite(values: np.ndarray, what: str) -> None:
    if values.dtype.kind in "fc" and values.size and not np.all(np.isfinite(values)):
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        raise WireError(f"{what}: {bad.size} NaN or infinite values (first at flat index {int(bad[0])})")


# --- array bundles -------------------------------------------------------------------------------


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of named numeric arrays (never pickled objects)."""
    clean = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype.hasobject:
            raise WireError(f"array {name!r}: dtype {array.dtype} holds Python objects; only numeric arrays travel")
        _check_finite(array, f"array {name!r}")
        clean[name] = array
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **clean)
    return buffer.getvalue()


def decode_arrays(body: bytes, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> dict[str, np.ndarray]:
    """Load an ``.npz`` bundle without pickle (the caller checks the names and shapes it needs).

    ``max_bytes`` caps the *uncompressed* size, so a small compressed archive cannot expand into
    gigabytes. Float arrays must be finite.
    """
    body = bytes(body)
    if not body.startswith(_NPZ_MAGIC):
        raise WireError(f"array bundle of {len(body)} bytes is not an .npz (zip) archive (starts with {body[:4]!r})")
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        raise WireError(f"array bundle of {len(body)} bytes is a damaged .npz archive: {error}") from None
    expanded = sum(info.file_size for info in infos)
    if expanded > max_bytes:
        raise WireError(f"array bundle expands to {expanded} bytes, more than the {max_bytes}-byte limit")
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as archive:
            for name in archive.files:
                try:
                    arrays[name] = np.asarray(archive[name])
                except ValueError as error:  # object arrays: "cannot be loaded when allow_pickle=False"
                    raise WireError(f"array {name!r} is refused: {error} (pickled data never loads)") from None
    except WireError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise WireError(f"array bundle of {len(body)} bytes cannot be read as .npz: {error}") from None
    for name, array in arrays.items():
        _check_finite(array, f"array {name!r}")
    return arrays


# --- metadata headers ----------------------------------------------------------------------------


def encode_header(model: BaseModel) -> str:
    """A pydantic model as base64url (unpadded) compact JSON, fit for an HTTP header value."""
    return base64.urlsafe_b64encode(model.model_dump_json().encode("utf-8")).rstrip(b"=").decode("ascii")


def decode_header(value: str | None, model_type: type[ModelT], header_name: str) -> ModelT:
    """Parse :func:`encode_header` output; problems name the header and every bad field."""
    if value is None or not value.strip():
        raise WireError(f"missing header {header_name}: it must carry the {model_type.__name__} as base64url JSON")
    text = value.strip()
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as error:
        raise WireError(f"header {header_name}: not base64url ({error})") from None
    try:
        return model_type.model_validate_json(raw)
    except ValidationError as error:
        raise WireError(f"header {header_name}: {format_validation_error(error, whole='(whole value)')}") from None
