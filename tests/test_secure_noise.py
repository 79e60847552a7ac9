"""Secure noise (privacy/secure_noise.py): clipping bounds, the CSPRNG samplers, distributed Gaussian shares.

Statistical tests use a fixed byte source (``np.random.default_rng(seed).bytes``) so they are
deterministic; each tolerance is stated where it is used. Tests of the OS CSPRNG path itself use
generous k-sigma bounds (k = 6: a false failure has probability ≈ 2·10^-9).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedgl_secure.privacy.secure_noise import (
    clip_rows,
    clip_vector,
    gaussian_share,
    noise_share_std,
    residual_noise_std,
    secure_gaussian,
    secure_integers,
    secure_uniform,
)


def fixed_bytes(seed: int):
    """A deterministic byte source for tests (never for releases)."""
    return np.random.default_rng(seed).bytes


# --- clipping ----------------------------------------------------------------------------------

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
bounds = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=60, deadline=None)
@given(matrix=arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 6)), elements=finite), bound=bounds)
def test_clip_rows_bounds_every_row_and_keeps_direction(matrix, bound):
    original = matrix.copy()
    clipped = clip_rows(matrix, bound)
    norms = np.linalg.norm(clipped, axis=1)
    assert (norms <= bound).all()
    assert np.array_equal(matrix, original)  # input untouched
    inside = np.linalg.norm(original, axis=1) <= bound
    assert np.array_equal(clipped[inside], original[inside])
    # Clipping only shrinks: clipped = c · row with 0 < c ≤ 1 (so the direction is kept).
    for row, out in zip(original[~inside], clipped[~inside], strict=True):
        scale = np.linalg.norm(out) / np.linalg.norm(row)
        assert 0 < scale <= 1 and np.allclose(out, scale * row, rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(vector=arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 5)), elements=finite), bound=bounds)
def test_clip_vector_bounds_the_whole_update(vector, bound):
    clipped = clip_vector(vector, bound)
    assert clipped.shape == vector.shape
    assert np.linalg.norm(clipped.ravel()) <= bound
    if np.linalg.norm(vector.ravel()) <= bound:
        assert np.array_equal(clipped, vector)


def test_clipping_refuses_non_finite_values_and_bad_bounds():
    with pytest.raises(ValueError, match="NaN"):
        clip_rows(np.array([[1.0, np.nan]]), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        clip_vector(np.array([np.inf]), 1.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="clip bound"):
            clip_rows(np.ones((2, 2)), bad)


# --- secure randomness -------------------------------------------------------------------------


def test_secure_gaussian_mean_and_variance():
    n, std = 400_000, 3.0
    for sample in (
        secure_gaussian(n, std, _random_bytes=fixed_bytes(1)),  # deterministic
        secure_gaussian(n, std),  # the OS CSPRNG
    ):
        # Sample mean ~ N(0, σ²/n): |mean| ≤ k·σ/√n with k = 6.
        assert abs(sample.mean()) <= 6 * std / math.sqrt(n)
        # Sample variance has std ≈ σ²·√(2/(n−1)) for Gaussian data: |s² − σ²| ≤ k·σ²·√(2/n), k = 6.
        assert abs(sample.var(ddof=1) - std**2) <= 6 * std**2 * math.sqrt(2 / n)


def test_secure_gaussian_has_a_gaussian_shape():
    sample = secure_gaussian(100_000, 1.0, _random_bytes=fixed_bytes(2))
    # Kolmogorov–Smirnov against N(0, 1); fixed source, so this is deterministic, and a sampler with
    # the wrong shape (e.g. a uniform or a mis-scaled normal) gives p-values of ~0 at this n.
    assert stats.kstest(sample, "norm").pvalue > 1e-3


def test_secure_gaussian_does_not_use_numpys_generator():
    np.random.seed(0)
    state = np.random.get_state()
    first = secure_gaussian(64, 1.0)
    assert np.array_equal(np.random.get_state()[1], state[1])  # numpy's global RNG was not consumed
    np.random.seed(0)
    second = secure_gaussian(64, 1.0)
    assert not np.array_equal(first, second)  # seeding numpy does not make it repeat


def test_injected_source_is_reproducible_and_shapes_are_kept():
    a = secure_gaussian((3, 4), 2.0, _random_bytes=fixed_bytes(7))
    b = secure_gaussian((3, 4), 2.0, _random_bytes=fixed_bytes(7))
    assert a.shape == (3, 4) and np.array_equal(a, b)
    with pytest.raises(ValueError, match="positive"):
        secure_gaussian(3, 0.0)


def test_secure_uniform_is_strictly_inside_the_unit_interval():
    zeros = lambda n: bytes(n)  # noqa: E731 - the extreme words 0 …
    ones = lambda n: b"\xff" * n  # noqa: E731 - … and 2^64 − 1
    assert 0 < secure_uniform(4, _random_bytes=zeros)[0] < 1e-15
    assert 1 - 1e-15 < secure_uniform(4, _random_bytes=ones)[0] < 1
    assert np.isfinite(secure_gaussian(4, 1.0, _random_bytes=zeros)).all()


def test_secure_integers_are_uniform():
    draws = secure_integers(70_000, 7, _random_bytes=fixed_bytes(3))
    assert draws.min() >= 0 and draws.max() < 7
    # Pearson χ² with 6 degrees of freedom; reject only beyond its 1 − 10^-6 quantile.
    observed = np.bincount(draws, minlength=7)
    chi2 = ((observed - 10_000) ** 2 / 10_000).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-6, df=6)


# --- distributed noise -------------------------------------------------------------------------


def test_share_std_formula_and_residual_noise():
    assert noise_share_std(6.0, 4) == pytest.approx(3.0)
    assert residual_noise_std(6.0, 4, 0) == pytest.approx(6.0)
    assert residual_noise_std(6.0, 4, 1) == pytest.approx(6.0 * math.sqrt(3 / 4))
    with pytest.raises(ValueError):
        noise_share_std(1.0, 0)
    with pytest.raises(ValueError):
        residual_noise_std(1.0, 3, 3)


@pytest.mark.parametrize("num_banks", [2, 5, 11])
def test_distributed_shares_add_up_to_the_configured_variance(num_banks):
    total_std, trials = 2.5, 40_000
    # Each bank draws its share for every trial from its own fixed source; sum over banks per trial.
    summed = sum(
        gaussian_share(trials, total_std, num_banks, _random_bytes=fixed_bytes(100 + k)) for k in range(num_banks)
    )
    # For Gaussian sums, (n−1)s²/σ² ~ χ²(n−1) exactly. Accept between its 10^-6 and 1 − 10^-6 quantiles
    # (≈ ±3.4% of σ² at n = 40 000): a share std off by the factor √K (no split, or split twice) lands
    # at K·σ² or σ²/K, far outside.
    statistic = (trials - 1) * summed.var(ddof=1) / total_std**2
    assert stats.chi2.ppf(1e-6, trials - 1) < statistic < stats.chi2.ppf(1 - 1e-6, trials - 1)
    # And a single share alone carries only σ²/K.
    single = gaussian_share(trials, total_std, num_banks, _random_bytes=fixed_bytes(99))
    statistic = (trials - 1) * single.var(ddof=1) / (total_std**2 / num_banks)
    assert stats.chi2.ppf(1e-6, trials - 1) < statistic < stats.chi2.ppf(1 - 1e-6, trials - 1)
