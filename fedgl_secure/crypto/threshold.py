"""Dealer-free threshold CKKS over SEAL's RNS residues: the key authority's share always required, the banks' t-of-n.

The protocol is multiparty RLWE key generation (Mouchet, Troncoso-Pastoriza, Bossuat and Hubaux, "Multiparty
Homomorphic Encryption from Ring-Learning-with-Errors", PETS 2021) with the banks' part under a t-out-of-N
access structure (Mouchet, Bertrand and Hubaux, J. Cryptology 2023) — the protocol family of Lattigo's
multiparty CKKS and OpenFHE's threshold CKKS. Party 0 is the key authority (:data:`AUTHORITY`); banks are
``1..n``, and a bank's index is its Shamir evaluation point.

1. **Common random polynomial** ``a`` (:func:`common_random_polynomial`): uniform at the key level, expanded
   from a public seed (federation id and parameters) with SHAKE-256, so every party derives the same one.
2. **Key shares** (:func:`generate_key_share`): each party samples a ternary ``s_i`` from the OS CSPRNG and
   publishes ``p_i = −a·s_i + e_i`` (``e_i`` rounded Gaussian, σ = 3.2, as SEAL's key generator).
3. **Collective public key** (:func:`collective_public_key`, :func:`public_context`): ``(Σ_i p_i, a)`` is an
   RLWE public key for ``s = Σ_i s_i``; it becomes a TenSEAL public context (public key only) that
   ``ts.ckks_vector`` encrypts with. ``s`` itself is never formed, anywhere.
4. **t-of-n** (:func:`deal_shares`, :func:`combine_shares`): each bank Shamir-shares the data-level residues of
   its ``s_b`` (``shamir.py``); bank ``j`` keeps ``S_j = Σ_b f_b(j)``, a share of ``Σ_b s_b``.
5. **Decryption** (:func:`authority_partial`, :func:`bank_partial`, :func:`fuse`): for a decrypting set ``T``
   of at least ``t`` banks, the key authority returns ``c1·s_KA + E_KA`` and bank ``j ∈ T`` returns
   ``c1·(λ_j^T·S_j) + E_j``, each ``E`` fresh noise flooding (Li–Micciancio, EUROCRYPT 2021); the fusion
   ``c0 + Σ`` is ``m + e + Σ E``. Without the key authority's share, or with fewer than ``t`` banks, the sum
   of whatever partials exist is ``m`` plus a uniformly random ring element times ``c1`` — garbage.

SEAL's public-key encryption works at the *key level* (every prime, the special one included) and then drops
the special prime, so steps 1–3 run there and steps 4–5 at the data level (the same residues minus the last
prime row). ``seal_residues``' transforms only know data levels; the key level is reached through an auxiliary
SEAL context whose data level *is* the key level (:func:`rings_of`): SEAL's NTT tables depend only on
``(N, q)``, and its parameters id only on (scheme, N, primes), so that level's residues, products and
serialised objects are exactly the main context's key level's.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from fedgl_secure.crypto import ckks, seal_residues, shamir, tenseal_chunks
from fedgl_secure.crypto.residues import (
    RingLevel,
    add_mod,
    check_residues,
    data_level,
    multiply_pointwise,
    signed_residues,
    sub_mod,
    uniform_residues,
)
from fedgl_secure.errors import CiphertextError, ContextError, CryptoError
from fedgl_secure.policy.he import HEParameters

AUTHORITY = 0  # the key authority's party index; banks are 1..n (their Shamir evaluation points)
KEY_ERROR_STD = 3.2  # σ of the public shares' error: SEAL's default noise standard deviation
_CRP_DOMAIN = b"fedgl-secure/threshold-ckks/crp/v1"
_AUX_PRIME_BITS = 30  # the auxiliary context's extra prime: any prime = 1 mod 2N not already in the chain
_TENSEAL_AUTO_FLAGS = 0b111  # TenSEAL's default: auto relinearise, rescale and mod-switch (tensealcontext.h)
_SEAL_FAILURES = (RuntimeError, ValueError, TypeError, IndexError, OverflowError)


# --- the two levels --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SealHandle:
    data: sealapi.SEALContext


@dataclass(frozen=True)
class _LevelContext:
    """A SEAL context in the shape ``seal_residues`` takes one (it only ever calls ``.seal_context().data``)."""

    seal: sealapi.SEALContext

    def seal_context(self) -> _SealHandle:
        return _SealHandle(self.seal)


@dataclass(frozen=True, eq=False)
class Rings:
    """The CKKS parameters' two rings: ``data`` (where ciphertexts live) and ``key`` (the data primes and the
    special prime, where keys live), with contexts that ``seal_residues``' transforms accept for each."""

    context: ts.Context
    data: RingLevel
    key: RingLevel
    key_context: _LevelContext = field(repr=False)


def rings_of(context: ts.Context) -> Rings:
    """The data and key levels of ``context`` (any context of the parameters, keys or none).

    The key level's auxiliary context has coefficient modulus (key-level primes, one extra prime): its data
    level has the key level's primes, NTT tables and parameters id, which is checked here."""
    try:
        seal = context.seal_context().data
        key_data = seal.key_context_data()
    except (AttributeError, *_SEAL_FAILURES) as error:
        raise ContextError(f"not a TenSEAL context: {error}") from None
    if not seal.using_keyswitching():
        raise ContextError("threshold CKKS needs a special prime: the coefficient modulus has a single prime")
    data = data_level(context)
    degree = int(key_data.parms().poly_modulus_degree())
    key_primes = [int(prime.value()) for prime in key_data.parms().coeff_modulus()]
    if tuple(key_primes[: len(data.moduli)]) != data.moduli:
        raise ContextError("the key level's primes do not start with the data level's")
    try:
        candidates = sealapi.CoeffModulus.Create(degree, [_AUX_PRIME_BITS] * (len(key_primes) + 1))
        extra = next(prime for prime in candidates if int(prime.value()) not in key_primes)
        parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
        parms.set_poly_modulus_degree(degree)
        parms.set_coeff_modulus([sealapi.Modulus(prime) for prime in key_primes] + [extra])
        auxiliary = sealapi.SEALContext(parms, True, sealapi.SEC_LEVEL_TYPE.NONE)
    except _SEAL_FAILURES as error:
        raise ContextError(f"cannot build the key-level context for N = {degree}: {error}") from None
    if not auxiliary.parameters_set():
        raise ContextError(f"SEAL refused the key-level context: {auxiliary.parameters_error_message()}")
    key_parms_id = tuple(int(word) for word in seal.key_parms_id())
    if tuple(int(word) for word in auxiliary.first_parms_id()) != key_parms_id:
        raise ContextError("the key-level context's parameters id differs from the key level's (SEAL changed?)")
    return Rings(context, data, RingLevel(key_parms_id, tuple(key_primes), degree), _LevelContext(auxiliary))


def rings_for(he: HEParameters) -> Rings:
    """The data and key rings of a policy's CKKS parameters, from a context holding no key at all."""
    return rings_of(parameters_context(he.poly_modulus_degree, he.coeff_mod_bit_sizes, 2.0**he.global_scale_bits))


def parameters_context(
    poly_modulus_degree: int, coeff_mod_bit_sizes: Sequence[int], global_scale: float | None = None
) -> ts.Context:
    """A TenSEAL context holding the CKKS parameters and no key at all: what a party works with before the
    collective public key exists (``ts.context`` would generate a secret key nobody needs).

    The primes are ``CoeffModulus.Create(N, bit sizes)``, the ones ``ts.context`` picks; SEAL checks the
    parameters against the 128-bit HomomorphicEncryption.org table."""
    described = f"N = {poly_modulus_degree}, prime bit sizes {list(coeff_mod_bit_sizes)}"
    try:
        parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
        parms.set_poly_modulus_degree(int(poly_modulus_degree))
        parms.set_coeff_modulus(sealapi.CoeffModulus.Create(int(poly_modulus_degree), list(coeff_mod_bit_sizes)))
        # checked here first: TenSEAL's loader reports any refusal only as "not set correctly"
        checked = sealapi.SEALContext(parms, True, sealapi.SEC_LEVEL_TYPE.TC128)
    except _SEAL_FAILURES as error:
        raise ContextError(f"invalid CKKS parameters {described}: {error}") from None
    if not checked.parameters_set():
        raise ContextError(f"SEAL refused {described}: {checked.parameters_error_message()}")
    return _load_context(_context_proto(_saved(parms), b"", _TENSEAL_AUTO_FLAGS, global_scale))


# --- step 1: the common random polynomial --------------------------------------------------------------


def _xof(seed: bytes) -> Callable[[int], bytes]:
    """A deterministic byte stream for ``uniform_residues``: SHAKE-256 of (seed, block counter)."""
    counter = itertools.count()
    return lambda size: hashlib.shake_256(seed + next(counter).to_bytes(8, "little")).digest(size)


def crp_seed(rings: Rings, label: str) -> bytes:
    """The public seed of the common random polynomial: a label naming the federation — the roster's digest
    (federation, banks, threshold, policy digest: ``ceremony_messages.Roster.digest``) — and the key level (N, primes,
    SEAL's parameters id), so that no two federations, policies or parameter sets share an ``a``."""
    if not isinstance(label, str) or not label:
        raise CryptoError("the common random polynomial needs a non-empty federation label")
    name = label.encode("utf-8")
    level = rings.key
    return b"".join(
        (
            _CRP_DOMAIN,
            struct.pack("<Q", len(name)),
            name,
            struct.pack("<QQ", level.degree, len(level.moduli)),
            struct.pack(f"<{len(level.moduli)}Q", *level.moduli),
            struct.pack("<4Q", *level.parms_id),
        )
    )


def common_random_polynomial(rings: Rings, label: str) -> np.ndarray:
    """Step 1: ``a``, uniform at the key level in NTT form, shape (K, N) — the same for every party.

    ``a`` is sampled directly in the NTT domain (uniform there is uniform in coefficients too, the NTT being a
    bijection), by ``residues.uniform_residues``' rejection sampling over SHAKE-256 of :func:`crp_seed`."""
    return uniform_residues(rings.key, 1, _xof(crp_seed(rings, label)))[0]


# --- step 2: key shares ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class KeyShare:
    """One party's key share: ``secret`` ``s_i`` and ``public`` ``p_i = −a·s_i + e_i``, both at the key level in
    NTT form, shape (K, N). Only ``party`` shows in ``repr``; ``secret`` never leaves its party in clear."""

    party: int
    public: np.ndarray = field(repr=False)
    secret: np.ndarray = field(repr=False)


def _ternary(degree: int) -> np.ndarray:
    """``degree`` coefficients uniform in {−1, 0, 1} from the OS CSPRNG (bytes below 255 = 3·85, mod 3)."""
    drawn: list[np.ndarray] = []
    have = 0
    while have < degree:
        raw = np.frombuffer(os.urandom(degree - have + 64), dtype=np.uint8)
        kept = raw[raw < 255]
        drawn.append(kept)
        have += kept.size
    return (np.concatenate(drawn)[:degree] % 3).astype(np.int64) - 1


def generate_key_share(rings: Rings, party: int, crp: np.ndarray) -> KeyShare:
    """Step 2 (each party, alone): a fresh ternary secret ``s_i`` and its public share ``−a·s_i + e_i``."""
    _check_party(party)
    a = shamir.check_element(rings.key, crp, "common random polynomial")
    level, context = rings.key, rings.key_context
    secret = seal_residues.to_ntt(context, level, signed_residues(level, _ternary(level.degree)))
    error = seal_residues.flooding_residues(context, level, 1, KEY_ERROR_STD)[0]
    public = sub_mod(error, multiply_pointwise(level, a, secret), level)
    return KeyShare(int(party), public, secret)


def _check_party(party: int) -> None:
    if isinstance(party, bool) or not isinstance(party, int) or party < 0:
        raise CryptoError(f"party index {party!r}: 0 is the key authority, banks are 1..n")


def _check_parties(present: Sequence[int], banks: int, what: str) -> None:
    """``present`` must be exactly the key authority and banks ``1..banks``."""
    expected = set(range(banks + 1))
    missing = sorted(expected - set(present))
    unknown = sorted(set(present) - expected, key=repr)
    if unknown:
        raise CryptoError(f"{what}: unknown parties {unknown} (0 is the key authority, banks are 1..{banks})")
    if missing:
        raise CryptoError(f"{what}: missing parties {missing} (0 is the key authority, banks are 1..{banks})")


# --- step 3: the collective public key -------------------------------------------------------------


def collective_public_key(
    rings: Rings, crp: np.ndarray, public_shares: Mapping[int, np.ndarray], banks: int
) -> np.ndarray:
    """Step 3: ``(Σ_i p_i, a)`` over the key authority and every bank, shape (2, K, N), key level, NTT form.

    Every party's share is needed: a key missing one share would encrypt under a secret that party's
    partial decryption cannot complete."""
    if isinstance(banks, bool) or not isinstance(banks, int) or banks < 1:
        raise CryptoError(f"the federation needs at least one bank, got {banks!r}")
    _check_parties(list(public_shares), banks, "public shares")
    a = shamir.check_element(rings.key, crp, "common random polynomial")
    total = np.zeros(rings.key.shape, dtype=np.uint64)
    for party in sorted(public_shares):
        share = shamir.check_element(rings.key, public_shares[party], f"public share of party {party}")
        total = add_mod(total, share, rings.key)
    return np.stack([total, a])


def public_key_bytes(rings: Rings, public_key: np.ndarray) -> bytes:
    """SEAL's serialisation of the public key ``(b, a)``: a two-polynomial ciphertext at the key level's
    parameters id in NTT form, which is what SEAL 4 writes for a ``PublicKey`` (``sealapi.PublicKey.load``)."""
    polys = np.asarray(public_key)
    if polys.dtype != np.uint64 or polys.shape != (2, *rings.key.shape):
        raise CiphertextError(
            f"public key residues of shape {polys.shape} and type {polys.dtype}, expected (2, {rings.key.shape}) uint64"
        )
    ciphertext = seal_residues.ciphertext_from(rings.key_context, rings.key, polys, 1.0, ntt_form=True)
    return seal_residues.ciphertext_bytes(ciphertext)


def public_context(rings: Rings, public_key: np.ndarray) -> bytes:
    """Step 3, published: the TenSEAL public context (parameters, scale and the collective public key; no
    secret, Galois or relinearisation key) as ``ckks.public_context_bytes`` writes it, so its fingerprint is
    what every party computes. It passes ``ckks.load_public_context``.

    TenSEAL 0.3.18's Python API cannot set a public key; its context serialisation is a small protobuf
    (``tenseal/proto/tensealcontext.proto``), written here field by field with the key in it, loaded by
    TenSEAL (SEAL checks the key against the parameters) and serialised back by TenSEAL itself."""
    seal = rings.context.seal_context().data
    try:
        scale: float | None = rings.context.global_scale
    except ValueError:  # "no global scale"
        scale = None
    flags = (
        int(rings.context.auto_relin) | int(rings.context.auto_rescale) << 1 | int(rings.context.auto_mod_switch) << 2
    )
    proto = _context_proto(_saved(seal.key_context_data().parms()), public_key_bytes(rings, public_key), flags, scale)
    return ckks.public_context_bytes(ckks.load_public_context(proto))


def _saved(seal_object) -> bytes:
    """SEAL's serialisation of a public object (bindings write only to paths; nothing secret goes here)."""
    with tempfile.TemporaryDirectory(prefix="fedgl-threshold-") as directory:
        path = str(Path(directory) / "object")
        seal_object.save(path)
        return Path(path).read_bytes()


def _length_delimited(number: int, payload: bytes) -> bytes:
    return tenseal_chunks.protobuf_varint(number << 3 | 2) + tenseal_chunks.protobuf_varint(len(payload)) + payload


def _context_proto(parameters: bytes, public_key: bytes, auto_flags: int, scale: float | None) -> bytes:
    """``TenSEALContextProto`` (proto3): 1 SEAL parameters, 2 ``TenSEALPublicProto`` (1 public key, 2 auto
    flags, 3 scale; −1 means none, as TenSEAL writes it), no 3 (the private part), 4 encryption type omitted
    (0, asymmetric)."""
    public = (
        (_length_delimited(1, public_key) if public_key else b"")
        + tenseal_chunks.protobuf_varint(2 << 3 | 0)
        + tenseal_chunks.protobuf_varint(auto_flags)
        + tenseal_chunks.protobuf_varint(3 << 3 | 1)
        + struct.pack("<d", -1.0 if scale is None else float(scale))
    )
    return _length_delimited(1, parameters) + _length_delimited(2, public)


def _load_context(proto: bytes) -> ts.Context:
    try:
        return ts.context_from(proto)
    except _SEAL_FAILURES as error:
        raise ContextError(f"TenSEAL refused the assembled context ({len(proto)} bytes): {error}") from None


# --- step 4: t-of-n ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ThresholdShare:
    """Bank ``party``'s Shamir share ``S_j`` (data level, NTT form, (k, N)) of ``Σ_b s_b``, for ``threshold``
    of ``banks``. Only the numbers show in ``repr``."""

    party: int
    threshold: int
    banks: int
    secret: np.ndarray = field(repr=False)


def _check_bank(party: int, banks: int) -> None:
    if isinstance(party, bool) or not isinstance(party, int) or not 1 <= party <= banks:
        raise CryptoError(f"party {party!r} is not a bank: banks are 1..{banks} (0 is the key authority)")


def deal_shares(rings: Rings, key_share: KeyShare, threshold: int, banks: int) -> dict[int, np.ndarray]:
    """Step 4, dealing (each bank): Shamir shares of the data-level residues of its ``s_b``, one per bank
    ``1..banks`` (its own included), each sent to its bank over a private channel. The key authority's
    share is never shared: its partial decryption is always required."""
    shamir.check_access_structure(threshold, banks, rings.data)
    _check_bank(key_share.party, banks)
    secret = shamir.check_element(rings.key, key_share.secret, "key share")[: len(rings.data.moduli)]
    dealt = shamir.share(rings.data, np.ascontiguousarray(secret), threshold, banks)
    return {party: dealt[party - 1] for party in range(1, banks + 1)}


def combine_shares(
    rings: Rings, party: int, received: Mapping[int, np.ndarray], threshold: int, banks: int
) -> ThresholdShare:
    """Step 4, combining (bank ``party``): ``S_j = Σ_b f_b(j)`` over the shares dealt by every bank ``1..banks``
    — one missing would leave its ``s_b``, which the public key includes, out of every reconstruction."""
    shamir.check_access_structure(threshold, banks, rings.data)
    _check_bank(party, banks)
    dealers = list(received)
    if AUTHORITY in dealers:
        raise CryptoError("the key authority deals no Shamir shares: its own partial decryption is always required")
    expected = set(range(1, banks + 1))
    if set(dealers) != expected:
        missing, unknown = sorted(expected - set(dealers)), sorted(set(dealers) - expected, key=repr)
        raise CryptoError(
            f"bank {party}: shares from banks 1..{banks} are needed; missing {missing}, unknown {unknown}"
        )
    total = np.zeros(rings.data.shape, dtype=np.uint64)
    for dealer in sorted(dealers):
        element = shamir.check_element(rings.data, received[dealer], f"share dealt by bank {dealer} to bank {party}")
        total = add_mod(total, element, rings.data)
    return ThresholdShare(party, threshold, banks, total)


# --- step 5: partial decryption and fusion -----------------------------------------------------------


class Chunk(NamedTuple):
    """One TenSEAL chunk as residues: ``residues`` (2, k, N) NTT form at the data level, its scale, slots used."""

    residues: np.ndarray
    scale: float
    size: int


@dataclass(frozen=True, eq=False)
class PartialDecryption:
    """One party's share of a decryption: ``c1·(its secret) + E`` (data level, NTT form, (k, N)).

    ``decrypting_set`` is the set of banks whose Lagrange coefficients a bank's partial used (empty for the
    key authority's, which needs none); ``ciphertext`` is the SHA-256 of the ciphertext's residues, so a
    partial is fused only with the ciphertext it was made for."""

    party: int
    decrypting_set: tuple[int, ...]
    ciphertext: str
    residues: np.ndarray = field(repr=False)


def chunk_residues(rings: Rings, chunk: bytes, where: str = "chunk") -> Chunk:
    """A serialised TenSEAL CKKS vector (one ciphertext) as its residues, scale and slot count."""
    ciphertext, size = tenseal_chunks.tenseal_ciphertext(rings.context, chunk, where)
    polys = seal_residues.ciphertext_polys(ciphertext, rings.data)
    if polys.shape[0] != 2 or not ciphertext.is_ntt_form():
        raise CiphertextError(f"{where}: not a fresh two-polynomial ciphertext in NTT form")
    return Chunk(polys, float(ciphertext.scale), size)


def ciphertext_digest(rings: Rings, ciphertext: np.ndarray) -> str:
    """SHA-256 (hex) of a data-level ciphertext's residues, after checking them."""
    polys = _check_ciphertext(rings, ciphertext)
    return hashlib.sha256(np.ascontiguousarray(polys, dtype="<u8").tobytes()).hexdigest()


def _check_ciphertext(rings: Rings, ciphertext: np.ndarray) -> np.ndarray:
    if not isinstance(ciphertext, np.ndarray) or ciphertext.shape != (2, *rings.data.shape):
        shape = getattr(ciphertext, "shape", type(ciphertext).__name__)
        raise CiphertextError(f"ciphertext residues of shape {shape}, expected (2, {rings.data.shape})")
    for index, poly in enumerate(ciphertext):
        shamir.check_element(rings.data, poly, f"ciphertext polynomial c{index}")
    return ciphertext


def partial_residues(
    rings: Rings, c1s: np.ndarray, secret: np.ndarray, flooding_std: float, noise: np.ndarray | None = None
) -> np.ndarray:
    """Step 5's one operation, for a stack of ciphertexts: ``c1·secret + E`` for every ``c1`` of ``c1s`` (chunks, k,
    N), NTT form at the data level; ``E`` fresh flooding noise of σ ``flooding_std`` per coefficient, one draw per
    ciphertext from the OS CSPRNG — drawn here, or ``noise`` (chunks, k, N) made ahead for this call alone
    (:class:`~fedgl_secure.crypto.flooding_reserve.FloodingReserve`). ``secret`` is the party's share (a bank's
    already Lagrange-weighted)."""
    if isinstance(flooding_std, bool) or not isinstance(flooding_std, int | float) or not flooding_std > 0:
        raise CryptoError(f"the flooding standard deviation must be a positive number, got {flooding_std!r}")
    if not np.isfinite(flooding_std):
        raise CryptoError(f"the flooding standard deviation must be finite, got {flooding_std!r}")
    level = rings.data
    secret = shamir.check_element(level, secret, "secret share")
    if noise is None:
        noise = seal_residues.flooding_residues(rings.context, level, len(c1s), float(flooding_std))
    noise = check_residues(level, noise, len(c1s), "flooding noise")
    return add_mod(multiply_pointwise(level, c1s, secret), noise, level)


def _flooded(rings: Rings, c1: np.ndarray, secret: np.ndarray, flooding_std: float) -> np.ndarray:
    return partial_residues(rings, c1[None], secret, flooding_std)[0]


def authority_partial(
    rings: Rings, key_share: KeyShare, ciphertext: np.ndarray, flooding_std: float
) -> PartialDecryption:
    """Step 5, the key authority: ``c1·s_KA + E_KA`` with fresh flooding noise of σ ``flooding_std``."""
    if key_share.party != AUTHORITY:
        raise CryptoError(f"party {key_share.party} is a bank: its partial decryption uses its Shamir share")
    digest = ciphertext_digest(rings, ciphertext)
    secret = shamir.check_element(rings.key, key_share.secret, "key share")[: len(rings.data.moduli)]
    residues = _flooded(rings, ciphertext[1], np.ascontiguousarray(secret), flooding_std)
    return PartialDecryption(AUTHORITY, (), digest, residues)


def bank_partial(
    rings: Rings,
    share: ThresholdShare,
    ciphertext: np.ndarray,
    decrypting_set: Sequence[int],
    flooding_std: float,
) -> PartialDecryption:
    """Step 5, bank ``j`` of the decrypting set ``T`` (≥ t distinct banks, ``j`` among them):
    ``c1·(λ_j^T·S_j) + E_j`` with fresh flooding noise of σ ``flooding_std``."""
    chosen = shamir.check_indices(decrypting_set, share.threshold, share.banks)
    if share.party not in chosen:
        raise CryptoError(f"bank {share.party} is not in the decrypting set {list(chosen)}")
    digest = ciphertext_digest(rings, ciphertext)
    secret = shamir.check_element(rings.data, share.secret, f"Shamir share of bank {share.party}")
    weighted = shamir.scale_rows(rings.data, secret, shamir.lagrange_factors(rings.data, chosen)[share.party])
    residues = _flooded(rings, ciphertext[1], weighted, flooding_std)
    return PartialDecryption(share.party, chosen, digest, residues)


def fuse(
    rings: Rings, ciphertext: np.ndarray, partials: Sequence[PartialDecryption], threshold: int, banks: int
) -> np.ndarray:
    """Step 5, fusion (anyone, typically the aggregator): ``c0 + d_KA + Σ_{j∈T} d_j``, the plaintext's residues
    (k, N) in NTT form, flooded; :func:`decode` turns them into slots.

    Refused, naming the problem: a missing or repeated key authority partial, a bank outside ``1..banks`` or
    repeated, fewer than ``threshold`` banks, a bank partial made for another decrypting set, or a partial
    made for another ciphertext."""
    shamir.check_access_structure(threshold, banks, rings.data)
    digest = ciphertext_digest(rings, ciphertext)
    for partial in partials:
        if not isinstance(partial, PartialDecryption):
            raise CryptoError(f"expected partial decryptions, got {type(partial).__name__}")
        if partial.ciphertext != digest:
            raise CiphertextError(f"the partial decryption of party {partial.party} was made for another ciphertext")
    authority = [partial for partial in partials if partial.party == AUTHORITY]
    if not authority:
        raise CryptoError("the key authority's partial decryption is missing: its share is always required")
    if len(authority) > 1:
        raise CryptoError(f"{len(authority)} partial decryptions claim to be the key authority's")
    bank_partials = [partial for partial in partials if partial.party != AUTHORITY]
    chosen = shamir.check_indices([partial.party for partial in bank_partials], threshold, banks)
    for partial in bank_partials:
        if partial.decrypting_set != chosen:
            raise CryptoError(
                f"bank {partial.party}'s partial decryption was made for the decrypting set "
                f"{list(partial.decrypting_set)}, but banks {list(chosen)} are fused"
            )
    total = ciphertext[0]
    for partial in [*authority, *bank_partials]:
        element = shamir.check_element(rings.data, partial.residues, f"partial decryption of party {partial.party}")
        total = add_mod(total, element, rings.data)
    return total


def decode(rings: Rings, plaintext: np.ndarray, scale: float, size: int | None = None) -> np.ndarray:
    """The real slot values of fused plaintext residues at ``scale`` (SEAL's CKKS decoder), the first ``size``."""
    values = seal_residues.decode(
        rings.context, rings.data, shamir.check_element(rings.data, plaintext, "plaintext"), scale
    )
    return values if size is None else values[:size]
