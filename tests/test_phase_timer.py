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


def test_a_nested_phase_counts_for_itself_only():
    timer = PhaseTimer()
    started = time.perf_counter()
    with timer.phase("aggregation"):
        time.sleep(0.02)
        with timer.phase("decryption"):
            time.sleep(0.05)
        time.sleep(0.02)
    wall = time.perf_counter() - started
    seconds = timer.seconds()
    assert 0.05 <= seconds["decryption"] < 0.09
    assert 0.04 <= seconds["aggregation"] < 0.08  # the 0.05 s inside decryption is not counted twice
    assert sum(seconds.values()) <= wall + 0.002
