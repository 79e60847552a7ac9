"""PhaseTimer on a clock the test moves by hand: exact seconds, no sleeping and no wall-clock bounds."""

from fedgl_secure.phase_timer import PhaseTimer


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_phases_accumulate_in_first_entered_order():
    clock = ManualClock()
    timer = PhaseTimer(clock)
    with timer.phase("upload"):
        clock.advance(0.25)
    with timer.phase("encryption"):
        pass
    clock.advance(7.0)  # outside every phase: counted nowhere
    with timer.phase("upload"):
        clock.advance(0.5)
    timer.add("encryption", 1.5)
    assert timer.seconds() == {"upload": 0.75, "encryption": 1.5}
    assert list(timer.seconds()) == ["upload", "encryption"]


def test_a_phase_that_raises_is_still_counted():
    clock = ManualClock()
    timer = PhaseTimer(clock)
    try:
        with timer.phase("training"):
            clock.advance(2.0)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert timer.seconds() == {"training": 2.0}


def test_a_nested_phase_counts_for_itself_only():
    """The inner phase's seconds are not counted again in the outer one: the phases add up to the wall time."""
    clock = ManualClock()
    timer = PhaseTimer(clock)
    with timer.phase("aggregation"):
        clock.advance(0.2)
        with timer.phase("decryption"):
            clock.advance(0.5)
        clock.advance(0.125)
    assert timer.seconds() == {"aggregation": 0.325, "decryption": 0.5}
    assert sum(timer.seconds().values()) == 0.825


def test_seconds_are_rounded_to_milliseconds():
    clock = ManualClock()
    timer = PhaseTimer(clock)
    with timer.phase("download"):
        clock.advance(0.0123456)
    assert timer.seconds() == {"download": 0.012}
