"""CKKS contexts and vector packing for additions-only secure aggregation (TenSEAL).

No party holds the secret key: the collective public key comes from the key ceremony
(``threshold.py``, ``key_ceremony.py``), and every party works with the *public* context — the
public encryption key only: no secret key, and no Galois or
relinearisation keys, because the aggregator only ever adds ciphertexts. A context is named by
the SHA-256 fingerprint of its public serialisation, which receipts and decryption requests
carry so ciphertexts can never be mixed across contexts unnoticed.

A flat float vector of any length is packed into ciphertexts of N/2 slots each ("chunks"); a
bank's upload for one kind is the list of serialised chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import seal_residues, tenseal_chunks
from fedgl_secure.errors import CiphertextError, ContextError
from fedgl_secure.policy.he import HEParameters


def create_secret_context(params: HEParameters) -> ts.Context:
    """A fresh CKKS key pair (the key authority's job). No Galois keys are generated.

    TenSEAL creates relinearisation keys on its own; they never leave this context because
    :func:`public_context_bytes` does not serialise them.
    """
    try:
        context = ts.context(
            ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree, coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes)
        )
    except (ValueError, RuntimeError) as error:
        raise ContextError(f"cannot create a CKKS context from {params}: {error}") from None
    context.global_scale = float(2**params.global_scale_bits)
    return context


def public_context_bytes(context: ts.Context) -> bytes:
    """The public context: parameters, scale and the public key — nothing else."""
    return context.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def secret_context_bytes(context: ts.Context) -> bytes:
    """The full context including the secret key; only ever stored sealed (see ``sealing.py``)."""
    if not context.has_secret_key():
        raise ContextError("this context holds no secret key to serialise")
    return context.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)


def fingerprint(public_context: bytes) -> str:
    """SHA-256 (hex) of the public context's bytes: the context's name in receipts and requests."""
    return hashlib.sha256(public_context).hexdigest()


def has_secret_key(context: ts.Context) -> bool:
    """Whether ``context`` can decrypt."""
    return bool(context.has_secret_key())


def load_context(data: bytes) -> ts.Context:
    """Deserialise any context (public or secret); garbage gives :class:`ContextError`."""
    try:
        return ts.context_from(data)
    except (ValueError, RuntimeError, TypeError) as error:
        raise ContextError(f"not a serialised TenSEAL context ({len(data)} bytes): {error}") from None


def load_public_context(data: bytes) -> ts.Context:
    """Load the public context an aggregator or bank works with, refusing one that holds more keys.

    A public context carrying a secret key would let its holder decrypt single contributions; one
    carrying evaluation keys is not what the key authority publishes.
    """
    context = load_context(data)
    if context.has_secret_key():
        raise ContextError("the public context holds a secret key; no party may hold one (threshold decryption)")
    if context.has_galois_keys() or context.has_relin_keys():
        raise ContextError("the public context carries Galois/relinearisation keys; additions need only the public key")
    if not context.has_public_key():
        raise ContextError("the public context has no public key to encrypt with")
    return context


def slot_count(context: ts.Context) -> int:
    """Values per ciphertext: N/2, read from the SEAL parameters the context was built with."""
    return int(context.seal_context().data.first_context_data().parms().poly_modulus_degree() // 2)


def chunk_count(length: int, slots: int) -> int:
    """Ciphertexts needed for ``length`` values (at least one; CKKS cannot encrypt an empty vector)."""
    return max(1, -(-length // slots))


def max_chunk_bytes(params: HEParameters) -> int:
    """Upper bound on one serialised ciphertext: 2 polynomials × N coefficients × primes × 8 bytes + slack."""
    return 2 * params.poly_modulus_degree * len(params.coeff_mod_bit_sizes) * 8 + 64 * 1024


def encrypt_vector(context: ts.Context, values: np.ndarray, scale_bits: int | None = None) -> list[bytes]:
    """Encrypt a flat float vector into serialised chunks of N/2 slots (the last one shorter).

    ``scale_bits`` overrides the context's global scale (packed kinds use their guard bits,
    ``crypto/packing.py``); ciphertexts carry their scale, so sums and decryption follow it. A complex
    vector (packed kinds: two registers a slot) fills the slots' imaginary parts too
    (:func:`seal_residues.encrypt_complex`); its chunks read like any other."""
    complex_slots = np.iscomplexobj(values)
    flat = np.ascontiguousarray(values, dtype=np.complex128 if complex_slots else np.float64).reshape(-1)
    if not np.all(np.isfinite(flat)):
        raise CiphertextError("refusing to encrypt NaN or infinite values")
    if flat.size == 0:
        raise CiphertextError("nothing to encrypt: the vector is empty")
    slots = slot_count(context)
    scale = 2.0**scale_bits if scale_bits is not None else context.global_scale
    chunks = []
    for index in range(chunk_count(flat.size, slots)):
        part = flat[index * slots : (index + 1) * slots]
        try:
            if complex_slots:
                chunks.append(
                    tenseal_chunks.tenseal_chunk(seal_residues.encrypt_complex(context, part, scale), part.size)
                )
            else:  # TenSEAL takes the float64 array as it is (no Python list in between)
                chunks.append(ts.ckks_vector(context, part, scale).serialize())
        except (ValueError, CiphertextError) as error:  # "encoded values are too large"
            raise CiphertextError(
                f"chunk {index}: cannot encode values up to {np.abs(part).max():.4g} at this scale ({error})"
            ) from None
    return chunks


def _load_chunk(context: ts.Context, data: bytes, where: str) -> ts.CKKSVector:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CiphertextError(f"{where}: expected ciphertext bytes, got {type(data).__name__}")
    try:
        return ts.ckks_vector_from(context, bytes(data))
    except (ValueError, RuntimeError, TypeError) as error:
        raise CiphertextError(
            f"{where}: not a CKKS ciphertext of this context ({len(data)} bytes; malformed, truncated, or made "
            f"under other parameters): {error}"
        ) from None


def add_serialized(context: ts.Context, contributions: Sequence[Sequence[bytes]]) -> list[bytes]:
    """Homomorphic sum, chunk by chunk, of several banks' uploads of one kind (never decrypts).

    Every ciphertext is validated: it must parse under ``context`` (a ciphertext made under other
    parameters does not), every upload must have the same number of chunks and matching chunk
    sizes. Ciphertexts under a *different key* with identical parameters cannot be told apart
    here; the receipts' context fingerprint is what binds an upload to this context.
    """
    if not contributions:
        raise CiphertextError("nothing to add: no contribution given")
    counts = [len(chunks) for chunks in contributions]
    if len(set(counts)) != 1 or counts[0] == 0:
        raise CiphertextError(f"contributions have different or zero chunk counts: {counts}")
    total: list[ts.CKKSVector] = []
    for position, chunks in enumerate(contributions):
        for index, data in enumerate(chunks):
            vector = _load_chunk(context, data, f"contribution {position}, chunk {index}")
            if position == 0:
                total.append(vector)
                continue
            if vector.size() != total[index].size():
                raise CiphertextError(
                    f"contribution {position}, chunk {index}: {vector.size()} values, expected {total[index].size()}"
                )
            total[index] += vector
    return [vector.serialize() for vector in total]


def decrypt_vector(secret_context: ts.Context, chunks: Sequence[bytes], length: int) -> np.ndarray:
    """Decrypt serialised chunks back into a float64 vector of ``length`` values."""
    if not has_secret_key(secret_context):
        raise ContextError("decryption needs the secret context; this one is public")
    slots = slot_count(secret_context)
    if len(chunks) != chunk_count(length, slots):
        raise CiphertextError(f"{len(chunks)} chunks cannot hold {length} values ({slots} per chunk)")
    values = [np.asarray(_load_chunk(secret_context, data, f"chunk {i}").decrypt()) for i, data in enumerate(chunks)]
    flat = np.concatenate(values) if values else np.zeros(0)
    if flat.size != length:
        raise CiphertextError(f"chunks hold {flat.size} values, expected {length}")
    return flat


def bytes_per_value(context: ts.Context) -> float:
    """Wire size of one value in a full chunk (serialised ciphertext bytes / N/2), measured."""
    slots = slot_count(context)
    sample = np.random.default_rng(0).uniform(-1.0, 1.0, slots)
    return len(encrypt_vector(context, sample)[0]) / slots
