"""Pairwise additive masks between banks (secure aggregation, Bonawitz et al. 2017) for bank-to-bank sums.

Fed²GNN's passive banks send an *active* bank per-node sums through a relay (the aggregator). The
relay must only ever hold masked values, the active bank must learn only the sum over the passive
banks, and no single passive bank's term may come out when two or more contribute. Each bank has an
X25519 key pair; two banks derive a shared seed with X25519 + HKDF-SHA256 bound to a context (the
exchange: federation, level, active bank), and expand it with ChaCha20 into a mask stream. Values
are fixed-point integers mod 2^64 (exact: masks cancel bit for bit). Passive bank p uploads

    y_p = q(v_p) + Σ_{q passive, q > p} m_pq − Σ_{q passive, q < p} m_pq + m_pa     (mod 2^64)

The pairwise terms cancel in Σ_p y_p, leaving Σ_p q(v_p) + Σ_p m_pa, from which only the active bank
(holding every m_pa) removes its masks. The relay sees uniform values; the active bank alone sees
q(v_p) + (pairwise masks of p), uniform as soon as another passive bank takes part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRACTION_BITS = 24  # fixed point: 2^-24 ≈ 6e-8 resolution, |values| up to 2^39 before wrap-around


def new_private_key() -> X25519PrivateKey:
    """A bank's key-agreement key (generated once per bank; only its public half is published)."""
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key a bank publishes."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def pair_seed(own: X25519PrivateKey, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte seed two banks share for ``context`` (X25519, then HKDF-SHA256 with the context as info)."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"fedgl-secure/pairwise-mask/" + context).derive(
        shared
    )


def mask_stream(seed: bytes, length: int) -> np.ndarray:
    """``length`` uint64 values of the ChaCha20 keystream under ``seed`` (a CSPRNG; fresh context → fresh seed)."""
    encryptor = Cipher(algorithms.ChaCha20(seed, b"\x00" * 16), mode=None).encryptor()
    return np.frombuffer(encryptor.update(b"\x00" * (8 * length)), dtype=np.uint64).copy()


def quantise(values: np.ndarray, fraction_bits: int = FRACTION_BITS) -> np.ndarray:
    """Fixed point mod 2^64: ``round(v · 2^b)`` as two's-complement uint64 (refuses values that would wrap)."""
    scaled = np.rint(np.asarray(values, dtype=np.float64) * 2.0**fraction_bits)
    if not np.all(np.isfinite(scaled)) or np.any(np.abs(scaled) >= 2.0**62):
        raise ValueError("pairwise masks: a value is not finite or too large for the fixed-point range")
    return scaled.astype(np.int64).view(np.uint64)


def dequantise(values: np.ndarray, fraction_bits: int = FRACTION_BITS) -> np.ndarray:
    """Inverse of :func:`quantise` (a sum of quantised terms comes back as the sum of their fixed-point values)."""
    return np.asarray(values, dtype=np.uint64).view(np.int64).astype(np.float64) / 2.0**fraction_bits


def masked_upload(
    quantised: np.ndarray,
    sender: int,
    passive_seeds: Mapping[int, bytes],
    active_seed: bytes,
) -> np.ndarray:
    """Passive bank ``sender``'s masked term ``y_p`` (module docstring); ``passive_seeds[q]`` is its seed with
    passive bank q (every other passive bank of this exchange)."""
    length = quantised.shape[0]
    masked = quantised.copy()
    with np.errstate(over="ignore"):
        for peer, seed in passive_seeds.items():
            stream = mask_stream(seed, length)
            masked = masked + stream if peer > sender else masked - stream
        masked = masked + mask_stream(active_seed, length)
    return masked


def relay_sum(uploads: Sequence[np.ndarray]) -> np.ndarray:
    """The relay's only operation: add the masked uploads mod 2^64 (it reads nothing)."""
    total = np.zeros_like(uploads[0])
    with np.errstate(over="ignore"):
        for upload in uploads:
            total = total + upload
    return total


def unmask_sum(relayed: np.ndarray, active_seeds: Sequence[bytes]) -> np.ndarray:
    """The active bank's step: remove its mask with each passive bank; returns the quantised sum."""
    total = relayed.copy()
    with np.errstate(over="ignore"):
        for seed in active_seeds:
            total = total - mask_stream(seed, relayed.shape[0])
    return total


def passive_upload(
    own: X25519PrivateKey,
    sender: int,
    passive: Sequence[int],
    active: int,
    publics: Mapping[int, bytes],
    values: np.ndarray,
    context: bytes,
) -> np.ndarray:
    """Passive bank ``sender``'s whole step: quantise ``values`` and mask them with its seeds under ``context``
    (with every other bank in ``passive`` and with ``active``; ``publics``: each bank's public key)."""
    peer_seeds = {q: pair_seed(own, publics[q], context) for q in passive if q != sender}
    return masked_upload(quantise(np.ravel(values)), sender, peer_seeds, pair_seed(own, publics[active], context))


def active_recover(
    own: X25519PrivateKey, passive: Sequence[int], publics: Mapping[int, bytes], relayed: np.ndarray, context: bytes
) -> np.ndarray:
    """The active bank's whole step: remove its mask with each passive bank from the relayed sum and dequantise
    (flat; the exact sum of the passive banks' fixed-point values)."""
    return dequantise(unmask_sum(relayed, [pair_seed(own, publics[p], context) for p in passive]))
