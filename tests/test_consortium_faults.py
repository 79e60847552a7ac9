"""Faults in a real five-process consortium: banks dying or stalling, the aggregator restarting."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import tomli_w
import tomllib
from consortium_harness import BANKS, NODES, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

pytestmark = pytest.mark.slow


def latest(status: dict) -> int:
    return status["latest_version"] or 0


def assert_each_version_applied_once(status: dict, versions: int) -> None:
    assert [row["base_version"] for row in applied_rounds(status)] == list(range(versions))


def aborts(status: dict) -> set[tuple[int, int]]:
    """(round, attempt) of every aborted attempt the status shows: an aborted row's latest attempt and every earlier
    attempt of a row (a round is reopened under its number only after an abort)."""
    return {
        (row["round"], attempt)
        for row in status["rounds"]
        for attempt in range(1, row["attempts"] + (row["status"] == "aborted"))
    }


DEAD_BANK_UPLOAD_SECONDS = 4.0


def test_a_dead_bank_is_timed_out_and_rejoins_a_later_round(tmp_path):
    """Quorum 3 with 3 banks (the threshold t = 2 needs a quorum above it): while bank-c is dead (SIGKILL) the two
    banks left cannot reach the quorum, so its rounds are timed out at the upload deadline and aborted, and no round
    is applied; restarted, bank-c unseals its key share from its state directory (no new ceremony), the aborted
    round is reopened and applied with it among the contributors, and training goes on, each version applied once."""
    # liveness above a round's time: the round after the kill is opened with bank-c still "live" and is aborted at
    # its upload deadline (with a shorter window the aggregator could wait for a live quorum without opening one)
    consortium = write_consortium(
        tmp_path, max_rounds=40, upload_seconds=DEAD_BANK_UPLOAD_SECONDS, liveness_seconds=10.0
    )
    consortium.start(*NODES)
    try:
        at_kill = consortium.wait_for(lambda s: latest(s) >= 2, "two rounds")
        consortium.kill("bank-c")  # SIGKILL: mid-round or between rounds, it never says goodbye
        before = aborts(at_kill)
        stalled = consortium.wait_for(lambda s: aborts(s) - before, "a round aborted below the quorum without bank-c")
        # a round uploaded to before the kill may still have been applied with bank-c's upload; none after the abort
        time.sleep(DEAD_BANK_UPLOAD_SECONDS + 2.0)  # past another upload deadline: bank-c is still dead
        still = consortium.wait_for(lambda s: True, "the status")
        consortium.start("bank-c")
        status = consortium.wait_for(
            lambda s: latest(s) >= latest(stalled) + 2, "rounds applied again after bank-c's restart"
        )
    finally:
        consortium.stop_all()
    assert latest(still) == latest(stalled)  # no round applied while bank-c was dead
    aborted = min(round_number for round_number, _ in aborts(stalled) - before)
    assert not any(r["round"] == aborted for r in applied_rounds(still))
    # timed out: the two live banks uploaded, bank-c's upload was missing at the deadline
    events = [e for e in consortium.events("aggregator", "round.aborted") if e["round"] == aborted]
    assert events and all(e["missing"] == ["bank-c"] and e["complete"] == ["bank-a", "bank-b"] for e in events)
    # reopened under the same number and applied once bank-c was back, with its upload
    row = next(r for r in status["rounds"] if r["round"] == aborted)
    assert row["status"] == "applied" and row["attempts"] > 1 and "bank-c" in row["contributors"], row
    # no round is ever applied without bank-c: each needs all three (the quorum)
    assert all(sorted(r["contributors"]) == list(BANKS) for r in applied_rounds(status))
    assert_each_version_applied_once(status, status["latest_version"])
    assert len(consortium.events("bank-c", "key_share.unsealed")) == 1  # its restart unsealed the sealed share
    assert len(consortium.events("bank-c", "ceremony.complete")) == 1  # made once, at its first start


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


def _slow_bank_polls(consortium, seconds: float) -> None:
    """Banks poll the aggregator every ``seconds`` (the harness's 0.1 s makes a round's decryption a blink)."""
    for bank in BANKS:
        path = consortium.config_path(bank)
        node = tomllib.loads(path.read_text())
        node["bank"]["poll_seconds"] = seconds
        path.write_text(tomli_w.dumps(node))


def _first_requests(consortium) -> dict[int, dict]:
    """The aggregator's first partial-decryption request of each round (its first kind)."""
    first: dict[int, dict] = {}
    for event in consortium.events("aggregator", "partials.requested"):
        first.setdefault(event["round"], event)
    return first


def test_a_bank_killed_during_a_decryption_does_not_stop_the_round_and_the_key_authority_resumes(tmp_path):
    """t = 2 of 3, quorum 3: bank-a is SIGKILLed right after the aggregator asked it for a partial decryption; the
    other two banks decrypt the round's sums (its uploads included). Then the key authority is SIGKILLed and
    restarted, and bank-a restarted: each resumes with its sealed share (no new key ceremony) and the next round,
    which needs all three banks' uploads, is decrypted under the same collective key."""
    consortium = write_consortium(tmp_path, max_rounds=40, upload_seconds=10.0, liveness_seconds=2.0)
    _slow_bank_polls(consortium, 1.0)
    consortium.start(*NODES)
    try:
        consortium.wait_for(lambda s: latest(s) >= 1, "one round")
        deadline, target = time.monotonic() + 120, None
        while target is None and time.monotonic() < deadline:
            for round_number, event in sorted(_first_requests(consortium).items()):
                if round_number >= 2 and "bank-a" in event["decrypting_set"]:
                    target = round_number
                    break
            else:
                time.sleep(0.05)
        assert target is not None, "no round asked bank-a for a partial decryption"
        consortium.kill("bank-a")  # mid-decryption: the round's later kinds still need its partial
        status = consortium.wait_for(
            lambda s: any(r["round"] == target and r["status"] == "applied" for r in s["rounds"]),
            f"round {target} applied without bank-a's partial decryptions",
        )
        consortium.kill("key-authority")
        consortium.start("key-authority")
        consortium.wait_healthy("key-authority")
        consortium.start("bank-a")
        after = consortium.wait_for(
            lambda s: any(r["round"] > target and r["status"] == "applied" for r in s["rounds"]),
            "a round after the restarts",
        )
    finally:
        consortium.stop_all()
    row = next(r for r in status["rounds"] if r["round"] == target)
    assert "bank-a" in row["contributors"]  # its upload is in the sums the other two banks decrypted
    retries = [e for e in consortium.events("aggregator", "partials.retry") if e["round"] == target]
    assert retries and all(e["left_out"] == ["bank-a"] for e in retries)
    later = [r for r in applied_rounds(after) if r["round"] > target]
    assert later and all(sorted(r["contributors"]) == list(BANKS) for r in later)
    # both restarted nodes unsealed the share they made, and nobody ran a second ceremony
    assert consortium.events("key-authority", "key_share.unsealed")
    assert len(consortium.events("bank-a", "key_share.unsealed")) == 1
    assert len(consortium.events("bank-a", "ceremony.complete")) == 1
