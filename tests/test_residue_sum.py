"""The aggregator's sum on residues (crypto/residue_sum.py): the same ciphertext SEAL's own addition makes, read
from the upload bytes with every check SEAL's loader makes; bad bytes, foreign parameters and mismatched uploads are
typed errors naming the upload and chunk."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fedgl_secure.crypto import ckks, residue_sum, residues, seal_residues, tenseal_chunks
from fedgl_secure.errors import CiphertextError
from fedgl_secure.policy.he import HEParameters


@pytest.fixture(scope="module")
def public(small_context):
    return ckks.load_public_context(ckks.public_context_bytes(small_context))


def _read(public, chunks, slots, where="upload"):
    return residue_sum.read_upload(public, chunks, slots, where)


def _chunk(level, polys, scale, ntt_form=True, vector_scale=None, size=10) -> bytes:
    """A TenSEAL chunk around an uncompressed SEAL ciphertext of these residues (what a bank could send)."""
    raw = seal_residues._ciphertext_bytes_from(level, polys, scale, ntt_form)
    sizes = tenseal_chunks.protobuf_varint(size)
    scale_bytes = struct.pack("<d", scale if vector_scale is None else vector_scale)
    return b"".join(
        (
            b"\x0a",
            tenseal_chunks.protobuf_varint(len(sizes)),
            sizes,
            b"\x12",
            tenseal_chunks.protobuf_varint(len(raw)),
            raw,
        )
        + (b"\x19", scale_bytes)
    )


@pytest.mark.parametrize("length", [1, 2048, 5000])
def test_the_residue_sum_is_the_ciphertext_seal_adds_and_decrypts_to_the_sum(small_context, public, length):
    rng = np.random.default_rng(length)
    terms = [rng.uniform(-60, 60, length) for _ in range(3)]
    uploads = [ckks.encrypt_vector(public, term) for term in terms]
    summed = residue_sum.add(public, [_read(public, chunks, length) for chunks in uploads])

    level = residues.data_level(public)
    by_seal = ckks.add_serialized(public, uploads)
    assert summed.sizes == tuple(min(2048, length - i * 2048) for i in range(len(by_seal)))
    for polys, chunk in zip(summed.polys, by_seal, strict=True):
        ciphertext, _ = tenseal_chunks.tenseal_ciphertext(public, chunk, "seal's sum")
        np.testing.assert_array_equal(polys, seal_residues.ciphertext_polys(ciphertext, level))
        assert summed.scale == ciphertext.scale
    np.testing.assert_array_equal(summed.c1, summed.polys[:, 1])
    decrypted = ckks.decrypt_vector(small_context, by_seal, length)
    assert np.abs(decrypted - np.sum(terms, axis=0)).max() < 1e-4


def test_truncated_garbage_and_foreign_chunks_are_refused_naming_the_upload(public):
    good = ckks.encrypt_vector(public, np.arange(10.0))
    for bad in (good[0][: len(good[0]) // 2], b"garbage", b""):
        with pytest.raises(CiphertextError, match="upload of 'weights' from 'bank-b', chunk 0"):
            _read(public, [bad], 10, "upload of 'weights' from 'bank-b'")
    with pytest.raises(CiphertextError, match="expected ciphertext bytes"):
        _read(public, ["not bytes"], 10)
    foreign = ckks.create_secret_context(
        HEParameters(poly_modulus_degree=4096, coeff_mod_bit_sizes=(35, 36, 37), global_scale_bits=60)
    )
    with pytest.raises(CiphertextError, match="do not match the data level"):
        _read(public, ckks.encrypt_vector(foreign, np.arange(10.0)), 10)


def test_what_seals_loader_refuses_is_refused(public):
    """Residues at their prime, coefficient form, a scale beyond the modulus, a vector scale other than the
    ciphertext's, a wrong size field: each refused with its name, as SEAL's and TenSEAL's loaders would."""
    level = residues.data_level(public)
    polys = residues.uniform_residues(level, 2)
    scale = 2.0**40
    assert _read(public, [_chunk(level, polys, scale)], 10).scale == scale
    at_prime = polys.copy()
    at_prime[1, 0, 7] = level.moduli[0]
    with pytest.raises(CiphertextError, match="at or above their prime"):
        _read(public, [_chunk(level, at_prime, scale)], 10)
    with pytest.raises(CiphertextError, match="not in NTT form"):
        _read(public, [_chunk(level, polys, scale, ntt_form=False)], 10)
    with pytest.raises(CiphertextError, match="scale"):
        _read(public, [_chunk(level, polys, 2.0**80)], 10)
    with pytest.raises(CiphertextError, match="scale"):
        _read(public, [_chunk(level, polys, -1.0)], 10)
    with pytest.raises(CiphertextError, match="is not its ciphertext's"):
        _read(public, [_chunk(level, polys, scale, vector_scale=2.0**41)], 10)
    with pytest.raises(CiphertextError, match="holds 9 values, expected 10"):
        _read(public, [_chunk(level, polys, scale, size=9)], 10)
    with pytest.raises(CiphertextError, match="a chunk holds 1 to 2048"):
        _read(public, [_chunk(level, polys, scale, size=4096)], 10)


def test_mismatched_uploads_are_refused(public):
    short = _read(public, ckks.encrypt_vector(public, np.arange(10.0)), 10)
    longer = _read(public, ckks.encrypt_vector(public, np.arange(11.0)), 11)
    rescaled = _read(public, ckks.encrypt_vector(public, np.arange(10.0), scale_bits=30), 10)
    with pytest.raises(CiphertextError, match="1 ciphertext chunks, expected 2"):
        _read(public, ckks.encrypt_vector(public, np.arange(10.0)), 3000)
    with pytest.raises(CiphertextError, match=r"upload 1: chunks holding \[11\] values"):
        residue_sum.add(public, [short, longer])
    with pytest.raises(CiphertextError, match="upload 1: scale"):
        residue_sum.add(public, [short, rescaled])
    with pytest.raises(CiphertextError, match="no upload"):
        residue_sum.add(public, [])
    uneven = ckks.encrypt_vector(public, np.zeros(2048)) + ckks.encrypt_vector(public, np.arange(10.0), scale_bits=30)
    with pytest.raises(CiphertextError, match="chunks at different scales"):
        _read(public, uneven, 2048 + 10)
