"""consortium/decryption_board.DecryptionBoard: how the aggregator gathers t banks' partial decryptions of a sum.

Threads play the banks: each polls ``pending_for`` as a bank's PartialDecryptionWorker polls the aggregator, and
answers with a partial, a refusal, or nothing. The board checks only the partials' shape (the Lagrange factors and
the decryption itself are the banks' and the fusion's business), so a toy ring level keeps these tests instant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from fedgl_secure.consortium.decryption_board import DecryptionBoard, DecryptionTask, DecryptionUnavailable
from fedgl_secure.crypto.residues import RingLevel
from fedgl_secure.errors import DecryptionRefused, ProtocolConflict

LEVEL = RingLevel(parms_id=(1, 2, 3, 4), moduli=(97, 101), degree=8)
CHUNKS = 2
C1S = [np.zeros((CHUNKS, *LEVEL.shape), dtype=np.uint64) for _ in range(3)]  # three receipted uploads
BANKS = ("bank-a", "bank-b", "bank-c")
ROUND, KIND = 4, "weights"


def _partial(value: int) -> np.ndarray:
    """A well-formed partial decryption (CHUNKS, k, N) every residue of which is ``value`` (below every prime)."""
    return np.full((CHUNKS, *LEVEL.shape), value, dtype=np.uint64)


def _always_alive(bank: str) -> bool:
    return True


class PlayedBank:
    """A bank polling the board on its own thread; ``answer(task)`` says what it posts: ``("partial", residues)``,
    ``("refuse", reason, detail)`` or ``None`` (silent). Every task it was shown is kept in ``seen``; an answer to
    a task closed meanwhile is refused by the board, and the bank carries on (as ``PartialDecryptionWorker`` does)."""

    def __init__(self, board: DecryptionBoard, name: str, answer: Callable[[DecryptionTask], tuple | None]) -> None:
        self.board, self.name, self.answer = board, name, answer
        self.seen: list[DecryptionTask] = []
        self.late: list[str] = []  # the codes of answers the board no longer took
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            for task in self.board.pending_for(self.name):
                if any(task is earlier for earlier in self.seen):
                    continue  # a silent bank is shown its open task at every poll
                self.seen.append(task)
                reply = self.answer(task)
                if reply is None:
                    continue
                try:
                    if reply[0] == "partial":
                        self.board.accept_partial(task.task_id, self.name, reply[1])
                    else:
                        self.board.accept_refusal(task.task_id, self.name, reply[1], reply[2])
                except ProtocolConflict as conflict:  # the task closed meanwhile (another bank refused first)
                    self.late.append(conflict.code)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


@pytest.fixture
def board():
    return DecryptionBoard(LEVEL)


@pytest.fixture
def play(board):
    """``play(name, answer)`` starts a played bank (on ``board``, or the board given as ``on``); all are stopped at
    the end of the test."""
    banks: list[PlayedBank] = []

    def start(name: str, answer: Callable[[DecryptionTask], tuple | None], on=None) -> PlayedBank:
        bank = PlayedBank(board if on is None else on, name, answer)
        banks.append(bank)
        return bank

    yield start
    for bank in banks:
        bank.close()


def _gather(board, candidates=BANKS, threshold=2, timeout=10.0, alive=_always_alive, stop=None, left_out=None):
    return board.gather(
        ROUND,
        KIND,
        ["receipt"] * len(C1S),
        C1S,
        candidates,
        threshold,
        timeout,
        alive,
        stop or threading.Event(),
        left_out,
    )


def _answers_with(value: int, delay: float = 0.0):
    def answer(task):
        time.sleep(delay)
        return ("partial", _partial(value))

    return answer


def _silent(task):
    return None


def test_when_every_bank_of_the_set_answers_the_set_and_its_partials_come_back_in_set_order(board, play):
    # bank-a answers last: the partials still come back in the set's order, not in the order they arrived
    banks = {
        "bank-a": play("bank-a", _answers_with(1, delay=0.3)),
        "bank-b": play("bank-b", _answers_with(2)),
        "bank-c": play("bank-c", _answers_with(3)),
    }
    chosen, partials = _gather(board, candidates=["bank-b", "bank-a", "bank-c"])
    assert chosen == ("bank-b", "bank-a")
    assert [int(p[0, 0, 0]) for p in partials] == [2, 1]
    assert all(p.shape == (CHUNKS, *LEVEL.shape) and p.dtype == np.uint64 for p in partials)
    (task,) = banks["bank-a"].seen
    assert banks["bank-b"].seen == [task] and banks["bank-c"].seen == []  # one task, for the first t candidates only
    assert (task.round, task.kind, task.decrypting_set, task.chunks) == (ROUND, KIND, ("bank-b", "bank-a"), CHUNKS)
    assert len(task.upload_c1) == len(C1S) and len(task.receipts) == len(C1S)
    assert board.pending_for("bank-a") == [] and board.pending_for("bank-b") == []  # the task is closed


def test_a_silent_bank_that_is_not_alive_is_left_out_of_a_second_task_at_once(board, play):
    # bank-a goes down once the first task is out (bank-b has seen it): from then on it is silent and not alive
    first_seen = threading.Event()

    def answer_b(task):
        first_seen.set()
        return ("partial", _partial(2))

    banks = {"bank-b": play("bank-b", answer_b), "bank-c": play("bank-c", _answers_with(3))}
    silent = play("bank-a", _silent)
    # a 10-minute timeout: the test would hang, not pass, if a bank that is gone were waited for
    chosen, partials = _gather(board, timeout=600.0, alive=lambda bank: bank != "bank-a" or not first_seen.is_set())
    assert chosen == ("bank-b", "bank-c") and [int(p[0, 0, 0]) for p in partials] == [2, 3]
    assert [task.decrypting_set for task in banks["bank-b"].seen] == [("bank-a", "bank-b"), ("bank-b", "bank-c")]
    first, second = banks["bank-b"].seen
    assert first.task_id != second.task_id  # a new task: partials of two sets never mix
    assert [task.decrypting_set for task in banks["bank-c"].seen] == [("bank-b", "bank-c")]
    assert len(silent.seen) <= 1  # never asked again once left out


def test_a_silent_bank_that_is_still_alive_is_waited_for_until_the_timeout_then_left_out(board, play):
    play("bank-a", _silent)
    for value, name in enumerate(("bank-b", "bank-c"), start=2):
        play(name, _answers_with(value))
    left_out = {"bank-x"}  # the caller's set of a round's failed banks: the board adds to it
    chosen, partials = _gather(board, timeout=0.6, left_out=left_out)
    assert chosen == ("bank-b", "bank-c") and [int(p[0, 0, 0]) for p in partials] == [2, 3]
    assert left_out == {"bank-x", "bank-a"}


def test_a_refusing_bank_is_left_out_and_named_with_its_reason_when_too_few_remain(board, play):
    refusing = play("bank-a", lambda task: ("refuse", "bad-receipt", "receipt 0: forged signature"))
    play("bank-b", _answers_with(2))
    play("bank-c", _answers_with(3))
    chosen, partials = _gather(board)
    assert chosen == ("bank-b", "bank-c") and [int(p[0, 0, 0]) for p in partials] == [2, 3]
    assert len(refusing.seen) == 1  # asked once, never again after refusing

    # a sum for which one bank refuses and another is gone: fewer than t = 2 remain, and the error says who and why
    other = DecryptionBoard(LEVEL)
    play("bank-a", lambda task: ("refuse", "budget-exhausted", "4096 ciphertexts decrypted"), on=other)
    play("bank-b", _answers_with(2), on=other)
    play("bank-c", _silent, on=other)
    with pytest.raises(DecryptionUnavailable) as caught:
        _gather(other, timeout=30.0, alive=lambda bank: bank != "bank-c")
    message = str(caught.value)
    assert f"'{KIND}' of round {ROUND}: fewer than t = 2 banks gave their partial decryption" in message
    assert "bank-a: budget-exhausted: 4096 ciphertexts decrypted" in message
    assert "bank-c: did not answer" in message
    assert "bank-b:" not in message  # it answered; only the remaining count fell short


def test_too_few_candidates_is_unavailable_without_posting_a_task(board, play):
    lonely = play("bank-a", _answers_with(1))
    with pytest.raises(DecryptionUnavailable, match="fewer than t = 2 banks .*no candidates"):
        _gather(board, candidates=["bank-a"])
    with pytest.raises(DecryptionUnavailable, match="no candidates"):
        _gather(board, candidates=["bank-a", "bank-a"])  # one bank named twice is still one bank
    time.sleep(0.05)
    assert lonely.seen == []


def test_a_stop_ends_the_wait_as_a_stopped_refusal_and_closes_the_task(board, play):
    silent = play("bank-a", _silent)
    play("bank-b", _answers_with(2))
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(DecryptionRefused) as caught:  # a 10-minute timeout: without the stop the test would hang
        _gather(board, timeout=600.0, stop=stop)
    assert caught.value.reason == "stopped"
    assert len(silent.seen) == 1
    assert board.pending_for("bank-a") == []  # the abandoned task is gone from the board
    with pytest.raises(ProtocolConflict, match="no-such-task"):
        board.accept_partial(silent.seen[0].task_id, "bank-a", _partial(1))


def test_accept_partial_refuses_a_wrong_shape_a_stranger_a_second_answer_and_an_unknown_task(board):
    result: dict = {}

    def aggregator():
        try:
            result["gathered"] = _gather(board)
        except Exception as error:  # surfaced by the assertions below
            result["error"] = error

    thread = threading.Thread(target=aggregator, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not (pending := board.pending_for("bank-a")) and time.monotonic() < deadline:
        time.sleep(0.01)
    (task,) = pending
    assert task.decrypting_set == ("bank-a", "bank-b") and board.pending_for("bank-c") == []

    def conflict(call) -> ProtocolConflict:
        with pytest.raises(ProtocolConflict) as caught:
            call()
        return caught.value

    wrong = [
        np.zeros((CHUNKS + 1, *LEVEL.shape), dtype=np.uint64),  # one chunk too many
        _partial(1)[:, :, :-1],  # residues missing
        _partial(1).astype(np.int64),  # not uint64
        np.full((CHUNKS, *LEVEL.shape), 97, dtype=np.uint64),  # at the first prime: not reduced
    ]
    for residues in wrong:
        assert conflict(lambda r=residues: board.accept_partial(task.task_id, "bank-a", r)).code == "bad-partial"
    assert conflict(lambda: board.accept_partial(task.task_id, "bank-c", _partial(3))).code == "not-in-decrypting-set"
    assert conflict(lambda: board.accept_refusal(task.task_id, "bank-c", "x", "y")).code == "not-in-decrypting-set"
    assert conflict(lambda: board.task_for(task.task_id, "bank-c")).code == "not-in-decrypting-set"
    unknown = "0" * 32
    assert conflict(lambda: board.accept_partial(unknown, "bank-a", _partial(1))).code == "no-such-task"
    assert conflict(lambda: board.accept_refusal(unknown, "bank-a", "x", "y")).code == "no-such-task"
    assert board.pending_for("bank-a") == [task]  # none of it counted as bank-a's answer

    board.accept_partial(task.task_id, "bank-a", _partial(1))
    assert board.pending_for("bank-a") == [] and board.pending_for("bank-b") == [task]
    assert conflict(lambda: board.accept_partial(task.task_id, "bank-a", _partial(5))).code == "already-answered"
    assert conflict(lambda: board.accept_refusal(task.task_id, "bank-a", "x", "y")).code == "already-answered"
    board.accept_partial(task.task_id, "bank-b", _partial(2))
    thread.join(timeout=5)
    assert "error" not in result, result
    chosen, partials = result["gathered"]
    # the first answers were kept: the refused second one changed nothing
    assert chosen == ("bank-a", "bank-b") and [int(p[0, 0, 0]) for p in partials] == [1, 2]
    # a task closed once gathered is unknown from then on
    assert conflict(lambda: board.accept_partial(task.task_id, "bank-b", _partial(2))).code == "no-such-task"
