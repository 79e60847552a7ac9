import time

from fedgl_secure.phase_timer import PhaseTimer


def test_phases_accumulate_in_first_entered_order():
    timer = PhaseTimer()
    with timer.phase("upload"):
        time.sleep(0.01)
    with timer.phase("encryption"):
        pass
    with timer.phase("upload"):
        time.sleep(0.01)
    timer.add("encryption", 1.5)
    seconds = timer.seconds()
    assert list(seconds) == ["upload", "encryption"]
    assert seconds["upload"] >= 0.02
    assert 1.5 <= seconds["encryption"] < 1.6


def test_a_phase_that_raises_is_still_counted():
    timer = PhaseTimer()
    try:
        with timer.phase("training"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "training" in timer.seconds()
