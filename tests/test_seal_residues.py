"""crypto/residues.py, crypto/seal_residues.py and crypto/tenseal_chunks.py against TenSEAL itself: residues
round-trip through SEAL's own loader, decrypting to residues and decoding them is exactly ``CKKSVector.decrypt()``,
the pad arithmetic is exact, and corrupt or foreign buffers are refused with a CiphertextError."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts
from scipy import stats

from fedgl_secure.crypto import ckks, seal_residues, tenseal_chunks
from fedgl_secure.crypto.residues import (
    RingLevel,
    add_mod,
    check_residues,
    constant_residues,
    data_level,
    multiply_pointwise,
    signed_residues,
    sub_mod,
    uniform_residues,
)
from fedgl_secure.errors import CiphertextError
from fedgl_secure.policy.he import HEParameters

P_VALUE = 1e-6  # a uniformity test fails by chance once in a million runs


@pytest.fixture(scope="module")
def keys(small_context):
    public = ckks.load_public_context(ckks.public_context_bytes(small_context))
    return small_context, public, data_level(small_context)


@pytest.fixture(scope="module")
def foreign_chunk():
    """A ciphertext of another context (N = 8192)."""
    other = ckks.create_secret_context(
        HEParameters(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 60, 60), global_scale_bits=60)
    )
    [chunk] = ckks.encrypt_vector(other, np.ones(3))
    return other, chunk


def _seal_ciphertext(public, values, scale_bits=None):
    [chunk] = ckks.encrypt_vector(public, np.asarray(values, dtype=np.float64), scale_bits)
    ciphertext, size = tenseal_chunks.tenseal_ciphertext(public, chunk, "test")
    return chunk, ciphertext, size


def uniformity_p_value(values: np.ndarray, prime: int, bins: int = 32) -> float:
    """Chi-square p-value of ``values`` being uniform on ``[0, prime)`` (equal-width bins)."""
    counts = np.bincount((values.astype(np.float64) / prime * bins).astype(np.int64), minlength=bins)
    return float(stats.chisquare(counts).pvalue)


def test_the_data_level_is_where_tenseal_encrypts(keys, small_he):
    secret, public, level = keys
    _, ciphertext, _ = _seal_ciphertext(public, [1.0, 2.0])
    assert tuple(ciphertext.parms_id()) == level.parms_id
    assert level.degree == small_he.poly_modulus_degree
    assert [q.bit_length() for q in level.moduli] == list(small_he.coeff_mod_bit_sizes[:-1])  # special prime dropped
    assert data_level(public) == level  # the public context agrees


def test_decrypt_to_residues_then_decode_is_exactly_tensealsdecrypt(keys):
    secret, public, level = keys
    values = np.random.default_rng(0).uniform(-50, 50, 1500)
    chunk, ciphertext, size = _seal_ciphertext(public, values)
    residues = seal_residues.decrypt(secret, ciphertext, level)
    assert residues.shape == level.shape and residues.dtype == np.uint64
    assert np.all(residues < level.column())
    decoded = seal_residues.decode(public, level, residues, ciphertext.scale)[:size]
    np.testing.assert_array_equal(decoded, np.asarray(ts.ckks_vector_from(secret, chunk).decrypt()))
    assert np.abs(decoded - values).max() < 1e-6


def test_a_wrapped_seal_ciphertext_is_byte_for_byte_tenseals_vector(keys):
    _, public, _ = keys
    for size in (1, 700, ckks.slot_count(public)):  # one- and two-byte size varints
        [chunk] = ckks.encrypt_vector(public, np.ones(size), 20)
        vector = ts.ckks_vector_from(public, chunk)
        assert tenseal_chunks.tenseal_chunk(vector.ciphertext()[0], size) == chunk


def test_complex_slots_encrypt_and_decode_both_parts(keys):
    secret, public, level = keys
    rng = np.random.default_rng(1)
    values = rng.uniform(-50, 50, 900) + 1j * rng.uniform(0, 100, 900)
    [chunk] = ckks.encrypt_vector(public, values, 30)
    ciphertext, size = tenseal_chunks.tenseal_ciphertext(public, chunk, "test")
    assert size == 900 and ciphertext.scale == 2.0**30
    residues = seal_residues.decrypt(secret, ciphertext, level)
    decoded = seal_residues.decode(public, level, residues, ciphertext.scale, complex_slots=True)[:size]
    assert np.abs(decoded.real - values.real).max() < 1e-4 and np.abs(decoded.imag - values.imag).max() < 1e-4
    np.testing.assert_array_equal(seal_residues.decode(public, level, residues, ciphertext.scale)[:size], decoded.real)


def test_residues_round_trip_through_seals_loader(keys):
    secret, public, level = keys
    residues = uniform_residues(level, 1)[0]
    plain = seal_residues.plaintext(public, level, residues, 2.0**36)
    assert plain.is_ntt_form() and tuple(plain.parms_id()) == level.parms_id and plain.scale == 2.0**36
    np.testing.assert_array_equal(seal_residues.residues(plain, level), residues)


def test_encode_is_what_decode_inverts(keys):
    _, public, level = keys
    values = np.linspace(-3.0, 3.0, 700)
    residues = seal_residues.encode(public, level, values, 2.0**30)
    np.testing.assert_allclose(seal_residues.decode(public, level, residues, 2.0**30)[:700], values, atol=1e-6)


def test_adding_residues_to_a_ciphertext_adds_them_to_its_decryption_exactly(keys):
    secret, public, level = keys
    _, ciphertext, _ = _seal_ciphertext(public, np.arange(10.0))
    pad = uniform_residues(level, 1)[0]
    padded = seal_residues.add_residues(public, ciphertext, level, pad)
    reloaded = seal_residues.load_ciphertext(secret, seal_residues.ciphertext_bytes(padded), level, "padded")
    np.testing.assert_array_equal(
        seal_residues.decrypt(secret, reloaded, level),
        add_mod(seal_residues.decrypt(secret, ciphertext, level), pad, level),
    )
    back = sub_mod(add_mod(pad, pad, level), pad, level)
    np.testing.assert_array_equal(back, pad)


def test_a_constant_polynomial_is_that_constant_at_every_ntt_point(keys):
    secret, public, level = keys
    residues = seal_residues.encode(public, level, np.full(level.degree // 2, 5.0), 2.0**20)
    np.testing.assert_array_equal(residues, constant_residues(5 * 2**20, level))


def test_pads_are_uniform_below_every_prime_and_fresh(keys):
    _, _, level = keys
    first, second = uniform_residues(level, 4), uniform_residues(level, 4)
    assert first.shape == (4, *level.shape) and first.dtype == np.uint64
    assert np.all(first < level.column())
    assert not np.array_equal(first, second)
    for row, prime in enumerate(level.moduli):
        assert uniformity_p_value(first[:, row, :].reshape(-1), prime) > P_VALUE
    # the top of the range is reached (a pad drawn from fewer bits would miss it)
    assert first.max() > np.uint64(int(max(level.moduli) * 0.99))


def test_rejection_sampling_discards_words_at_or_above_the_prime(keys):
    _, _, level = keys
    rng = np.random.default_rng(5)
    calls = []

    def biased(count: int) -> bytes:  # first call: only words above every prime; then honest bytes
        calls.append(count)
        return b"\xff" * count if len(calls) == 1 else rng.bytes(count)

    pads = uniform_residues(level, 2, random_bytes=biased)
    assert len(calls) > 1 and np.all(pads < level.column())


def test_foreign_corrupt_and_truncated_ciphertexts_are_refused(keys, foreign_chunk):
    secret, public, level = keys
    chunk, ciphertext, _ = _seal_ciphertext(public, [1.0, 2.0])
    good = seal_residues.ciphertext_bytes(ciphertext)
    assert seal_residues.load_ciphertext(secret, good, level, "good").size() == 2
    with pytest.raises(CiphertextError, match="no SEAL header"):
        seal_residues.load_ciphertext(secret, b"\x00" * 1000, level, "zeros")
    with pytest.raises(CiphertextError, match="no SEAL header"):
        seal_residues.load_ciphertext(secret, chunk, level, "tenseal")  # TenSEAL's own format is not accepted
    with pytest.raises(CiphertextError, match="not a CKKS ciphertext of this context"):
        seal_residues.load_ciphertext(secret, good[: len(good) // 2], level, "truncated")
    with pytest.raises(CiphertextError, match="expected ciphertext bytes"):
        seal_residues.load_ciphertext(secret, "text", level, "str")
    other, chunk = foreign_chunk
    foreign, _ = tenseal_chunks.tenseal_ciphertext(other, chunk, "foreign")
    with pytest.raises(CiphertextError, match="not a CKKS ciphertext of this context"):
        seal_residues.load_ciphertext(secret, seal_residues.ciphertext_bytes(foreign), level, "foreign")


def test_residues_that_are_not_reduced_or_misshapen_are_refused(keys):
    _, public, level = keys
    residues = uniform_residues(level, 1)[0]
    unreduced = residues.copy()
    unreduced[0, 7] = level.moduli[0]
    with pytest.raises(CiphertextError, match="at or above their prime"):
        seal_residues.plaintext(public, level, unreduced, 2.0**36)
    with pytest.raises(CiphertextError, match="expected 1 ciphertexts"):
        seal_residues.plaintext(public, level, residues[:, :-1], 2.0**36)
    with pytest.raises(CiphertextError, match="must be uint64"):
        check_residues(level, residues.astype(np.int64), 1, "signed")
    # a serialised plaintext whose residue is out of range is refused by SEAL's own loader, too
    raw = bytearray(seal_residues._plaintext_bytes(level, residues, 2.0**36))
    raw[-8:] = int(level.moduli[-1]).to_bytes(8, "little")  # the last residue is the last prime's
    plain = seal_residues.sealapi.Plaintext()
    with seal_residues._scratch_file(bytes(raw)) as path, pytest.raises(RuntimeError, match="invalid"):
        plain.load(public.seal_context().data, path)


def test_a_tenseal_vector_of_another_context_is_refused(keys, foreign_chunk):
    _, public, _ = keys
    _, chunk = foreign_chunk
    with pytest.raises(CiphertextError, match="not a CKKS vector of this context"):
        tenseal_chunks.tenseal_ciphertext(public, chunk, "foreign")
    with pytest.raises(CiphertextError, match="not a CKKS vector of this context"):
        tenseal_chunks.tenseal_ciphertext(public, b"garbage", "garbage")


@pytest.mark.parametrize("anonymous", [True, False])
def test_scratch_files_round_trip_and_leave_nothing_behind(keys, monkeypatch, tmp_path, anonymous):
    """SEAL reads and writes paths: an anonymous memory file on Linux, else a private named file removed at once."""
    secret, public, level = keys
    if anonymous and not hasattr(seal_residues.os, "memfd_create"):
        pytest.skip("no memfd_create on this platform")
    monkeypatch.setattr(seal_residues, "_MEMORY_DIR", tmp_path)  # where a named scratch file would go
    if not anonymous:
        monkeypatch.setattr(seal_residues, "_PROC_FDS", str(tmp_path / "no-proc"))
    with seal_residues._scratch_file(b"scratch") as path:
        assert path.startswith(f"{seal_residues._PROC_FDS}/") == anonymous
        assert seal_residues._read(path) == b"scratch"
        assert len(list(tmp_path.iterdir())) == (0 if anonymous else 1)
    chunk, ciphertext, _ = _seal_ciphertext(public, [1.0, 2.0, 3.0])
    raw = seal_residues.ciphertext_bytes(ciphertext)
    loaded = seal_residues.load_ciphertext(secret, raw, level, "round trip")
    np.testing.assert_array_equal(
        seal_residues.decrypt(secret, loaded, level), seal_residues.decrypt(secret, ciphertext, level)
    )
    assert list(tmp_path.iterdir()) == []


def test_residues_read_in_bulk_are_the_coefficients_seal_holds(keys):
    secret, public, level = keys
    _, ciphertext, _ = _seal_ciphertext(public, np.random.default_rng(5).uniform(-9, 9, 300))
    plain = seal_residues.sealapi.Plaintext()
    seal_residues.sealapi.Decryptor(secret.seal_context().data, secret.secret_key().data).decrypt(ciphertext, plain)
    one_by_one = np.fromiter(map(plain.data, range(level.size)), dtype=np.uint64).reshape(level.shape)
    bulk = seal_residues._saved_residues(plain, level)
    assert bulk is not None and bulk.dtype == np.uint64
    np.testing.assert_array_equal(bulk, one_by_one)
    np.testing.assert_array_equal(seal_residues.residues(plain, level), one_by_one)
    other = RingLevel(level.parms_id, level.moduli, level.degree // 2)  # not this plaintext's layout
    assert seal_residues._saved_residues(plain, other) is None


def test_c1_read_from_a_chunks_bytes_is_the_ciphertexts_own(keys):
    """``c1_residues`` reads c1 from TenSEAL's bytes without SEAL: the same residues SEAL holds, for real and for
    complex (packed) chunks; anything that is not one ciphertext of the level is refused by name."""
    secret, public, level = keys
    real = ckks.encrypt_vector(public, np.linspace(-1, 1, 100))[0]
    packed = tenseal_chunks.tenseal_chunk(seal_residues.encrypt_complex(public, np.ones(10) + 1j, 2.0**20), 10)
    for chunk in (real, packed):
        ciphertext, _ = tenseal_chunks.tenseal_ciphertext(public, chunk, "chunk")
        expected = seal_residues.ciphertext_polys(ciphertext, level)[1]
        np.testing.assert_array_equal(tenseal_chunks.c1_residues(chunk, level, "chunk"), expected)
    with pytest.raises(CiphertextError, match="truncated"):
        tenseal_chunks.c1_residues(real[:-100], level, "cut")
    with pytest.raises(CiphertextError, match="0 ciphertexts"):
        tenseal_chunks.c1_residues(b"\x19" + b"\x00" * 8, level, "no ciphertext")
    with pytest.raises(CiphertextError, match="wire type"):
        tenseal_chunks.c1_residues(b"\x08\x01", level, "varint field")


@pytest.mark.parametrize(
    "degree, bits", [(4096, (36, 36, 37)), (4096, (44, 45, 20)), (8192, (50, 51, 60)), (8192, (60, 60, 60))]
)
def test_pointwise_products_equal_seals_multiply_plain(degree, bits):
    """``multiply_pointwise`` gives SEAL's own products — by the float64 quotient estimate (primes up to 50 bits) and
    by Horner's digits (51 and 60 bits) — including residues at q − 1 (the largest operands), and is symmetric."""
    context = ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=list(bits))
    level = data_level(context)
    a, b = uniform_residues(level, 2)
    a[:, :4] = level.column() - 1
    b[:, :2] = level.column() - 1
    expected = seal_residues.multiply_residues(context, level, a, b)
    np.testing.assert_array_equal(multiply_pointwise(level, a, b), expected)
    np.testing.assert_array_equal(multiply_pointwise(level, b, a), expected)
    stacked = multiply_pointwise(level, np.stack([a, b]), b)  # a batch against one factor
    np.testing.assert_array_equal(stacked[0], expected)


@pytest.mark.parametrize("bits", [14, 20, 36, 45, 49, 50, 51, 61, 62])
def test_pointwise_products_equal_exact_integer_products(bits):
    """Both product paths equal Python's exact ``x·y mod q`` for moduli of ``bits`` bits at and around the float
    path's limit, on random operands and on the extremes (0, 1, q − 1, q − 2): the quotient estimate's error is
    corrected, never carried."""
    rng = np.random.default_rng(bits)
    modulus = (1 << bits) - int(rng.integers(1, 1 << min(bits - 2, 20))) | 1  # odd, just below 2^bits
    x = rng.integers(0, modulus, size=4096, dtype=np.uint64)
    y = rng.integers(0, modulus, size=4096, dtype=np.uint64)
    extremes = np.array([0, 1, modulus - 1, modulus - 2], dtype=np.uint64)
    x[:16], y[:16] = np.repeat(extremes, 4), np.tile(extremes, 4)
    level = RingLevel(moduli=(modulus,), degree=4096, parms_id=(0, 0, 0, 0))
    got = multiply_pointwise(level, x.reshape(1, -1), y.reshape(1, -1))[0]
    assert [int(value) for value in got] == [int(a) * int(b) % modulus for a, b in zip(x, y, strict=True)]


def test_batched_ntt_equals_one_polynomial_at_a_time(small_context):
    """``to_ntt_many`` (up to 16 polynomials per SEAL transform) equals ``to_ntt`` polynomial by polynomial, across a
    batch boundary and for a lone polynomial; ``from_ntt`` takes each back."""
    level = data_level(small_context)
    for count in (1, 17):
        rows = np.stack([signed_residues(level, np.arange(level.degree) % 7 - 3 + i) for i in range(count)])
        batched = seal_residues.to_ntt_many(small_context, level, rows)
        for row, transformed in zip(rows, batched, strict=True):
            np.testing.assert_array_equal(transformed, seal_residues.to_ntt(small_context, level, row))
            np.testing.assert_array_equal(seal_residues.from_ntt(small_context, level, transformed), row)
