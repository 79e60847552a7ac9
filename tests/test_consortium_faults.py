"""Faults in a real five-process consortium: banks dying or stalling, the aggregator restarting."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from consortium_harness import BANKS, NODES, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

pytestmark = pytest.mark.slow


def latest(status: dict) -> int:
    return status["latest_version"] or 0


def assert_each_version_applied_once(status: dict, versions: int) -> None:
    assert [row["base_version"] for row in applied_rounds(status)] == list(range(versions))


def test_a_dead_bank_is_timed_out_and_rejoins_a_later_round(tmp_path):
    consortium = write_consortium(tmp_path, max_rounds=40, upload_seconds=4.0, liveness_seconds=2.0)
    consortium.start(*NODES)
    try:
        consortium.wait_for(lambda s: latest(s) >= 2, "two rounds")
        consortium.kill("bank-c")  # SIGKILL: mid-round or between rounds, it never says goodbye
        without_c = consortium.wait_for(
            lambda s: any(sorted(r["contributors"]) == ["bank-a", "bank-b"] for r in applied_rounds(s)),
            "a round completed by the two remaining banks (quorum 2)",
        )
        rejoin_after = max(r["round"] for r in applied_rounds(without_c))
        consortium.start("bank-c")
        status = consortium.wait_for(
            lambda s: any(r["round"] > rejoin_after and "bank-c" in r["contributors"] for r in applied_rounds(s)),
            "bank-c contributing again after its restart",
        )
    finally:
        consortium.stop_all()
    assert_each_version_applied_once(status, status["latest_version"])


def test_below_quorum_the_round_is_aborted_and_reopened(tmp_path):
    consortium = write_consortium(tmp_path, max_rounds=40, upload_seconds=10.0, liveness_seconds=60.0)
    consortium.start(*NODES)
    try:
        consortium.wait_for(lambda s: latest(s) >= 1, "one round")
        for bank in ("bank-b", "bank-c"):  # stalled, not dead: still "live" for the next round
            consortium.signal(bank, signal.SIGSTOP)
        # an aborted round is reopened at once under the same number, so its "aborted" row lasts an instant:
        # a second attempt is what shows the abort to a poller
        aborted = consortium.wait_for(
            lambda s: any(r["status"] == "aborted" or r["attempts"] > 1 for r in s["rounds"]),
            "a round aborted below quorum",
        )
        version_at_abort = latest(aborted)
        for bank in ("bank-b", "bank-c"):
            consortium.signal(bank, signal.SIGCONT)
        status = consortium.wait_for(lambda s: latest(s) > version_at_abort, "the reopened round completing")
    finally:
        consortium.stop_all()
    reopened = [r for r in status["rounds"] if r["attempts"] > 1 and r["status"] == "applied"]
    assert reopened, status["rounds"]
    assert_each_version_applied_once(status, status["latest_version"])


def test_a_restarted_aggregator_resumes_without_losing_or_repeating_a_round(tmp_path):
    rounds = 6
    # unpacked: compared with the plaintext simulation at 1e-4 below (packed terms can round a step apart, see
    # test_consortium.py)
    consortium = write_consortium(tmp_path, max_rounds=rounds, he=SMALL_HE.model_copy(update={"packing": "none"}))
    consortium.start(*NODES)
    try:
        consortium.wait_for(lambda s: latest(s) >= 2, "two rounds")
        consortium.kill("aggregator")  # SIGKILL mid-training: no clean shutdown
        consortium.start("aggregator")
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "the end after the restart", timeout=300)
        weights = final_weights(consortium, rounds)
    finally:
        consortium.stop_all()
    assert_each_version_applied_once(status, rounds)
    assert all(sorted(r["contributors"]) == list(BANKS) for r in applied_rounds(status))
    # banks retrain an interrupted round from the same state, so the run is still the simulation's
    assert np.max(np.abs(weights - simulated_weights(consortium, rounds))) <= 1e-4
