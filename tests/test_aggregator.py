"""The aggregator's round state machine in-process (real CKKS, real key-authority rules, no network).

Threshold CKKS: each fixture runs the key ceremony in-process (a key authority and the test's banks, t from the
policy), and every bank serves the coordinator's decryption board on a thread of its own with its
``BankDecryptor`` (``bank_keys.PartialDecryptionWorker`` over an in-process stand-in for the aggregator's HTTP
endpoints), so a round is decrypted as the services decrypt it: the key authority's partial, then t banks'.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.coordinator import Coordinator
from fedgl_secure.consortium.pseudonyms import pseudonymise
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.centring import centre_term
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.key_authority import AGGREGATOR, KeyAuthority
from fedgl_secure.crypto.secure_summation import local_key_ceremony
from fedgl_secure.crypto.upload import RoundTicket, make_upload
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import CiphertextError, ContextError, ProtocolConflict, ReceiptError
from fedgl_secure.log import get_logger
from fedgl_secure.policy.schema import Policy, Timeouts
from fedgl_secure.services.bank_keys import PartialDecryptionWorker
from fedgl_secure.wire import encodings

BANKS = ("bank-a", "bank-b", "bank-c")
QUORUM = 3  # above t = 2 (the policy's he.threshold): a sum keeps two honest banks against t - 1 colluding ones
FEDERATION = "fed-test"
OPERATOR_SECRET = b"operator-secret-for-tests-0123"
POLL_SECONDS = 0.05  # how often a bank's decryption thread polls the board


class InProcessDecryptor:
    """The key authority library behind the aggregator's Decryptor protocol."""

    def __init__(self, authority: KeyAuthority) -> None:
        self.authority = authority

    def open_round(self, federation, round_number, nonce, participants, policy_sha256):
        self.authority.open_round(federation, round_number, nonce, participants, policy_sha256)

    def decrypt(self, federation, round_number, kind, receipts, fingerprint, length, upload_c1):
        return self.authority.decrypt_sum(
            AGGREGATOR, federation, round_number, kind, receipts, fingerprint, length, upload_c1
        )


class BoardPort:
    """What ``PartialDecryptionWorker`` calls on an ``AggregatorClient``, served by the coordinator's board
    in-process as the aggregator's ``/v1/decryptions`` endpoints serve it (the task list is a poll: a heartbeat)."""

    def __init__(self, coordinator: Coordinator, bank: str) -> None:
        self.coordinator, self.bank = coordinator, bank

    def decryption_tasks(self):
        self.coordinator.heartbeat(self.bank)
        return self.coordinator.board.pending_for(self.bank)

    def decryption_c1(self, task, shape):
        return list(self.coordinator.board.task_for(task.task_id, self.bank).upload_c1)

    def post_partial(self, task_id, residues):
        self.coordinator.board.accept_partial(task_id, self.bank, residues)

    def refuse_decryption(self, task_id, reason, detail):
        self.coordinator.board.accept_refusal(task_id, self.bank, reason, detail)


class Federation:
    """The key ceremony run in-process over a roster of the banks of ``keys`` (t from the policy): the key authority,
    each bank's ``BankDecryptor`` (its ledger under ``root/banks``), and the decryption threads :meth:`serve` starts."""

    def __init__(self, root, policy: Policy, keys: dict[str, Ed25519PrivateKey]) -> None:
        self.policy, self.keys, self.banks = policy, keys, tuple(keys)
        roster = Roster(FEDERATION, self.banks, policy.he.threshold, policy.digest)
        self.authority = KeyAuthority(root / "ka", policy, OPERATOR_SECRET, roster)
        for bank, key in keys.items():
            self.authority.register_bank(bank, key.public_key())
        self.decryptors = local_key_ceremony(self.authority, keys, root / "banks")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def serve(self, coordinator: Coordinator, banks=None) -> None:
        """A decryption thread per bank of ``banks`` (default: all), each answering ``coordinator``'s board."""
        for bank in self.banks if banks is None else banks:
            log = get_logger(role="bank", bank=bank)
            worker = PartialDecryptionWorker(BoardPort(coordinator, bank), self.decryptors[bank], POLL_SECONDS, log)
            thread = threading.Thread(target=worker.run, args=(self._stop,), daemon=True, name=f"decrypt-{bank}")
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for decryptor in self.decryptors.values():
            decryptor.close()
        self.authority.close()


@pytest.fixture
def setup(tmp_path, small_he):
    policy = Policy(he=small_he, quorum=QUORUM, timeouts=Timeouts(round_seconds=30, upload_seconds=20))
    keys = {bank: Ed25519PrivateKey.generate() for bank in BANKS}
    federation = Federation(tmp_path / "federation", policy, keys)
    store = AggregatorStore(tmp_path / "aggregator.sqlite3")
    coordinator = _coordinator(federation, store, max_rounds=1)
    yield coordinator, federation, keys, policy
    store.close()
    federation.close()


def test_the_aggregator_context_holds_no_secret_key(setup, small_context):
    coordinator, *_ = setup
    assert not coordinator.context.has_secret_key()
    with pytest.raises(ContextError, match="secret key"):
        ckks.load_public_context(ckks.secret_context_bytes(small_context))


def wait_open(coordinator: Coordinator, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = coordinator.round_view("bank-a")
        if view.phase == "open":
            return view
        time.sleep(0.05)
    raise AssertionError("no round opened")


def test_bad_uploads_are_refused_and_the_round_still_completes(setup):
    coordinator, _, keys, policy = setup
    key = b"k" * 32
    for offset, bank in enumerate(BANKS):  # overlapping node sets
        coordinator.enrol(bank, 5, 3, pseudonymise(key, range(offset * 10, offset * 10 + 40)))
    with pytest.raises(ProtocolConflict, match="cannot change"):
        coordinator.enrol("bank-a", 5, 3, pseudonymise(key, range(3)))
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        view = wait_open(coordinator)
        size, positions = coordinator.index_for("bank-a")
        assert size == 60 and sorted(positions.tolist()) == sorted(set(positions.tolist()))
        ticket = RoundTicket(
            "fed-test", view.round, view.nonce, tuple(view.participants), view.context_fingerprint, view.policy_sha256
        )
        rng = np.random.default_rng(0)
        values = {kind: rng.uniform(0, 1, shape) for kind, shape in view.shapes.items()}

        def upload(bank, kind, data=None):
            return make_upload(
                coordinator.context, policy.he, ticket, bank, keys[bank], kind, values[kind] if data is None else data
            )

        good = upload("bank-a", "weights")
        garbage = [b"\x00" * len(chunk) for chunk in good.chunks]
        forged = make_upload(
            coordinator.context, policy.he, ticket, "bank-a", keys["bank-a"], "weights", values["weights"]
        )
        # a valid receipt over bytes that are not ciphertexts: caught before anything is added
        signed_garbage = _resigned(good, garbage, keys["bank-a"])
        with pytest.raises(CiphertextError, match="not a CKKS ciphertext"):
            coordinator.accept_upload("bank-a", view.round, "weights", garbage, signed_garbage)
        truncated = [chunk[: len(chunk) // 2] for chunk in good.chunks]
        with pytest.raises(CiphertextError):
            coordinator.accept_upload(
                "bank-a", view.round, "weights", truncated, _resigned(good, truncated, keys["bank-a"])
            )
        with pytest.raises(ReceiptError, match="digest"):
            coordinator.accept_upload("bank-a", view.round, "weights", garbage, good.receipt)
        with pytest.raises(ReceiptError):  # bank-b's receipt replayed as bank-a's
            coordinator.accept_upload("bank-a", view.round, "weights", good.chunks, upload("bank-b", "weights").receipt)
        with pytest.raises(CiphertextError, match="expects kinds"):
            coordinator.accept_upload("bank-a", view.round, "secrets", good.chunks, good.receipt)
        # a receipt bank-a signed over its chunks but with another c1 digest: refused at upload, on its own
        from fedgl_secure.crypto.receipts import sign_receipt

        wrong_c1 = sign_receipt(keys["bank-a"], good.receipt.fields().model_copy(update={"c1_sha256": "7" * 64}))
        with pytest.raises(ReceiptError, match="c1 does not match"):
            coordinator.accept_upload("bank-a", view.round, "weights", good.chunks, wrong_c1)
        with pytest.raises(ProtocolConflict, match="stale-round"):
            coordinator.accept_upload("bank-a", view.round + 1, "weights", good.chunks, good.receipt)
        assert coordinator.accept_upload("bank-a", view.round, "weights", good.chunks, good.receipt)
        assert not coordinator.accept_upload("bank-a", view.round, "weights", good.chunks, good.receipt)  # idempotent
        with pytest.raises(ProtocolConflict, match="already-uploaded"):
            coordinator.accept_upload("bank-a", view.round, "weights", forged.chunks, forged.receipt)
        for bank in BANKS:
            for kind in view.shapes:
                if (bank, kind) != ("bank-a", "weights"):
                    made = upload(bank, kind)
                    coordinator.accept_upload(bank, view.round, kind, made.chunks, made.receipt)
        driver.join(timeout=60)
        assert not driver.is_alive()
    finally:
        stop.set()
    status = coordinator.status()
    assert status["phase"] == "finished" and status["latest_version"] == 1
    assert status["rounds"][0]["status"] == "applied"
    assert sorted(status["rounds"][0]["contributors"]) == list(BANKS)


def _resigned(upload, chunks, key):
    from fedgl_secure.crypto.receipts import ReceiptFields, ciphertext_digest, sign_receipt

    fields = upload.receipt.fields().model_dump()
    fields["ciphertext_sha256"] = ciphertext_digest(chunks)
    return sign_receipt(key, ReceiptFields(**fields))


def test_a_setup_whose_rounds_could_never_decrypt_is_refused(small_he):
    from fedgl_secure.consortium.setup_checks import check_consortium_can_run
    from fedgl_secure.errors import ConfigError

    config = build_config({"dataset": "synthetic", "federation": {"proportions": [0.5, 0.5, 0.5]}})
    with pytest.raises(ConfigError, match="allowed_kinds"):
        check_consortium_can_run(config, Policy(he=small_he, allowed_kinds=("weights",)), 3)
    sparse = build_config(
        {"dataset": "synthetic", "federation": {"proportions": [0.5, 0.5, 0.5], "participation": 0.4}}
    )
    with pytest.raises(ConfigError, match="quorum"):
        check_consortium_can_run(sparse, Policy(he=small_he, quorum=QUORUM), 3)
    check_consortium_can_run(config, Policy(he=small_he, quorum=3), 3)
    # t banks and the key authority decrypt together: t above the consortium's banks could never decrypt a sum
    four = Policy(he=small_he.model_copy(update={"threshold": 4}), quorum=5)
    with pytest.raises(ConfigError, match=r"he.threshold t = 4 exceeds the consortium's 3 banks"):
        check_consortium_can_run(config, four, 3)


def test_union_positions_are_a_secret_permutation_shared_by_every_holder():
    from fedgl_secure.consortium.pseudonyms import union_positions

    key = b"p" * 32
    sets = [pseudonymise(key, range(0, 50)), pseudonymise(key, range(25, 80))]
    size, (first, second) = union_positions(sets)
    assert size == 80
    assert sorted(set(first.tolist()) | set(second.tolist())) == list(range(80))
    assert first[25:].tolist() == second[:25].tolist()  # a shared customer has one position
    orders = {tuple(union_positions(sets)[1][0].tolist()) for _ in range(5)}
    assert len(orders) > 1  # not the sorted order every time: positions reveal nothing but M


def _coordinator(federation: Federation, store, max_rounds, method=None, serving=None):
    """A coordinator of ``federation``'s banks over its collective public context and key authority, its board served
    by the decryption threads of the banks ``serving`` (default: all)."""
    proportions = [0.5] * len(federation.banks)
    experiment = {
        "dataset": "synthetic",
        "federation": {"proportions": proportions, "max_rounds": max_rounds, "patience": 50},
    }
    config = build_config(experiment if method is None else {**experiment, "method": method})
    coordinator = Coordinator(
        federation=FEDERATION,
        config=config,
        policy=federation.policy,
        banks=federation.banks,
        signing_keys={bank: key.public_key() for bank, key in federation.keys.items()},
        public_context=federation.authority.public_context,
        store=store,
        decryptor=InProcessDecryptor(federation.authority),
    )
    federation.serve(coordinator, serving)
    return coordinator


def _upload_all(coordinator, policy, keys, view, banks):
    ticket = RoundTicket(
        "fed-test", view.round, view.nonce, tuple(view.participants), view.context_fingerprint, view.policy_sha256
    )
    for bank in banks:
        for kind, shape in view.shapes.items():
            made = make_upload(coordinator.context, policy.he, ticket, bank, keys[bank], kind, np.full(shape, 0.5))
            coordinator.accept_upload(bank, view.round, kind, made.chunks, made.receipt)


def _wait_round(coordinator, number, timeout=30.0, other_than=None):
    """The view of round ``number`` once open (with a nonce other than ``other_than``: reopened)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = coordinator.round_view("bank-c")
        if view.phase == "open" and view.round == number and view.nonce != other_than:
            return view
        time.sleep(0.05)
    raise AssertionError(f"round {number} did not open: {coordinator.status()}")


def _four_banks(tmp_path, policy, name, max_rounds):
    """Four enrolled banks (one more than the quorum of 3): their keys, key authority and decryptors, and a
    coordinator over a fresh store."""
    banks = (*BANKS, "bank-d")
    keys = {bank: Ed25519PrivateKey.generate() for bank in banks}
    federation = Federation(tmp_path / name, policy, keys)
    store = AggregatorStore(tmp_path / f"{name}.sqlite3")
    coordinator = _coordinator(federation, store, max_rounds=max_rounds)
    for offset, bank in enumerate(banks):
        coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
    return banks, keys, federation, store, coordinator


def test_a_late_participant_aborts_the_round_which_reopens_without_it(small_he, tmp_path):
    """Every decryptor refuses a sum without each participant its receipts name (R13), so the aggregator does not
    decrypt the banks that made the deadline: it aborts the round and reopens it, with a fresh nonce, without the
    late bank (four banks: the other three still reach the quorum), and applies that attempt."""
    policy = Policy(he=small_he, quorum=QUORUM, timeouts=Timeouts(round_seconds=30, upload_seconds=2))
    banks, keys, _, store, coordinator = _four_banks(tmp_path, policy, "late", max_rounds=1)
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        first = _wait_round(coordinator, 1)
        assert first.participants == banks
        _upload_all(coordinator, policy, keys, first, ["bank-b", "bank-c", "bank-d"])  # bank-a stays silent
        reopened = _wait_round(coordinator, 1, other_than=first.nonce)
        assert reopened.participants == ("bank-b", "bank-c", "bank-d")
        _upload_all(coordinator, policy, keys, reopened, ["bank-b", "bank-c", "bank-d"])
        driver.join(timeout=30)
        assert not driver.is_alive()
    finally:
        stop.set()
    [row] = coordinator.status()["rounds"]
    assert (row["round"], row["status"], row["attempts"]) == (1, "applied", 2)
    assert row["contributors"] == ["bank-b", "bank-c", "bank-d"]
    store.close()


def test_withdrawn_banks_are_not_awaited_nor_invited_and_the_run_stops_below_quorum(setup, tmp_path):
    _, _, _, policy = setup  # upload deadline 20 s: nothing below may wait for it
    # four banks, so that one can withdraw and the quorum of 3 still be met
    banks, keys, federation, store, coordinator = _four_banks(tmp_path, policy, "four-banks", max_rounds=5)
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        first = _wait_round(coordinator, 1)
        assert coordinator.withdraw("bank-a", "privacy-budget-exhausted", 1)
        assert not coordinator.withdraw("bank-a", "privacy-budget-exhausted", 1)  # idempotent
        with pytest.raises(ProtocolConflict, match="bad-withdrawal"):
            coordinator.withdraw("bank-b", "bored", 1)
        with pytest.raises(ProtocolConflict, match="unknown-bank"):
            coordinator.withdraw("bank-x", "privacy-budget-exhausted", 1)
        with pytest.raises(ProtocolConflict, match="withdrawn"):
            _upload_all(coordinator, policy, keys, first, ["bank-a"])
        # round 1 can no longer hold every participant's upload: aborted at once (not at bank-a's deadline) and
        # reopened with a fresh nonce without bank-a
        reopened = _wait_round(coordinator, 1, other_than=first.nonce)
        assert reopened.participants == ("bank-b", "bank-c", "bank-d")
        _upload_all(coordinator, policy, keys, reopened, ["bank-b", "bank-c", "bank-d"])
        second = _wait_round(coordinator, 2)
        assert "bank-a" not in second.participants
        assert coordinator.withdraw("bank-b", "privacy-budget-exhausted", 2)  # 2 banks left, quorum 3
        driver.join(timeout=10)
        assert not driver.is_alive()
    finally:
        stop.set()
    status = coordinator.status()
    reason = "privacy budget exhausted: 2 banks left, quorum 3 (withdrawn: bank-a at round 1, bank-b at round 2)"
    assert status["phase"] == "finished" and status["stopped_reason"] == reason
    assert [(r["round"], r["status"], r["attempts"]) for r in status["rounds"]] == [
        (1, "applied", 2),
        (2, "aborted", 1),
    ]
    assert status["rounds"][1]["detail"].endswith("withdrawn: bank-b")
    assert status["rounds"][0]["contributors"] == ["bank-b", "bank-c", "bank-d"]
    assert [(w["bank"], w["round"]) for w in status["withdrawn"]] == [("bank-a", 1), ("bank-b", 2)]
    assert coordinator.round_view("bank-c").stopped_reason == reason

    # a restarted aggregator (a new Coordinator on the same SQLite file) keeps all of it and opens nothing
    restarted = _coordinator(federation, store, max_rounds=5)
    restarted.run(threading.Event())  # returns at once: the federation is finished
    assert restarted.status()["stopped_reason"] == reason and restarted.round_phase() == "finished"
    assert len(restarted.status()["rounds"]) == 2
    assert not restarted.withdraw("bank-b", "privacy-budget-exhausted", 2)
    store.close()
    federation.close()


def test_the_upload_body_limit_follows_the_round_shapes(setup):
    coordinator, _, _, policy = setup
    assert coordinator.upload_body_limit(1000) == 1000  # no index yet: the service's default
    key = b"k" * 32
    for offset, bank in enumerate(BANKS):
        coordinator.enrol(bank, 5, 3, pseudonymise(key, range(offset * 10, offset * 10 + 40)))
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        view = wait_open(coordinator)
        slots = policy.he.poly_modulus_degree // 2
        largest = max(int(np.prod(shape)) for shape in view.shapes.values())
        upload = make_upload(
            coordinator.context,
            policy.he,
            RoundTicket(
                "fed-test",
                view.round,
                view.nonce,
                tuple(view.participants),
                view.context_fingerprint,
                view.policy_sha256,
            ),
            "bank-a",
            Ed25519PrivateKey.generate(),
            "x",
            np.random.default_rng(0).uniform(0, 1, largest),
        )
        body = len(encodings.encode_chunks(upload.chunks))
        limit = coordinator.upload_body_limit(0)
        # never below what the largest kind really takes, and proportional to it (the bound assumes the largest
        # ciphertext these parameters can make, ~3x a typical one), not a fixed gigabyte
        assert body <= limit <= 4 * body + 8192
        assert ckks.chunk_count(largest, slots) == len(upload.chunks)
        assert coordinator.upload_body_limit(10**9) == 10**9  # never below the default cap
    finally:
        stop.set()
        driver.join(timeout=30)


# --- a method of several stages per round (GraphFL: meta step, then fine-tuning and FedAvg) ---------------------


def _wait_stage(coordinator, number, stage, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for bank in BANKS[:-1]:  # every bank polls (a restarted aggregator waits to hear from the pinned ones)
            coordinator.heartbeat(bank)
        view = coordinator.round_view(BANKS[-1])
        if view.phase == "open" and view.round == number and view.stage == stage:
            return view
        time.sleep(0.05)
    raise AssertionError(f"stage {stage!r} of round {number} did not open: {coordinator.status()}")


def _stage_terms(view, seed):
    """Each bank's pre-weighted term cat(ŵ_k·x_k, [ŵ_k]) of every kind of the stage (the last entry ŵ_k > 0)."""
    rng = np.random.default_rng(seed)
    terms = {}
    for bank in BANKS:
        weight = rng.uniform(0.5, 1.0)
        terms[bank] = {
            kind: np.concatenate([weight * rng.normal(0.0, 0.1, int(np.prod(shape)) - 1), [weight]])
            for kind, shape in view.shapes.items()
        }
    return terms


def _upload_terms(coordinator, policy, keys, view, terms, banks=BANKS, reference=None):
    """Each bank's terms as a bank uploads them: weights centred on ``reference``, the W̄ it trained the stage
    from (crypto/centring.py; the coordinator adds it back after decryption)."""
    ticket = RoundTicket(
        "fed-test", view.round, view.nonce, tuple(view.participants), view.context_fingerprint, view.policy_sha256
    )
    for bank in banks:
        for kind, values in terms[bank].items():
            sent = centre_term(kind, values, reference)
            made = make_upload(coordinator.context, policy.he, ticket, bank, keys[bank], kind, sent)
            coordinator.accept_upload(bank, view.round, kind, made.chunks, made.receipt)


def _summed(terms, kind):
    import torch

    return torch.tensor(sum(bank_terms[kind] for bank_terms in terms.values()), dtype=torch.float32)


def _graphfl_run(tmp_path, federation, name, max_rounds=1):
    store = AggregatorStore(tmp_path / f"{name}.sqlite3")
    coordinator = _coordinator(federation, store, max_rounds=max_rounds, method="graphfl")
    for offset, bank in enumerate(BANKS):
        coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
    return store, coordinator


def _weights(coordinator, data):
    """W̄ of a broadcast the coordinator serves (a model version or a stage's), decoded as a bank decodes it."""
    from fedgl_secure.wire.broadcast import decode_broadcast

    size, _ = coordinator.index_for("bank-a")
    neighbors = coordinator.config.self_supervision.neighbors
    return decode_broadcast(0, data, coordinator.enrolment.num_parameters, size, neighbors).weights


@contextlib.contextmanager
def _round_loop(coordinator):
    """The coordinator's round loop on its own thread, stopped (and joined) on leaving."""
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        yield driver
    finally:
        stop.set()
        driver.join(timeout=30)


def _adam_steps(store, version):
    return int(encodings.decode_arrays(store.server_state(version))["step"])


def test_a_graphfl_round_runs_its_stages_and_publishes_the_meta_step_between_them(setup, tmp_path):
    import torch

    from fedgl_secure.engine.round_pipeline import method_initial_parameters
    from fedgl_secure.methods.base import META_GRADIENTS, WEIGHTS, Broadcast
    from fedgl_secure.methods.graphfl import FINETUNE, META, GraphFL

    _, federation, keys, policy = setup
    store, coordinator = _graphfl_run(tmp_path, federation, "graphfl")
    with _round_loop(coordinator) as driver:
        meta = _wait_stage(coordinator, 1, META)
        assert set(meta.shapes) == {META_GRADIENTS} and meta.participants == BANKS and meta.base_version == 0
        with pytest.raises(ProtocolConflict, match="unknown-stage"):
            coordinator.stage_model(1, META)  # nothing published before the stage's sum is decrypted
        gradients = _stage_terms(meta, seed=1)
        weights_term = {bank: {WEIGHTS: terms[META_GRADIENTS]} for bank, terms in gradients.items()}
        with pytest.raises(CiphertextError, match="stage 'meta'"):  # the next stage's kind is not taken yet
            _upload_terms(coordinator, policy, keys, meta, weights_term, banks=["bank-a"])
        _upload_terms(coordinator, policy, keys, meta, gradients)
        finetune = _wait_stage(coordinator, 1, FINETUNE)
        assert (finetune.nonce, finetune.base_version, finetune.participants) == (meta.nonce, 0, BANKS)
        assert set(finetune.shapes) == {WEIGHTS} and finetune.shapes[WEIGHTS] == meta.shapes[META_GRADIENTS]
        # the published θ̂ is GraphFL's meta step from θ_0 on the decrypted sum of the banks' gradients
        method = GraphFL(coordinator.config)
        theta = method_initial_parameters(method, coordinator.config, 5, 3)
        expected = method.stage_update(
            META, {META_GRADIENTS: _summed(gradients, META_GRADIENTS)}, 1, Broadcast(0, theta)
        )
        theta_hat = _weights(coordinator, coordinator.stage_model(1, META))
        assert torch.allclose(theta_hat, expected.weights, atol=1e-5)
        averaged = _stage_terms(finetune, seed=2)
        _upload_terms(coordinator, policy, keys, finetune, averaged, reference=theta_hat.numpy())
        driver.join(timeout=60)
        assert not driver.is_alive()
    status = coordinator.status()
    assert status["phase"] == "finished" and status["latest_version"] == 1
    assert [(r["round"], r["status"], r["attempts"]) for r in status["rounds"]] == [(1, "applied", 1)]
    final = method.stage_update(FINETUNE, {WEIGHTS: _summed(averaged, WEIGHTS)}, 1, expected)
    assert torch.allclose(_weights(coordinator, coordinator.model(1)), final.weights, atol=1e-5)
    assert _adam_steps(store, 1) == 1  # the meta optimiser's state is kept with the version it produced
    store.close()


def test_a_round_whose_last_stage_misses_a_participant_is_abandoned_and_retried_from_the_same_state(
    setup, tmp_path, small_he
):
    from fedgl_secure.methods.graphfl import FINETUNE, META

    _, _, keys, _ = setup
    policy = Policy(he=small_he, quorum=QUORUM, timeouts=Timeouts(round_seconds=30, upload_seconds=2))
    # a key authority and bank decryptors under this test's policy (shorter uploads): one policy for every node
    federation = Federation(tmp_path / "short-uploads", policy, keys)
    store, coordinator = _graphfl_run(tmp_path, federation, "abandoned")
    with _round_loop(coordinator) as driver:
        meta = _wait_stage(coordinator, 1, META)
        gradients = _stage_terms(meta, seed=1)
        _upload_terms(coordinator, policy, keys, meta, gradients)
        finetune = _wait_stage(coordinator, 1, FINETUNE)
        _upload_terms(coordinator, policy, keys, finetune, _stage_terms(finetune, seed=2), banks=["bank-a"])
        # meta_gradients of round 1 was decrypted: the key authority never decrypts it again, so the retry takes
        # round 2, from version 0, with exactly the banks that sum holds (their terms repeat)
        retry = _wait_stage(coordinator, 2, META)
        assert (retry.base_version, retry.participants) == (0, BANKS)
        _upload_terms(coordinator, policy, keys, retry, gradients)
        _upload_terms(coordinator, policy, keys, _wait_stage(coordinator, 2, FINETUNE), _stage_terms(finetune, seed=2))
        driver.join(timeout=60)
        assert not driver.is_alive()
    rounds = coordinator.status()["rounds"]
    assert [(r["round"], r["base_version"], r["status"]) for r in rounds] == [(1, 0, "abandoned"), (2, 0, "applied")]
    late = "stage 'finetune': 1 of 3 banks uploaded every kind; each participant is needed; late: bank-b, bank-c"
    assert rounds[0]["detail"] == late
    assert _adam_steps(store, 1) == 1  # the abandoned round's meta step was undone, not taken twice
    store.close()
    federation.close()


def test_an_aggregator_restarted_between_the_stages_retires_the_round_as_abandoned(setup, tmp_path):
    from fedgl_secure.methods.graphfl import FINETUNE, META

    _, federation, keys, policy = setup
    store, coordinator = _graphfl_run(tmp_path, federation, "restart", max_rounds=2)
    with _round_loop(coordinator):
        meta = _wait_stage(coordinator, 1, META)
        _upload_terms(coordinator, policy, keys, meta, _stage_terms(meta, seed=1))
        _wait_stage(coordinator, 1, FINETUNE)  # the meta step is decrypted and published; then the aggregator stops
    restarted = _coordinator(federation, store, max_rounds=2, method="graphfl")
    with _round_loop(restarted):
        retry = _wait_stage(restarted, 2, META)
        assert (retry.base_version, retry.participants) == (0, BANKS)
        first = restarted.status()["rounds"][0]
        assert (first["round"], first["status"]) == (1, "abandoned")
        assert first["detail"] == "the aggregator stopped while the round was open"
    store.close()


def test_status_never_shows_an_applied_round_beyond_the_latest_version(setup):
    # A status read while a round's result is being stored once showed the round applied but latest_version not yet
    # raised (a consortium fault test caught it). A status asked for right after the store wrote the round now
    # waits for the new version, and sees both or neither.
    coordinator, _, keys, policy = setup
    for offset, bank in enumerate(BANKS):
        coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
    seen: list[dict] = []
    apply_round = coordinator.store.apply_round

    def apply_then_ask(*args, **kwargs):
        apply_round(*args, **kwargs)
        asker = threading.Thread(target=lambda: seen.append(coordinator.status()), daemon=True)
        asker.start()
        asker.join(timeout=0.5)  # blocked until the version is raised (it would return at once otherwise)
        seen.append({"asked_during_apply": asker.is_alive()})

    coordinator.store.apply_round = apply_then_ask
    stop = threading.Event()
    driver = threading.Thread(target=coordinator.run, args=(stop,), daemon=True)
    driver.start()
    try:
        view = wait_open(coordinator)
        ticket = RoundTicket(
            "fed-test", view.round, view.nonce, tuple(view.participants), view.context_fingerprint, view.policy_sha256
        )
        rng = np.random.default_rng(0)
        for bank in BANKS:
            for kind, shape in view.shapes.items():
                made = make_upload(
                    coordinator.context, policy.he, ticket, bank, keys[bank], kind, rng.uniform(0, 1, shape)
                )
                coordinator.accept_upload(bank, view.round, kind, made.chunks, made.receipt)
        driver.join(timeout=60)
        assert not driver.is_alive()
    finally:
        stop.set()
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (during,) = [entry for entry in seen if "asked_during_apply" in entry]
    (status,) = [entry for entry in seen if "rounds" in entry]
    assert during["asked_during_apply"]  # the read waited for the apply to finish
    applied = [row["base_version"] for row in status["rounds"] if row["status"] == "applied"]
    assert applied == list(range(status["latest_version"])) == [0]


def test_a_contributor_whose_decryption_thread_is_down_is_replaced_in_the_decrypting_set(tmp_path, small_he):
    # bank-a uploads but never answers the board (its decryption thread is down while it is still alive): after
    # timeouts.decryption_seconds the coordinator asks bank-b and bank-c instead, and the round decrypts correctly
    timeouts = Timeouts(round_seconds=30, upload_seconds=20, decryption_seconds=1)
    policy = Policy(he=small_he, quorum=QUORUM, timeouts=timeouts)
    keys = {bank: Ed25519PrivateKey.generate() for bank in BANKS}
    federation = Federation(tmp_path / "federation", policy, keys)
    store = AggregatorStore(tmp_path / "one-down.sqlite3")
    try:
        coordinator = _coordinator(federation, store, max_rounds=1, serving=("bank-b", "bank-c"))
        for offset, bank in enumerate(BANKS):
            coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
        with _round_loop(coordinator) as driver:
            view = wait_open(coordinator)
            reference = _weights(coordinator, coordinator.model(0)).numpy()
            terms = _stage_terms(view, seed=3)
            _upload_terms(coordinator, policy, keys, view, terms, reference=reference)
            driver.join(timeout=60)
            assert not driver.is_alive()
        status = coordinator.status()
        assert status["phase"] == "finished" and status["rounds"][0]["status"] == "applied"
        assert sorted(status["rounds"][0]["contributors"]) == list(BANKS)  # every upload is in the sum
        sums = store.sums(1)
        assert set(sums) == set(view.shapes)
        for kind, (_, values, contributors) in sums.items():
            assert contributors == BANKS
            np.testing.assert_allclose(values, _summed(terms, kind).numpy(), atol=1e-4)
        # each bank counts the ciphertexts it partially decrypted: bank-a none, bank-c each sum's, bank-b each sum's and
        # the first sum's twice — first for the set with bank-a, whose partials were dropped (a partial is bound to its
        # set); bank-a, left out there, is asked for none of the round's later sums
        slots = policy.he.poly_modulus_degree // 2
        per_kind = [ckks.chunk_count(int(np.prod(shape)), slots) for shape in view.shapes.values()]
        counts = {bank: decryptor.decryption_count() for bank, decryptor in federation.decryptors.items()}
        assert counts == {"bank-a": 0, "bank-b": sum(per_kind) + per_kind[0], "bank-c": sum(per_kind)}
    finally:
        store.close()
        federation.close()


def test_a_restart_after_a_fitted_label_prior_round_keeps_it_fitted(setup):
    # Killed right after closing a label-prior round as fitted (its θ̄ published, banks may release from it), the
    # aggregator used to retire that last round as "abandoned" on restart while still counting it as a fitted step:
    # a fresh-clone CI run of the label consortium test ended with 19 fitted rows for 20 steps.
    from fedgl_secure.consortium.label_prior_rounds import PRIOR_BASE_VERSION, PRIOR_FITTED

    coordinator, *_ = setup
    for offset, bank in enumerate(BANKS):  # the union index, as before any round
        coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
    assert coordinator._wait_for_enrolment(threading.Event())
    store = coordinator.store
    for round_number in (1, 2):
        store.open_round(round_number, PRIOR_BASE_VERSION, f"n{round_number}", BANKS)
        store.save_sum(round_number, "weights", f"n{round_number}", np.zeros(4), BANKS)
        store.close_round(round_number, PRIOR_FITTED, "label prior")
    assert coordinator._resume() == 0  # no training round yet
    assert [store.round(r).status for r in (1, 2)] == [PRIOR_FITTED, PRIOR_FITTED]
    store.open_round(3, PRIOR_BASE_VERSION, "n3", BANKS)  # one left open is still retired
    store.save_sum(3, "weights", "n3", np.zeros(4), BANKS)
    coordinator._resume()
    assert store.round(3).status == "abandoned" and store.round(2).status == PRIOR_FITTED
