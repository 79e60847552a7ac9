"""Secure noise for DP releases: clipping, CSPRNG samplers, distributed Gaussian shares and their calibration.

Everything here is a small pure function on numpy ``float64`` arrays. The mechanisms built on these
samplers are in :mod:`fedgl_secure.privacy.edge_mechanisms` and :mod:`fedgl_secure.privacy.label_mechanisms`,
the sensitivities that set the noise in :mod:`fedgl_secure.privacy.graph_sensitivity`, and the accounting of
what the releases cost in :mod:`fedgl_secure.privacy.accounting`. It sits at the bottom of the mechanisms
because every one of them draws from it.

Randomness. A DP guarantee is only as good as the secrecy of its noise, so every sampler draws its
bytes from the operating system's CSPRNG (:func:`secrets.token_bytes`, i.e. ``os.urandom``) and
never from numpy's PRNGs, whose state can be recovered from their output. All derived variates
(uniforms, Gaussians, integers, binomials) are computed from those bytes, so a test can make them
reproducible by injecting a byte source (the ``_random_bytes`` keyword of the samplers and of
:func:`~fedgl_secure.privacy.edge_mechanisms.randomized_response_edges`). Injected sources are for tests and
simulations only: a release made with them carries no privacy at all.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable

import numpy as np
from scipy.special import ndtri

RandomBytes = Callable[[int], bytes]
"""A source of ``n`` random bytes. The default is :func:`secrets.token_bytes`."""

# Clipping scales a row by C/‖row‖; recomputing the norm of the result in floating point can land
# one or two ulps above C. Sensitivity proofs need ‖row‖ ≤ C, not ≈ C, so we aim slightly inside.
_CLIP_MARGIN = 1.0 - 1e-9

# Uniforms carry 52 random bits: (k + 1/2)·2^-52 for k < 2^52 is exact in float64 and lies strictly
# inside (0, 1), so the inverse normal CDF is always finite and the distribution is symmetric.
_UNIFORM_BITS = 52


# --- clipping ---------------------------------------------------------------------------------


def _check_bound(bound: float) -> float:
    bound = float(bound)
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"clip bound must be a positive finite number, got {bound}")
    return bound


def _finite_float64(values: np.ndarray, what: str) -> np.ndarray:
    array = np.array(values, dtype=np.float64, copy=True)
    if not np.isfinite(array).all():
        raise ValueError(f"{what} holds NaN or infinite values; refusing to clip (the bound would not hold)")
    return array


def clip_rows(matrix: np.ndarray, bound: float) -> np.ndarray:
    r"""Scale every row of ``matrix`` to L2 norm at most ``bound``: :math:`x_i \cdot \min(1, C/\lVert x_i\rVert_2)`.

    Used per node for predictions P_k and embeddings H_k, so one node's row can move the release by at
    most 2C (both the old and the new row lie in the C-ball). Rows already inside the ball are kept
    bit for bit; the input is not modified.
    """
    bound = _check_bound(bound)
    clipped = _finite_float64(matrix, "matrix")
    if clipped.ndim != 2:
        raise ValueError(f"clip_rows expects a 2-D matrix (nodes x values), got shape {clipped.shape}")
    norms = np.linalg.norm(clipped, axis=1)
    over = norms > bound
    clipped[over] *= (bound * _CLIP_MARGIN / norms[over])[:, None]
    return clipped


def clip_vector(vector: np.ndarray, bound: float) -> np.ndarray:
    r"""Scale a whole update (any shape, taken as one flat vector) to L2 norm at most ``bound``.

    Used for a bank's weight update W_k − W̄: whatever changes in the bank's data, the clipped update
    moves by at most 2C. The result has the input's shape; the input is not modified.
    """
    bound = _check_bound(bound)
    clipped = _finite_float64(vector, "vector")
    norm = float(np.linalg.norm(clipped.ravel()))
    if norm > bound:
        clipped *= bound * _CLIP_MARGIN / norm
    return clipped


# --- secure randomness ------------------------------------------------------------------------


def _words(count: int, random_bytes: RandomBytes | None) -> np.ndarray:
    """``count`` independent uniform 64-bit words from the byte source (the OS CSPRNG by default)."""
    source = secrets.token_bytes if random_bytes is None else random_bytes
    raw = source(8 * count)
    if len(raw) != 8 * count:
        raise ValueError(f"random byte source returned {len(raw)} bytes, expected {8 * count}")
    return np.frombuffer(raw, dtype="<u8").copy()


def secure_uniform(size: int, *, _random_bytes: RandomBytes | None = None) -> np.ndarray:
    """``size`` i.i.d. uniforms on the open interval (0, 1), with 52 random bits each.

    Values are ``(k + 1/2) · 2^-52`` for a uniform integer ``k < 2^52``: never 0 or 1, and symmetric
    about 1/2. ``_random_bytes`` replaces the OS CSPRNG, for tests only.
    """
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    k = _words(size, _random_bytes) >> np.uint64(64 - _UNIFORM_BITS)
    return (k.astype(np.float64) + 0.5) * 2.0**-_UNIFORM_BITS


def secure_integers(size: int, high: int, *, _random_bytes: RandomBytes | None = None) -> np.ndarray:
    """``size`` i.i.d. integers, exactly uniform on ``[0, high)`` (rejection sampling on masked 64-bit words)."""
    if not 1 <= high <= 2**63:
        raise ValueError(f"high must be in [1, 2^63], got {high}")
    mask = np.uint64((1 << int(high - 1).bit_length()) - 1)
    out = np.empty(0, dtype=np.int64)
    while out.size < size:
        # Acceptance is > 1/2 per word, so asking for twice the shortfall almost always finishes in one pass.
        candidates = _words(2 * (size - out.size) + 8, _random_bytes) & mask
        out = np.concatenate([out, candidates[candidates < np.uint64(high)].astype(np.int64)])
    return out[:size]


def secure_gaussian(
    shape: int | tuple[int, ...], std: float, *, _random_bytes: RandomBytes | None = None
) -> np.ndarray:
    r"""Gaussian noise :math:`\mathcal N(0, \sigma^2)` of the given shape from the OS CSPRNG.

    Inverse-CDF sampling: ``σ · Φ^{-1}(u)`` with ``u`` from :func:`secure_uniform`. Because ``u`` has
    52 bits, the tails are cut at ≈ ±8.2σ (probability mass ≈ 2·10^-16 lost), and the values are
    floating-point numbers rather than an exact discrete Gaussian: both effects are far below the δ
    of any policy, and we state them rather than hide them. ``_random_bytes`` is for tests only.
    """
    std = float(std)
    if not (math.isfinite(std) and std > 0):
        raise ValueError(
            f"noise std must be a positive finite number, got {std}; to release without noise, do not call a sampler"
        )
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    u = secure_uniform(math.prod(shape), _random_bytes=_random_bytes)
    return (std * ndtri(u)).reshape(shape)


# --- distributed noise ------------------------------------------------------------------------


def noise_share_std(total_std: float, num_banks: int) -> float:
    r"""Std of each bank's share so that the sum of ``num_banks`` independent shares has std ``total_std``.

    :math:`\sigma_k = \sigma / \sqrt{K}`, since variances of independent Gaussians add. ``num_banks``
    must be the *fewest* shares that can end up in a decrypted sum (the quorum, not the invited
    count): with fewer contributors the sum would carry less noise than the policy requires.
    """
    if num_banks < 1:
        raise ValueError(f"num_banks must be at least 1, got {num_banks}")
    total_std = float(total_std)
    if not (math.isfinite(total_std) and total_std > 0):
        raise ValueError(f"total noise std must be a positive finite number, got {total_std}")
    return total_std / math.sqrt(num_banks)


def gaussian_share(
    shape: int | tuple[int, ...], total_std: float, num_banks: int, *, _random_bytes: RandomBytes | None = None
) -> np.ndarray:
    """One bank's noise share: :func:`secure_gaussian` with std :func:`noise_share_std` (total_std, num_banks)."""
    return secure_gaussian(shape, noise_share_std(total_std, num_banks), _random_bytes=_random_bytes)


def residual_noise_std(total_std: float, num_banks: int, known_shares: int) -> float:
    r"""Noise std left in the summed release for an observer who knows ``known_shares`` of the shares.

    :math:`\sigma\sqrt{(K-t)/K}`. A bank receives the decrypted sum and knows its own share, so
    against another bank the guarantee holds only for ``known_shares = 1`` (and for t colluding
    banks, t); the aggregator and key authority know no share (``known_shares = 0``). Account
    releases against banks with ``noise_multiplier = residual_noise_std(...) / sensitivity``.
    """
    if not 0 <= known_shares < num_banks:
        raise ValueError(f"known_shares must be in [0, num_banks), got {known_shares} of {num_banks}")
    return noise_share_std(total_std, num_banks) * math.sqrt(num_banks - known_shares)


def gaussian_noise_std(noise_multiplier: float, sensitivity: float) -> float:
    """Noise std of a Gaussian mechanism: noise multiplier × L2 sensitivity (Opacus' convention)."""
    if not (noise_multiplier > 0 and sensitivity > 0):
        raise ValueError(f"noise multiplier and sensitivity must be positive, got {noise_multiplier}, {sensitivity}")
    return float(noise_multiplier) * float(sensitivity)


# --- Laplace noise (the FGCL paper's edge weights) -------------------------------------------


def secure_laplace(size: int, scale: float, *, _random_bytes: RandomBytes | None = None) -> np.ndarray:
    r"""``size`` i.i.d. Laplace(0, b) variates from the OS CSPRNG: :math:`-b\,\mathrm{sgn}(u)\ln(1 - 2|u|)`.

    u ∈ (−½, ½); inverse-CDF sampling on the 52-bit uniforms of :func:`secure_uniform` (never exactly ±½, so the
    logarithm is finite). ``_random_bytes`` replaces the OS CSPRNG, for tests only.
    """
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"Laplace scale must be a positive finite number, got {scale}")
    u = secure_uniform(size, _random_bytes=_random_bytes) - 0.5
    return -scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale b = Δ/ε of the Laplace mechanism (ε-DP for an L1 sensitivity Δ)."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")
    return _check_bound(sensitivity) / epsilon
