"""Faults in a real five-process consortium: banks stalling, a bank dying mid-decryption, the key authority
restarting (a restarted aggregator: test_consortium.py, whose one run every test there shares)."""

from __future__ import annotations

import signal
import time

import pytest
import tomli_w
import tomllib
from consortium_harness import BANKS, NODES, write_consortium
from test_consortium import applied_rounds

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


DEAD_BANK_UPLOAD_SECONDS = 4.0


def test_a_bank_killed_mid_decryption_is_left_out_its_rounds_abort_and_it_rejoins_after_restarts(tmp_path):
    """t = 2 of 3, quorum 3. Bank-a is SIGKILLed right after the aggregator asked it for a partial decryption: the
    other two banks decrypt that round's sums (its uploads included). Then, bank-a dead, the next round is timed out at
    its upload deadline and aborted, and no round is applied (the two left cannot reach the quorum). The key authority
    is SIGKILLed and restarted, and bank-a restarted: each unseals the share it made (no second ceremony), the aborted
    round is reopened and applied with bank-a among the contributors, under the same collective key."""
    # liveness above a round's time: the round after the kill is opened with bank-a still "live" and is aborted at
    # its upload deadline; a short decryption timeout so the dead bank's decrypting set is replaced quickly
    consortium = write_consortium(
        tmp_path,
        max_rounds=40,
        upload_seconds=DEAD_BANK_UPLOAD_SECONDS,
        liveness_seconds=10.0,
        policy_extra={"timeouts": {"decryption_seconds": 3.0}},
    )
    _slow_bank_polls(consortium, 0.5)
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
        decrypted = consortium.wait_for(
            lambda s: any(r["round"] == target and r["status"] == "applied" for r in s["rounds"]),
            f"round {target} applied without bank-a's partial decryptions",
        )
        before = aborts(decrypted)
        stalled = consortium.wait_for(lambda s: aborts(s) - before, "a round aborted below the quorum without bank-a")
        consortium.kill("key-authority")
        consortium.start("key-authority")
        consortium.wait_healthy("key-authority")
        still = consortium.wait_for(lambda s: True, "the status")
        consortium.start("bank-a")
        status = consortium.wait_for(
            lambda s: latest(s) >= latest(stalled) + 2, "rounds applied again after the restarts"
        )
    finally:
        consortium.stop_all()
    row = next(r for r in decrypted["rounds"] if r["round"] == target)
    assert "bank-a" in row["contributors"]  # its upload is in the sums the other two banks decrypted
    retries = [e for e in consortium.events("aggregator", "partials.retry") if e["round"] == target]
    assert retries and all(e["left_out"] == ["bank-a"] for e in retries)
    assert latest(still) == latest(stalled)  # no round applied while bank-a was dead
    aborted = min(round_number for round_number, _ in aborts(stalled) - before)
    events = [e for e in consortium.events("aggregator", "round.aborted") if e["round"] == aborted]
    assert events and all(e["missing"] == ["bank-a"] and e["complete"] == ["bank-b", "bank-c"] for e in events)
    row = next(r for r in status["rounds"] if r["round"] == aborted)
    assert row["status"] == "applied" and row["attempts"] > 1 and "bank-a" in row["contributors"], row
    assert all(sorted(r["contributors"]) == list(BANKS) for r in applied_rounds(status))
    assert_each_version_applied_once(status, status["latest_version"])
    # both restarted nodes unsealed the share they made, and nobody ran a second ceremony
    assert consortium.events("key-authority", "key_share.unsealed")
    assert len(consortium.events("bank-a", "key_share.unsealed")) == 1
    assert len(consortium.events("bank-a", "ceremony.complete")) == 1
