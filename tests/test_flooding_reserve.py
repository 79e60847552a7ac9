"""Flooding noise made ahead (crypto/flooding_reserve.py): what it hands out is flooding noise of the policy's width
in NTT form, every polynomial once; a request larger than the reserve is made up on the spot; the reserve refills in
the background and drops its noise when closed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedgl_secure.crypto import residues, seal_residues, threshold
from fedgl_secure.crypto.flooding_reserve import INITIAL_DEPTH, FloodingReserve


@pytest.fixture(scope="module")
def rings(small_he):
    return threshold.rings_for(small_he)


def _wait_until(condition, what: str) -> None:
    """Block until ``condition()`` holds (the background thread's work), failing with ``what`` if it never does."""
    event = threading.Event()
    for _ in range(600):
        if condition():
            return
        event.wait(0.05)
    raise AssertionError(f"never happened: {what}")


def test_the_noise_is_flooding_noise_of_the_width_asked_in_ntt_form(rings):
    level, std = rings.data, 2.0**30
    reserve = FloodingReserve(rings.context, level, std)
    try:
        noise = reserve.take(3)
    finally:
        reserve.close()
    assert noise.shape == (3, *level.shape) and noise.dtype == np.uint64
    assert np.all(noise < level.column())
    coefficients = residues.centred_coefficients(level, seal_residues.from_ntt(rings.context, level, noise[0]))
    values = np.asarray(coefficients, dtype=np.float64)
    assert abs(values.std() / std - 1) < 0.05
    assert abs(values.mean()) < 4 * std / np.sqrt(values.size)
    assert np.array_equal(values, np.rint(values))  # integers: a rounded Gaussian, not a float


def test_every_polynomial_is_handed_out_once_and_a_large_request_is_made_up_on_the_spot(rings):
    reserve = FloodingReserve(rings.context, rings.data, 2.0**30)
    try:
        assert reserve.ready() == 0  # nothing made before a first request
        opening = reserve.take(1)  # made on the spot; the reserve starts filling
        _wait_until(lambda: reserve.ready() >= INITIAL_DEPTH, "the initial reserve")
        first = reserve.take(INITIAL_DEPTH + 5)  # more than is ready: the rest made now
        assert first.shape[0] == INITIAL_DEPTH + 5
        # the reserve grows to twice the largest request and refills in the background
        _wait_until(lambda: reserve.ready() >= 2 * (INITIAL_DEPTH + 5), "the refill to twice the request")
        second = reserve.take(2 * (INITIAL_DEPTH + 5))
    finally:
        reserve.close()
    rows = np.concatenate([opening, first, second]).reshape(1 + len(first) + len(second), -1)
    assert len({row.tobytes() for row in rows}) == len(rows)  # no polynomial twice


def test_a_closed_reserve_holds_nothing_and_still_makes_fresh_noise(rings):
    reserve = FloodingReserve(rings.context, rings.data, 2.0**30)
    reserve.take(1)
    _wait_until(lambda: reserve.ready() > 0, "some noise made")
    reserve.close()
    assert reserve.ready() == 0
    made = reserve.take(2)
    assert made.shape == (2, *rings.data.shape) and not np.array_equal(made[0], made[1])
    assert reserve.take(0).shape == (0, *rings.data.shape)


@pytest.mark.parametrize("std", [0.0, -1.0, float("inf"), float("nan")])
def test_a_width_that_is_not_positive_and_finite_is_refused(rings, std):
    with pytest.raises(ValueError, match="flooding standard deviation"):
        FloodingReserve(rings.context, rings.data, std)
