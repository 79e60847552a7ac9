"""crypto/threshold.py and crypto/shamir.py: dealer-free threshold CKKS (key authority + t of n banks).

One federation (the key authority and 3 banks, t = 2, the realistic N = 4096, [36, 36, 37] parameters at the
policy's scale and flooding) is set up once per module: the banks encrypt with TenSEAL under the collective
public context, the key authority with any 2 or all 3 banks decrypts their sum, and no coalition below the
threshold gets anything but garbage. The key level is checked against SEAL's own keys and an exact negacyclic
product; Shamir sharing against exact reconstruction; every refusal names its problem.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import tenseal as ts
import tenseal.sealapi as sealapi
from scipy import stats

from fedgl_secure.crypto import ckks, residues, seal_residues, shamir, threshold
from fedgl_secure.errors import CiphertextError, ContextError, CryptoError
from fedgl_secure.policy.packing_layout import noise_bound

BANKS, THRESHOLD = 3, 2
FEDERATION = "test-federation"
P_VALUE = 1e-6  # a uniformity test fails by chance once in a million runs


@dataclass(frozen=True)
class Federation:
    rings: threshold.Rings
    crp: np.ndarray
    keys: dict[int, threshold.KeyShare]  # party -> its key share (0: key authority)
    dealt: dict[int, dict[int, np.ndarray]]  # dealer bank -> receiving bank -> Shamir share
    shares: dict[int, threshold.ThresholdShare]  # bank -> S_j
    public_key: np.ndarray
    public_context: bytes
    values: list[np.ndarray]  # each bank's plaintext vector
    chunk: threshold.Chunk  # the homomorphic sum of their uploads
    flooding_std: float
    tolerance: float  # what a decrypted slot may be off by (CKKS encryption + flooding, 8 sigma)

    @property
    def expected(self) -> np.ndarray:
        return np.sum(self.values, axis=0)

    def collective_secret_data_level(self) -> np.ndarray:
        """TEST ONLY: s = s_KA + Σ_b s_b at the data level, which no library function forms."""
        level = self.rings.data
        total = np.zeros(level.shape, dtype=np.uint64)
        for share in self.keys.values():
            total = residues.add_mod(total, share.secret[: len(level.moduli)], level)
        return total


@pytest.fixture(scope="module")
def federation(small_he) -> Federation:
    params = threshold.parameters_context(
        small_he.poly_modulus_degree, small_he.coeff_mod_bit_sizes, 2.0**small_he.global_scale_bits
    )
    rings = threshold.rings_of(params)
    crp = threshold.common_random_polynomial(rings, FEDERATION)
    keys = {party: threshold.generate_key_share(rings, party, crp) for party in range(BANKS + 1)}
    public_key = threshold.collective_public_key(rings, crp, {p: k.public for p, k in keys.items()}, BANKS)
    public = threshold.public_context(rings, public_key)
    dealt = {bank: threshold.deal_shares(rings, keys[bank], THRESHOLD, BANKS) for bank in range(1, BANKS + 1)}
    shares = {
        j: threshold.combine_shares(rings, j, {b: dealt[b][j] for b in dealt}, THRESHOLD, BANKS)
        for j in range(1, BANKS + 1)
    }
    context = ckks.load_public_context(public)
    rng = np.random.default_rng(27)
    values = [rng.uniform(-10.0, 10.0, 1500) for _ in range(BANKS)]
    uploads = [[ts.ckks_vector(context, v).serialize()] for v in values]
    [total] = ckks.add_serialized(context, uploads)
    flooding = small_he.flooding_std()
    degree = small_he.poly_modulus_degree
    # the collective key is a sum of BANKS + 1 ternary secrets: count its encryption noise as that many more
    # encryptions; BANKS + 1 flooded replies at most
    tolerance = noise_bound(degree, BANKS * (BANKS + 1), flooding, BANKS + 1) / 2.0**small_he.global_scale_bits
    return Federation(
        rings,
        crp,
        keys,
        dealt,
        shares,
        public_key,
        public,
        values,
        threshold.chunk_residues(rings, total),
        flooding,
        tolerance,
    )


def _decrypt(fed: Federation, banks: tuple[int, ...]) -> np.ndarray:
    polys = fed.chunk.residues
    partials = [threshold.authority_partial(fed.rings, fed.keys[0], polys, fed.flooding_std)]
    partials += [threshold.bank_partial(fed.rings, fed.shares[j], polys, banks, fed.flooding_std) for j in banks]
    plain = threshold.fuse(fed.rings, polys, partials, THRESHOLD, BANKS)
    return threshold.decode(fed.rings, plain, fed.chunk.scale, fed.chunk.size)


def _raw_decode(fed: Federation, plain: np.ndarray) -> np.ndarray:
    return seal_residues.decode(fed.rings.context, fed.rings.data, plain, fed.chunk.scale)[: fed.chunk.size]


def _centred(prime: int, values: np.ndarray) -> np.ndarray:
    signed = values.astype(object)
    return np.where(signed > prime // 2, signed - prime, signed)


# --- the key level is SEAL's ----------------------------------------------------------------------


def test_the_key_level_is_seals_own(small_context):
    rings = threshold.rings_of(small_context)
    seal = small_context.seal_context().data
    assert rings.key.parms_id == tuple(seal.key_parms_id())
    assert rings.key.moduli[:-1] == rings.data.moduli and len(rings.key.moduli) == 3
    # SEAL's own key pair, read at the key level: the secret key is ternary in coefficient form, and
    # b + a·s (our key-level product) is SEAL's small key error (clipped at 6σ = 19.2)
    secret = seal_residues.residues(small_context.secret_key().data.data(), rings.key)
    b, a = seal_residues.ciphertext_polys(small_context.public_key().data.data(), rings.key)
    coefficients = seal_residues.from_ntt(rings.key_context, rings.key, secret)
    for row, prime in enumerate(rings.key.moduli):
        assert set(_centred(prime, coefficients[row]).tolist()) <= {-1, 0, 1}
    product = seal_residues.multiply_residues(rings.key_context, rings.key, a, secret)
    error = seal_residues.from_ntt(rings.key_context, rings.key, residues.add_mod(b, product, rings.key))
    centred = [_centred(prime, error[row]) for row, prime in enumerate(rings.key.moduli)]
    assert max(abs(int(c)) for c in centred[0]) <= 19
    assert all(np.array_equal(centred[0], other) for other in centred[1:])  # one small integer polynomial


def _negacyclic(a: np.ndarray, b: np.ndarray, prime: int) -> np.ndarray:
    """Exact a·b mod (X^N + 1, prime): 16-bit limbs convolve exactly in int64, Python integers recombine."""
    limbs = 4  # primes up to 64 bits
    split_a = [((a >> (16 * i)) & 0xFFFF).astype(np.int64) for i in range(limbs)]
    split_b = [((b >> (16 * i)) & 0xFFFF).astype(np.int64) for i in range(limbs)]
    full = np.zeros(2 * a.size - 1, dtype=object)
    for i, j in itertools.product(range(limbs), repeat=2):
        full = full + np.convolve(split_a[i], split_b[j]).astype(object) * (1 << (16 * (i + j)))
    wrapped = full[: a.size].copy()
    wrapped[: a.size - 1] -= full[a.size :]
    return (wrapped % prime).astype(np.uint64)


def test_key_level_ntt_and_product_are_the_exact_negacyclic_product(federation):
    rings = federation.rings
    level, context = rings.key, rings.key_context
    a, b = residues.uniform_residues(level, 2)  # uniform residues, taken as coefficient form
    product = seal_residues.multiply_residues(
        context, level, seal_residues.to_ntt(context, level, a), seal_residues.to_ntt(context, level, b)
    )
    got = seal_residues.from_ntt(context, level, product)
    for row, prime in enumerate(level.moduli):
        assert np.array_equal(got[row], _negacyclic(a[row], b[row], prime)), f"prime {prime}"


# --- key generation and the public context ------------------------------------------------------------


def test_the_common_random_polynomial_is_public_and_bound_to_federation_and_parameters(federation, small_context):
    rings = federation.rings
    again = threshold.common_random_polynomial(threshold.rings_of(small_context), FEDERATION)
    assert np.array_equal(again, federation.crp)  # every party, whatever its context, derives the same a
    assert again.shape == rings.key.shape and np.all(again < rings.key.column())
    assert not np.array_equal(threshold.common_random_polynomial(rings, FEDERATION + "-2"), federation.crp)
    other = threshold.rings_of(threshold.parameters_context(4096, [36, 36, 36]))
    assert threshold.crp_seed(other, FEDERATION) != threshold.crp_seed(rings, FEDERATION)
    for row, prime in enumerate(rings.key.moduli):
        assert uniformity_p_value(federation.crp[row], prime) > P_VALUE


def uniformity_p_value(values: np.ndarray, prime: int, bins: int = 32) -> float:
    counts = np.bincount((values.astype(np.float64) / prime * bins).astype(np.int64), minlength=bins)
    return float(stats.chisquare(counts).pvalue)


def test_key_shares_show_no_secret(federation):
    share = federation.keys[1]
    assert repr(share) == "KeyShare(party=1)" and str(share) == repr(share)
    assert "secret" not in repr(federation.shares[1]) and "ThresholdShare(party=1" in repr(federation.shares[1])
    assert federation.keys[0].secret is not federation.keys[1].secret
    assert not np.array_equal(federation.keys[0].secret, federation.keys[1].secret)


def test_the_public_context_holds_the_collective_public_key_and_nothing_secret(federation, small_context, tmp_path):
    rings = federation.rings
    context = ckks.load_public_context(federation.public_context)
    assert not context.has_secret_key() and not context.has_galois_keys() and not context.has_relin_keys()
    assert context.global_scale == rings.context.global_scale
    assert (context.auto_relin, context.auto_rescale, context.auto_mod_switch) == (True, True, True)
    loaded = seal_residues.ciphertext_polys(context.public_key().data.data(), rings.key)
    assert np.array_equal(loaded, federation.public_key)
    assert np.array_equal(federation.public_key[1], federation.crp)
    # the bytes are TenSEAL's own serialisation: loading and saving them again changes nothing, and the
    # encryption parameters are byte for byte those of a context TenSEAL made itself
    assert ckks.public_context_bytes(context) == federation.public_context
    assert threshold.public_context(rings, federation.public_key) == federation.public_context
    theirs = _fields(ckks.public_context_bytes(small_context))
    ours = _fields(federation.public_context)
    assert ours[1] == theirs[1] and set(ours) == set(theirs) == {1, 2}
    # SEAL reads the public key bytes as a PublicKey of the main context (key level, NTT form)
    path = tmp_path / "public.key"
    path.write_bytes(threshold.public_key_bytes(rings, federation.public_key))
    key = sealapi.PublicKey()
    key.load(small_context.seal_context().data, str(path))
    assert tuple(key.parms_id()) == rings.key.parms_id


def _fields(message: bytes) -> dict[int, bytes]:
    """Top-level length-delimited fields of a protobuf message (enough for TenSEALContextProto)."""
    out, position = {}, 0
    while position < len(message):
        key, position = _read_varint(message, position)
        assert key & 7 == 2, "only length-delimited fields expected at the top level"
        size, position = _read_varint(message, position)
        out[key >> 3] = message[position : position + size]
        position += size
    return out


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def test_a_parameters_context_holds_no_key(small_he, small_context):
    params = threshold.parameters_context(small_he.poly_modulus_degree, small_he.coeff_mod_bit_sizes)
    assert not params.has_public_key() and not params.has_secret_key()
    assert threshold.rings_of(params).key == threshold.rings_of(small_context).key  # the same primes as ts.context


# --- threshold decryption -----------------------------------------------------------------------------


@pytest.mark.parametrize("banks", [(1, 2), (1, 3), (2, 3), (1, 2, 3)])
def test_the_key_authority_and_any_t_banks_decrypt_the_sum(federation, banks):
    decoded = _decrypt(federation, banks)
    error = np.abs(decoded - federation.expected).max()
    print(f"banks {banks}: max |error| {error:.3g}, tolerance {federation.tolerance:.3g}")
    assert error < federation.tolerance
    assert federation.tolerance < 1e-3  # meaningful: values are in [-30, 30]


def _garbage(fed: Federation, plain: np.ndarray) -> bool:
    return float(np.median(np.abs(_raw_decode(fed, plain) - fed.expected))) > 1e3


def test_the_key_authority_with_t_minus_1_banks_gets_garbage(federation):
    rings, polys, std = federation.rings, federation.chunk.residues, federation.flooding_std
    c0, c1 = polys
    authority = threshold.authority_partial(rings, federation.keys[0], polys, std).residues
    for bank in range(1, BANKS + 1):
        # every partial bank j can make: under each decrypting set it belongs to, and its bare share (λ = 1)
        candidates = [
            threshold.bank_partial(rings, federation.shares[bank], polys, chosen, std).residues
            for chosen in itertools.combinations(range(1, BANKS + 1), THRESHOLD)
            if bank in chosen
        ]
        bare = seal_residues.multiply_residues(rings.context, rings.data, c1, federation.shares[bank].secret)
        for partial in [*candidates, bare]:
            plain = residues.add_mod(residues.add_mod(c0, authority, rings.data), partial, rings.data)
            assert _garbage(federation, plain), f"key authority + bank {bank} decrypted"
        with pytest.raises(CryptoError, match="fewer than the threshold"):
            threshold.fuse(
                rings,
                polys,
                [
                    threshold.authority_partial(rings, federation.keys[0], polys, std),
                    threshold.bank_partial(rings, federation.shares[bank], polys, (1, 2, 3), std),
                ],
                THRESHOLD,
                BANKS,
            )


def test_t_banks_without_the_key_authority_get_garbage(federation):
    rings, polys, std = federation.rings, federation.chunk.residues, federation.flooding_std
    for chosen in [(1, 2), (1, 3), (2, 3), (1, 2, 3)]:
        partials = [threshold.bank_partial(rings, federation.shares[j], polys, chosen, std) for j in chosen]
        plain = polys[0]
        for partial in partials:
            plain = residues.add_mod(plain, partial.residues, rings.data)
        assert _garbage(federation, plain), f"banks {chosen} decrypted without the key authority"
        with pytest.raises(CryptoError, match="key authority's partial decryption is missing"):
            threshold.fuse(rings, polys, partials, THRESHOLD, BANKS)


def test_no_output_is_the_collective_secret_key(federation):
    secret = federation.collective_secret_data_level()
    k = len(federation.rings.data.moduli)
    outputs = [federation.crp[:k], federation.public_key[0][:k], federation.public_key[1][:k]]
    outputs += [share.public[:k] for share in federation.keys.values()]
    outputs += [share.secret for share in federation.shares.values()]
    outputs += [dealt for per_bank in federation.dealt.values() for dealt in per_bank.values()]
    polys = federation.chunk.residues
    outputs.append(threshold.authority_partial(federation.rings, federation.keys[0], polys, 1.0).residues)
    outputs += [
        threshold.bank_partial(federation.rings, federation.shares[j], polys, (1, 2, 3), 1.0).residues
        for j in (1, 2, 3)
    ]
    assert not any(np.array_equal(output, secret) for output in outputs)
    assert secret[0].tobytes()[:64] not in federation.public_context
    # and the key authority's share alone is not the key: the banks' part is missing from it
    assert not np.array_equal(federation.keys[0].secret[:k], secret)


# --- Shamir ---------------------------------------------------------------------------------------


def _reconstruct(level, shares: dict[int, np.ndarray]) -> np.ndarray:
    """TEST ONLY: Σ λ_j f(j) over the given points."""
    factors = shamir.lagrange_factors(level, list(shares))
    total = np.zeros(level.shape, dtype=np.uint64)
    for index, value in shares.items():
        total = residues.add_mod(total, shamir.scale_rows(level, value, factors[index]), level)
    return total


@pytest.mark.parametrize(("t", "n"), [(2, 3), (3, 5)])
def test_any_t_shares_reconstruct_and_t_minus_1_do_not(federation, t, n):
    level = federation.rings.data
    secret = residues.uniform_residues(level, 1)[0]
    dealt = shamir.share(level, secret, t, n)
    assert dealt.shape == (n, *level.shape) and np.all(dealt < level.column())
    for chosen in itertools.combinations(range(1, n + 1), t):
        assert np.array_equal(_reconstruct(level, {j: dealt[j - 1] for j in chosen}), secret), chosen
    for chosen in itertools.combinations(range(1, n + 1), t - 1):
        assert not np.array_equal(_reconstruct(level, {j: dealt[j - 1] for j in chosen}), secret), chosen


def test_fewer_than_t_shares_are_uniform_whatever_the_secret(federation):
    level = federation.rings.data
    for secret in (np.zeros(level.shape, dtype=np.uint64), residues.uniform_residues(level, 1)[0]):
        dealt = shamir.share(level, secret, 2, 3)
        for row, prime in enumerate(level.moduli):
            assert uniformity_p_value(dealt[0][row], prime) > P_VALUE


def test_the_banks_shares_reconstruct_the_banks_part_only(federation):
    rings = federation.rings
    k = len(rings.data.moduli)
    banks_part = np.zeros(rings.data.shape, dtype=np.uint64)
    for bank in range(1, BANKS + 1):
        banks_part = residues.add_mod(banks_part, federation.keys[bank].secret[:k], rings.data)
    for chosen in itertools.combinations(range(1, BANKS + 1), THRESHOLD):
        rebuilt = _reconstruct(rings.data, {j: federation.shares[j].secret for j in chosen})
        assert np.array_equal(rebuilt, banks_part)


def test_lagrange_coefficients_are_exact():
    prime = 68719230977
    coefficients = shamir.lagrange_coefficients([1, 2, 3], prime)
    assert coefficients == {1: 3, 2: prime - 3, 3: 1}  # f(0) = 3 f(1) − 3 f(2) + f(3) for quadratics
    assert shamir.lagrange_coefficients([2, 5], prime)[2] == 5 * pow(3, -1, prime) % prime


# --- bad input ------------------------------------------------------------------------------------


def test_access_structures_and_decrypting_sets_are_checked():
    with pytest.raises(CryptoError, match="needs 2 <= t"):
        shamir.check_access_structure(1, 3)
    with pytest.raises(CryptoError, match="exceeds the 3 parties"):
        shamir.check_access_structure(4, 3)
    with pytest.raises(CryptoError, match="must be an integer"):
        shamir.check_access_structure(2.0, 3)
    with pytest.raises(CryptoError, match=r"appear more than once"):
        shamir.check_indices([1, 1, 2], 2, 3)
    with pytest.raises(CryptoError, match=r"unknown party indices \[0, 4\]"):
        shamir.check_indices([0, 1, 4], 2, 3)
    with pytest.raises(CryptoError, match="fewer than the threshold"):
        shamir.check_indices([2], 2, 3)
    assert shamir.check_indices([3, 1], 2, 3) == (1, 3)
    with pytest.raises(CryptoError, match="distinct non-zero"):
        shamir.lagrange_coefficients([1, 1], 97)


def test_residues_are_checked(federation):
    level = federation.rings.data
    good = residues.uniform_residues(level, 1)[0]
    with pytest.raises(CiphertextError, match="expected"):
        shamir.share(level, good.reshape(-1), 2, 3)
    with pytest.raises(CiphertextError, match="must be uint64"):
        shamir.share(level, good.astype(np.int64), 2, 3)
    above = good.copy()
    above[1, 7] = level.moduli[1]
    with pytest.raises(CiphertextError, match="at or above their prime"):
        shamir.share(level, above, 2, 3)
    with pytest.raises(CryptoError, match="exceeds"):
        shamir.share(level, good, 4, 3)
    with pytest.raises(CryptoError, match="needs 2 <= t"):
        shamir.share(level, good, 1, 3)


def test_key_generation_refuses_bad_input(federation):
    rings, crp = federation.rings, federation.crp
    with pytest.raises(CiphertextError, match=r"common random polynomial: residues of shape"):
        threshold.generate_key_share(rings, 1, crp[:2])
    with pytest.raises(CryptoError, match="party index -1"):
        threshold.generate_key_share(rings, -1, crp)
    publics = {p: k.public for p, k in federation.keys.items()}
    with pytest.raises(CryptoError, match=r"missing parties \[0\]"):
        threshold.collective_public_key(rings, crp, {p: v for p, v in publics.items() if p}, BANKS)
    with pytest.raises(CryptoError, match=r"unknown parties \[4\]"):
        threshold.collective_public_key(rings, crp, {**publics, 4: publics[1]}, BANKS)
    with pytest.raises(CiphertextError, match="public share of party 2"):
        threshold.collective_public_key(rings, crp, {**publics, 2: publics[2][:, :10]}, BANKS)
    with pytest.raises(CiphertextError, match="expected"):
        threshold.public_context(rings, federation.public_key[:1])
    with pytest.raises(CryptoError, match="non-empty federation label"):
        threshold.common_random_polynomial(rings, "")
    with pytest.raises(CryptoError, match="not a bank"):
        threshold.deal_shares(rings, federation.keys[0], THRESHOLD, BANKS)
    received = {b: federation.dealt[b][1] for b in (1, 2)}
    with pytest.raises(CryptoError, match=r"missing \[3\]"):
        threshold.combine_shares(rings, 1, received, THRESHOLD, BANKS)
    with pytest.raises(CryptoError, match="deals no Shamir shares"):
        threshold.combine_shares(rings, 1, {**received, 0: received[1]}, THRESHOLD, BANKS)


def test_contexts_are_checked():
    with pytest.raises(ContextError, match=r"SEAL refused N = 4096, prime bit sizes \[60, 60, 60\]: .*security"):
        threshold.parameters_context(4096, [60, 60, 60])  # 180 bits: below 128-bit security at N = 4096
    with pytest.raises(ContextError, match="invalid CKKS parameters N = 4096"):
        threshold.parameters_context(4096, [70, 30])  # SEAL's primes are at most 60 bits
    with pytest.raises(ContextError, match="special prime"):
        threshold.rings_of(threshold.parameters_context(4096, [40]))
    with pytest.raises(ContextError, match="not a TenSEAL context"):
        threshold.rings_of(object())


def test_decryption_refuses_bad_partials(federation):
    rings, polys, std = federation.rings, federation.chunk.residues, federation.flooding_std
    authority = threshold.authority_partial(rings, federation.keys[0], polys, std)
    one, two = (threshold.bank_partial(rings, federation.shares[j], polys, (1, 2), std) for j in (1, 2))
    with pytest.raises(CryptoError, match="claim to be the key authority"):
        threshold.fuse(rings, polys, [authority, authority, one, two], THRESHOLD, BANKS)
    with pytest.raises(CryptoError, match="appear more than once"):
        threshold.fuse(rings, polys, [authority, one, one], THRESHOLD, BANKS)
    three = threshold.bank_partial(rings, federation.shares[3], polys, (1, 2, 3), std)
    with pytest.raises(
        CryptoError,
        match=r"bank 1's partial decryption was made for the decrypting set \[1, 2\], but banks \[1, 2, 3\]",
    ):
        threshold.fuse(rings, polys, [authority, one, two, three], THRESHOLD, BANKS)
    with pytest.raises(CryptoError, match=r"unknown party indices \[7\]"):
        forged = threshold.PartialDecryption(7, (1, 7), one.ciphertext, one.residues)
        threshold.fuse(rings, polys, [authority, one, forged], THRESHOLD, BANKS)
    other = polys.copy()
    other[0, 0, 0] = (int(other[0, 0, 0]) + 1) % rings.data.moduli[0]
    with pytest.raises(CiphertextError, match="made for another ciphertext"):
        threshold.fuse(rings, other, [authority, one, two], THRESHOLD, BANKS)
    with pytest.raises(CiphertextError, match="shape"):
        threshold.fuse(rings, polys[:1], [authority, one, two], THRESHOLD, BANKS)
    with pytest.raises(CryptoError, match="is not in the decrypting set"):
        threshold.bank_partial(rings, federation.shares[3], polys, (1, 2), std)
    with pytest.raises(CryptoError, match="is a bank"):
        threshold.authority_partial(rings, federation.keys[1], polys, std)
    with pytest.raises(CryptoError, match="flooding standard deviation"):
        threshold.authority_partial(rings, federation.keys[0], polys, 0.0)
    with pytest.raises(CryptoError, match="exceeds"):
        threshold.fuse(rings, polys, [authority, one, two], 4, BANKS)
    bad = threshold.PartialDecryption(1, (1, 2), one.ciphertext, one.residues.astype(np.int64))
    with pytest.raises(CiphertextError, match="partial decryption of party 1: residues must be uint64"):
        threshold.fuse(rings, polys, [authority, bad, two], THRESHOLD, BANKS)
