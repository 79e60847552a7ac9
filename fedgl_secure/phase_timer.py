"""Wall-clock seconds per named phase of one unit of work (a bank's round, the aggregator's step).

Services log the result with the event that ends the work (``round.uploaded``, ``round.applied``),
so an operator, and ``benchmarks/consortium_scale.py``, can tell which phase a slow round spent its
time in without a profiler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates seconds per phase; a phase entered twice adds up (e.g. one upload per kind).

    Phases are exclusive: time spent in a phase entered inside another counts for the inner one
    only, so the phases of a unit of work never add up to more than its wall time (the aggregator's
    decryption happens inside its aggregation step, and is reported apart from it). ``clock`` reads seconds
    (``time.perf_counter`` by default; a test gives its own).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._seconds: dict[str, float] = {}
        self._open: list[str] = []
        self._since = 0.0

    def _credit_open_phase(self, now: float) -> None:
        if self._open:
            name = self._open[-1]
            self._seconds[name] = self._seconds.get(name, 0.0) + now - self._since
        self._since = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._credit_open_phase(self._clock())
        self._seconds.setdefault(name, 0.0)
        self._open.append(name)
        try:
            yield
        finally:
            self._credit_open_phase(self._clock())
            self._open.pop()

    def add(self, name: str, seconds: float) -> None:
        """Credit seconds measured elsewhere (e.g. by a library call that reports its own time)."""
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        """Seconds per phase in the order phases were first entered, rounded to milliseconds."""
        return {name: round(value, 3) for name, value in self._seconds.items()}
