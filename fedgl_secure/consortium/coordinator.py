"""The aggregator's round state machine (DESIGN §5.3), as a library the HTTP service wraps.

The aggregator holds the *public* CKKS context only. Per round it

1. waits for at least the quorum of live banks, picks the participants (``consortium/participant_choice.py``),
   opens the round at the key authority (fresh nonce) and publishes it;
2. accepts each participant's encrypted, receipted upload per kind — checking the receipt,
   the digest, the chunk count and that every chunk is a ciphertext of this context, so one bad
   upload can never spoil the sum;
3. once every participant has uploaded every kind, adds the ciphertexts; a participant missing at
   the deadline (or withdrawn) aborts the round, which reopens with a fresh nonce without the banks
   that missed it — every receipt names the round's participants and every decryptor refuses a sum
   that does not hold exactly them (``partial_decryption.check_exact_cover``, R13); then, for each
   kind, it asks the key authority for its partial decryption of the sum (sending each receipted
   upload's ``c1``; the key authority sums them itself) and ``t`` banks for theirs through the
   decryption board (``consortium/decryption_board.py``), fuses them (``crypto/partial_decryption.fused_values``),
   decodes, and stores each decrypted sum at once (steps 2–3: ``consortium/round_stages.py``), and
4. runs the method's server step (W̄, pseudo labels, pseudo graph) on the fused plaintext and
   stores the next model version together with the round, in one transaction.

A method whose round has several stages (``methods.base.method_stages``, e.g. GraphFL's meta step
and then its fine-tuning) runs steps 2–3 once per stage under the round's one number and nonce: a
stage collects and decrypts only its own kinds (kinds are distinct across a round's stages, so the
key authority still decrypts each (round, kind) once), its server update (``stage_update``) gives the
broadcast the next stage starts from, published as the round's stage model
(``GET /v1/rounds/{round}/stages/{stage}``), and the next stage is open to the banks whose uploads
that sum holds. The last stage's update is the next model version (step 4). Each stage has its own
upload deadline; a first stage missing a participant aborts the round (nothing was decrypted), a later one
abandons it.

Round states: ``open`` → ``applied`` | ``aborted`` (reopened with a fresh nonce) |
``abandoned`` (some sum was decrypted but the round could not finish — the key authority
never decrypts a (round, kind) twice, so the retry takes the next round number) |
``interrupted`` (the aggregator stopped while it was open). A restarted aggregator resumes
after its last applied round; a round is applied once or not at all.

Before round 1 the aggregator runs the set-up phases the run declares (``consortium/phases.py``), the method's
and its units of privacy's: e.g. Fed²GNN's neighbour exchange, relayed before enrolment
(``consortium/exchange_phase.py``), or, under label DP with the consortium prior (``dp.labels.prior =
"consortium-sgc"``), the prior's FedAvg rounds (``consortium/label_prior_rounds.py``), numbered like training rounds
and decrypted by the key authority like them, one ``weights`` kind each, every bank taking part; training round 1
takes the next number.

Fail closed, visibly: a bank whose privacy budget is spent *withdraws* (:meth:`Coordinator.withdraw`,
recorded in SQLite). It is invited to no further round; an open round stops waiting for it (and is
aborted at once when the banks left cannot reach the quorum); and once fewer than the quorum of a
round's chosen banks are left, the federation finishes with a ``stopped_reason`` instead of
reopening rounds that can never be decrypted — the simulation's rule (``RunResult.stopped_reason``).

:class:`Coordinator` holds the federation's state (the latest model version, whether and why it finished, its
final version) and composes the parts: enrolment and the union index (``consortium/enrolment.py``), the banks'
liveness, withdrawals and the participants chosen (``participant_choice.py``), a round's stages
(``round_stages.py``), the stored model versions (``model_versions.py``), what each bank is served
(``projections.py``) and the aggregator's side of each declared set-up phase (``phases.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.consortium.aggregator_store import (
    AggregatorStore,
    Enrolment,
    best_report,
    pooled_test_metrics,
    round_history,
    validation_scores,
)
from fedgl_secure.consortium.decryption_board import DecryptionBoard
from fedgl_secure.consortium.enrolment import UnionIndex
from fedgl_secure.consortium.model_versions import ModelVersions
from fedgl_secure.consortium.participant_choice import Choice, Participation
from fedgl_secure.consortium.phases import (
    SETUP_ROUND_DONE,
    AggregatorParts,
    AggregatorPhase,
    aggregator_phases,
    declared_phases,
)
from fedgl_secure.consortium.projections import Projections
from fedgl_secure.consortium.pseudonyms import union_positions
from fedgl_secure.consortium.round_stages import Decryptor, RoundStages
from fedgl_secure.consortium.setup_checks import check_consortium_can_run
from fedgl_secure.crypto import ckks, residues
from fedgl_secure.crypto.centring import wire_reference
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import EarlyStopping, ratio
from fedgl_secure.engine.round_pipeline import method_initial_parameters
from fedgl_secure.errors import ConfigError, FedGLError, ProtocolConflict
from fedgl_secure.log import get_logger
from fedgl_secure.method_registry import NEIGHBOUR_EXCHANGE
from fedgl_secure.methods import apply_in_method_policy, build_method
from fedgl_secure.methods.base import (
    Broadcast,
    method_stages,
    server_state,
    stage_upload_kinds,
)
from fedgl_secure.methods.fed2gnn_relay import ExchangeRelay
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import encode_broadcast, model_label, stage_label

# a round's final statuses: a restarted aggregator retires the last round only when it has none of them
CLOSED_STATUSES = ("applied", "aborted", "abandoned", "interrupted", SETUP_ROUND_DONE)


@dataclass(frozen=True)
class RoundView:
    """What a bank is told when it asks for the current round."""

    phase: str  # enrolling | waiting | open | aggregating | finished
    federation: str
    round: int | None = None
    nonce: str | None = None
    base_version: int | None = None
    participants: tuple[str, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    context_fingerprint: str = ""
    seconds_left: float | None = None
    latest_version: int | None = None
    stopped_reason: str | None = None
    final_version: int | None = None  # set once the finished federation has fixed its final model
    stage: str | None = None  # phase == "open": the stage of the round whose kinds (``shapes``) are collected
    # the consortium label prior (dp.labels.prior = "consortium-sgc"): the rounds of its fitted FedAvg steps, in order
    # (set by its set-up phase, ``AggregatorPhase.round_view``)
    prior_rounds: tuple[int, ...] = ()
    policy_sha256: str = ""  # phase == "open": the aggregator's policy digest, which the banks' must equal


FINAL_VERSION = "final_version"
FINAL_GRACE_SECONDS = 60.0  # how long a finished federation waits for the banks' reports of its last version


class Coordinator:
    """Enrolment, the union index and the round loop of one federation (module doc).

    Request handlers (``enrol``, ``round_view``, ``accept_upload``...) are called from the HTTP
    service's worker threads; :meth:`run` is the round loop on its own thread.
    """

    def __init__(
        self,
        *,
        federation: str,
        config: ExperimentConfig,
        policy: Policy,
        banks: Sequence[str],
        signing_keys: Mapping[str, Ed25519PublicKey],
        public_context: bytes,
        store: AggregatorStore,
        decryptor: Decryptor,
        liveness_seconds: float = 5.0,
        broadcast_key: Ed25519PrivateKey | None = None,
    ) -> None:
        if config.federation.partition == "louvain":
            if config.federation.num_clients != len(banks):
                raise ConfigError(
                    f"experiment.federation.num_clients is {config.federation.num_clients} but the consortium has "
                    f"{len(banks)} banks; bank k holds Louvain client k"
                )
        elif len(config.federation.proportions) != len(banks):  # bank-sources: one entry per bank, filled in
            raise ConfigError(
                f"the experiment has {len(config.federation.proportions)} client proportions but the consortium "
                f"has {len(banks)} banks; give one proportion per bank"
            )
        config = apply_in_method_policy(config, policy)  # e.g. the class sums' one round
        check_consortium_can_run(config, policy, len(banks))
        self.federation = federation
        self.config = config
        self.policy = policy
        self.policy_digest = policy.digest  # announced on every poll: computed once
        self.banks = tuple(banks)
        self.signing_keys = dict(signing_keys)
        # signs what each bank is served (crypto/broadcast_signature.py); the service passes the provisioned key,
        # an in-process coordinator without one signs with a key nobody can verify against
        self.broadcast_key = broadcast_key or Ed25519PrivateKey.generate()
        self.context = ckks.load_public_context(public_context)
        self.fingerprint = ckks.fingerprint(public_context)
        self.store = store
        self.decryptor = decryptor
        self.board = DecryptionBoard(residues.data_level(self.context))  # the banks' partial decryptions
        self.method = build_method(config)
        self._stages = method_stages(self.method)
        self.log = get_logger(role="aggregator", federation=federation)
        self._changed = threading.Condition()
        # held while a round's result is stored and becomes the latest version, and while status() reads both:
        # otherwise a status read between the two shows an applied round beyond latest_version
        self._applying = threading.Lock()
        self._finished = store.finished()
        final = store.get_meta(FINAL_VERSION)
        self._final_version: int | None = None if final is None else int(final)
        self._finished_at: float | None = None  # a restarted, finished aggregator waits no longer
        # kept in memory (the poll path reads them under the lock): set by _build_index, _apply and _finish
        self._latest_version: int | None = store.latest_version()
        self._stopped_reason: str | None = store.stopped_reason()
        self.participation = Participation(
            banks=self.banks,
            config=config,
            policy=policy,
            store=store,
            changed=self._changed,
            liveness_seconds=liveness_seconds,
            log=self.log,
        )
        self.enrolment = UnionIndex(
            banks=self.banks,
            config=config,
            method=self.method,
            store=store,
            changed=self._changed,
            participation=self.participation,
            log=self.log,
        )
        self.versions = ModelVersions(config=config, method=self.method, store=store, index=self.enrolment)
        self.projections = Projections(
            federation=federation, config=config, broadcast_key=self.broadcast_key, index=self.enrolment
        )
        self.stages = RoundStages(
            federation=federation,
            policy=policy,
            policy_digest=self.policy_digest,
            context=self.context,
            fingerprint=self.fingerprint,
            signing_keys=self.signing_keys,
            stages=self._stages,
            store=store,
            decryptor=decryptor,
            board=self.board,
            index=self.enrolment,
            participation=self.participation,
            changed=self._changed,
            log=self.log,
        )
        # the aggregator's side of every set-up phase the method and the policy's units declare
        parts = AggregatorParts(
            federation=federation,
            config=config,
            policy=policy,
            banks=self.banks,
            signing_keys=self.signing_keys,
            broadcast_key=self.broadcast_key,
            store=store,
            enrolment=self.enrolment,
            participation=self.participation,
            stages=self.stages,
            changed=self._changed,
            log=self.log,
        )
        self.phases: dict[str, AggregatorPhase] = aggregator_phases(declared_phases(config, policy), parts)

    # --- request handlers (any thread) ----------------------------------------------------

    def exchange(self) -> ExchangeRelay:
        """The relay behind the exchange routes: the neighbour-exchange phase's (409 ``no-exchange`` for a run that
        declares none)."""
        phase = self.phases.get(NEIGHBOUR_EXCHANGE.name)
        if phase is None:
            raise ProtocolConflict("no-exchange", f"method {self.config.method!r} has no bank-to-bank exchange")
        return phase.relay

    def heartbeat(self, bank: str) -> None:
        self.participation.heartbeat(bank)

    def withdraw(self, bank: str, reason: str, round_number: int) -> bool:
        """:meth:`Participation.withdraw <fedgl_secure.consortium.participant_choice.Participation.withdraw>`."""
        return self.participation.withdraw(bank, reason, round_number)

    def enrol(self, bank: str, num_features: int, num_classes: int, pseudonyms: Sequence[str]) -> None:
        """Record a bank's pseudonym set and data dimensions (idempotent for the same set)."""
        self.enrolment.enrol(bank, num_features, num_classes, pseudonyms)

    def index_for(self, bank: str) -> tuple[int, np.ndarray]:
        """(M, positions of this bank's pseudonyms in the union index, in the order it enrolled them)."""
        return self.enrolment.index_for(bank)

    def max_bank_nodes(self) -> int:
        """The largest bank's node count: the DP step's public ``w_max``."""
        return self.enrolment.max_bank_nodes()

    def upload_body_limit(self, floor: int) -> int:
        """The largest upload body this round's shapes allow: the biggest kind's chunks at the largest ciphertext
        these parameters make, plus framing; never below ``floor`` (the service's default cap). One kind of a
        3 x 1,000,000-customer federation is ~161 MB (M = 2.5 M rows), past a fixed 64 MiB cap."""
        if self.enrolment.index is None:
            return floor
        slots = self.policy.he.poly_modulus_degree // 2
        phase_shapes = [shape for phase in self.phases.values() for shape in phase.upload_shapes()]
        shapes = [*self.enrolment.shapes().values(), *phase_shapes]
        largest = max(int(np.prod(shape)) for shape in shapes)
        chunks = ckks.chunk_count(largest, slots)
        return max(floor, chunks * (ckks.max_chunk_bytes(self.policy.he) + 8) + 4096)

    def model(self, version: int) -> bytes:
        return self.versions.model(version)

    def broadcast_for(self, bank: str, version: int) -> tuple[bytes, str]:
        """Model ``version`` as ``bank`` is served it: its projection (W̄, its rows of Ȳ and Ā) and the signature."""
        return self.projections.project(bank, version, self.model(version), model_label(version))

    def stage_broadcast_for(self, bank: str, round_number: int, stage: str) -> tuple[bytes, str]:
        """The broadcast after ``stage`` of round ``round_number`` as ``bank`` is served it (projected, signed)."""
        data = self.stage_model(round_number, stage)
        owner = next((phase for phase in self.phases.values() if stage in phase.owned_stages), None)
        if owner is not None:  # a set-up phase's own round: the phase says what each bank is served
            return owner.serve_stage(bank, round_number, stage, data)
        return self.projections.project(bank, round_number, data, stage_label(round_number, stage))

    def stage_model(self, round_number: int, stage: str) -> bytes:
        """The broadcast published after ``stage`` of round ``round_number`` (the next stage starts from it)."""
        return self.versions.stage_model(round_number, stage)

    def round_view(self, bank: str) -> RoundView:
        self.heartbeat(bank)
        with self._changed:
            latest, finished, stopped_reason = self._latest_version, self._finished, self._stopped_reason
        if finished:  # final_version takes the lock itself (and may read the store): outside it
            return RoundView(
                "finished",
                self.federation,
                latest_version=latest,
                stopped_reason=stopped_reason,
                final_version=self.final_version(),
                **self._phase_view(),
            )
        with self._changed:
            if self.enrolment.index is None:
                return RoundView("enrolling", self.federation)
            fields = self._phase_view()
            current = self.stages.open
            if current is None:
                phase = "aggregating" if self.stages.aggregating else "waiting"
                return RoundView(phase, self.federation, latest_version=latest, **fields)
            return RoundView(
                "open",
                self.federation,
                current.round,
                current.nonce,
                current.base_version,
                current.participants,
                current.shapes,
                self.fingerprint,
                max(0.0, current.deadline - time.monotonic()),
                latest,
                stage=current.stage,
                policy_sha256=self.policy_digest,
                **fields,
            )

    def _phase_view(self) -> dict[str, object]:
        """What the declared set-up phases tell every bank in its round view."""
        return {name: value for phase in self.phases.values() for name, value in phase.round_view().items()}

    def accept_upload(self, bank: str, round_number: int, kind: str, chunks: list[bytes], receipt: Receipt) -> bool:
        """Check and keep one upload; True when it is new, False when it repeats an accepted one."""
        return self.stages.accept_upload(bank, round_number, kind, chunks, receipt)

    def accept_report(
        self, bank: str, version: int, counts: tuple[int, int, int, int], histograms: np.ndarray | None = None
    ) -> None:
        """A bank's evaluation of model ``version`` on its own validation and test nodes: counts, and with a
        positive class its score histograms (:mod:`fedgl_secure.engine.score_histograms`)."""
        self.participation.bank_index(bank)
        val_correct, val_total, test_correct, test_total = counts
        if not (0 <= val_correct <= val_total and 0 <= test_correct <= test_total):
            raise ProtocolConflict("bad-report", f"counts must satisfy 0 <= correct <= total, got {counts}")
        latest = self._latest_version
        if latest is None or not 0 <= version <= latest:
            raise ProtocolConflict("unknown-version", f"model version {version} does not exist")
        self.store.save_report(version, bank, counts, histograms)

    def status(self) -> dict:
        with self._applying:  # the rounds and the latest version of one moment (see _apply)
            reports = self.store.pooled_reports()
            history = round_history(self.store, reports)
            latest = self._latest_version
        best = best_report(reports, scores=validation_scores(self.store, reports, self.config.evaluation.selection))
        metrics = pooled_test_metrics(self.store, best[0] if best else None, self.config.evaluation.top_fraction)
        return {
            "federation": self.federation,
            "phase": self.round_phase(),
            "latest_version": latest,
            "max_rounds": self.config.federation.max_rounds,
            "rounds": history,
            "best_version": best[0] if best else None,
            "best_val_accuracy": ratio(best[1][1], best[1][2]) if best else None,
            "best_test_accuracy": ratio(best[1][3], best[1][4]) if best else None,
            "best_test_metrics": metrics,
            "final_version": self.final_version(),
            "withdrawn": [
                {"bank": w.bank, "reason": w.reason, "round": w.round} for w in self.store.withdrawals().values()
            ],
            "stopped_reason": self._stopped_reason,
            **{name: value for phase in self.phases.values() for name, value in phase.status().items()},
        }

    def round_phase(self) -> str:
        with self._changed:
            if self._finished:
                return "finished"
            if self.enrolment.index is None:
                return "enrolling"
            return "open" if self.stages.open is not None else ("aggregating" if self.stages.aggregating else "waiting")

    # --- the round loop (its own thread) --------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Drive rounds until ``max_rounds`` model versions exist, early stopping, too few banks left
        within their budget (``stopped_reason``), or ``stop``."""
        self.participation.started = time.monotonic()
        try:
            if not self._wait_for_enrolment(stop):
                return
            version = self._resume()
            for phase in self.phases.values():  # the declared set-up phases that run before round 1
                if not phase.before_training(stop):
                    return
            round_number = self.store.last_round_number() + 1
            stopper = EarlyStopping(self.config.federation.patience)
            stopped_reason = self._stopped_reason  # a restarted aggregator of a stopped run says it again
            while not stop.is_set() and not self._finished and version < self.config.federation.max_rounds:
                choice = self.participation.choose(stop, version)
                if choice is None:
                    break
                if choice.stopped_reason is not None:
                    stopped_reason = choice.stopped_reason
                    break
                outcome = self._run_round(stop, round_number, version, choice)
                if outcome == "applied":
                    version += 1
                    if self._early_stop(stopper, version - 1):
                        break
                if outcome in ("applied", "abandoned"):
                    round_number += 1
            if not stop.is_set():
                self._finish(version, stopped_reason)
        except Exception:  # the service must say why it stopped driving rounds
            self.log.exception("rounds.crashed")
            raise

    def _wait_for_enrolment(self, stop: threading.Event) -> bool:
        """Wait until every bank has enrolled (:meth:`enrol` notifies ``_changed``), then build the union index."""
        with self._changed:
            while self.enrolment.index is None:
                if len(self.enrolment.enrolled) == len(self.banks):
                    self._build_index(self.store.enrolments())
                    break
                if stop.is_set():
                    return False
                self._changed.wait(0.2)  # the timeout only re-checks ``stop``; nothing is read from the store
        return True

    def _build_index(self, enrolled: Mapping[str, Enrolment]) -> None:
        """The union index over every bank's pseudonyms; before it, model version 0 (once)."""
        size, positions = union_positions([enrolled[bank].pseudonyms for bank in self.banks])
        by_bank = dict(zip(self.banks, positions, strict=True))
        first = enrolled[self.banks[0]]
        if self._latest_version is None:
            weights = method_initial_parameters(self.method, self.config, first.num_features, first.num_classes)
            self.store.save_initial_model(encode_broadcast(Broadcast(0, weights)))
            self._latest_version = 0
        self.store.save_index(size, by_bank)
        self.enrolment.index = (size, by_bank)
        self.log.info("index.built", num_global_nodes=size, banks=len(self.banks))

    def _resume(self) -> int:
        """Last applied model version; finishes a fully decrypted round, retires an unfinished one."""
        version = self.store.latest_version() or 0
        last = self.store.round(self.store.last_round_number())
        if last is not None and last.status not in CLOSED_STATUSES:
            sums = self.store.sums(last.round)
            if set(sums) == set(self.enrolment.shapes()) and last.base_version == version:
                # every stage's sums are stored: replay the stages' server updates on them
                broadcast = self.versions.base_broadcast(version)
                for stage in self._stages:
                    kinds = stage_upload_kinds(self.method, stage)
                    broadcast = self.versions.stage_update(stage, version, {k: sums[k][1] for k in kinds}, broadcast)
                contributors = sums[stage_upload_kinds(self.method, self._stages[-1])[0]][2]
                self._apply(last.round, version, broadcast, contributors)
                self.log.info("round.resumed", round=last.round)
                return version + 1
            status = "abandoned" if sums else "interrupted"
            self.store.close_round(last.round, status, "the aggregator stopped while the round was open")
            self.log.warning("round.retired", round=last.round, status=status)
        return version

    def _run_round(self, stop: threading.Event, round_number: int, version: int, choice: Choice) -> str:
        """One round from ``version``: each of the method's stages in turn (:meth:`RoundStages.run_stage`), under
        one nonce; "applied", "aborted" (reopened), "abandoned" (the next round number retries) or "stopped"."""
        participants = choice.participants
        log = self.log.bind(round=round_number)
        try:
            nonce = self.stages.open_at_key_authority(stop, round_number, participants)
        except FedGLError:
            return "stopped"
        self.store.open_round(round_number, version, nonce, participants)
        opened = time.monotonic()
        log.info("round.opened", participants=list(participants), base_version=version, stages=list(self._stages))
        broadcast = self.versions.base_broadcast(version)
        reference = self.versions.version_weights(version)
        timer = PhaseTimer()
        for index, stage in enumerate(self._stages):
            outcome, participants, sums = self.stages.run_stage(
                stop, round_number, version, nonce, stage, participants, timer, reference, first=index == 0
            )
            if outcome != "decrypted":
                return outcome
            with timer.phase("server_step"):
                broadcast = self.versions.stage_update(stage, version, sums, broadcast)
                reference = wire_reference(broadcast.weights)  # the next stage's banks train from this broadcast
                if index < len(self._stages) - 1:  # the next stage starts from it
                    self.store.save_stage_model(round_number, stage, encode_broadcast(broadcast))
                    log.info("round.stage_published", stage=stage, contributors=list(participants))
        with timer.phase("server_step"):
            self._apply(round_number, version, broadcast, participants)
        log.info(
            "round.applied",
            version=version + 1,
            contributors=list(participants),
            seconds=round(time.monotonic() - opened, 3),
            phases=timer.seconds(),
        )
        return "applied"

    def _apply(self, round_number: int, version: int, broadcast: Broadcast, contributors: tuple[str, ...]) -> None:
        """Store the round's result as model ``version + 1`` (with the method's server state, if it keeps one)."""
        state = server_state(self.method)
        encoded_state = (
            None if state is None else encodings.encode_arrays({k: v.cpu().numpy() for k, v in state.items()})
        )
        encoded = encode_broadcast(broadcast)
        with self._applying:
            self.store.apply_round(round_number, version + 1, encoded, contributors, encoded_state)
            self.versions.reference = (version + 1, wire_reference(broadcast.weights))
            self.projections.remember(model_label(version + 1), broadcast)  # the banks ask for it next
            with self._changed:
                self._latest_version = version + 1
                self._changed.notify_all()

    def _early_stop(self, stopper: EarlyStopping, reported_version: int) -> bool:
        pooled = self.store.pooled_reports().get(reported_version)
        if pooled is None or pooled[2] == 0:
            return False
        scores = validation_scores(self.store, {reported_version: pooled}, self.config.evaluation.selection)
        stopper.update(reported_version, scores.get(reported_version, float("nan")))
        if stopper.should_stop(reported_version):
            self.log.info("rounds.early_stop", best_version=stopper.best_round, patience=stopper.patience)
            return True
        return False

    def final_version(self) -> int | None:
        """The finished federation's final model: the best version by the pooled validation figure
        (``evaluation.selection``), else the latest — fixed (and persisted) once every bank still in the
        run has reported the latest version, or :data:`FINAL_GRACE_SECONDS` after the finish, so every
        bank scores with the same model. None before that."""
        withdrawn = self.participation.withdrawn
        with self._changed:
            if self._final_version is not None or not self._finished:
                return self._final_version
            latest, finished_at = self._latest_version, self._finished_at
            expected = len([bank for bank in self.banks if bank not in withdrawn])
        reports = self.store.pooled_reports()
        reported = reports.get(latest, (0,))[0] if latest is not None else 0
        waited = finished_at is None or time.monotonic() - finished_at >= FINAL_GRACE_SECONDS
        if reported < expected and not waited:
            return None
        best = best_report(reports, scores=validation_scores(self.store, reports, self.config.evaluation.selection))
        version = best[0] if best is not None else latest
        if version is None:
            return None
        with self._changed:
            if self._final_version is None:
                self.store.set_meta(FINAL_VERSION, str(version))
                self._final_version = version
                self.log.info("final_version.fixed", version=version, reports_of_latest=reported, banks=expected)
            return self._final_version

    def _finish(self, version: int, stopped_reason: str | None = None) -> None:
        """The federation is over (persisted): ``max_rounds`` versions, early stopping, or ``stopped_reason``."""
        self.store.finish(stopped_reason)
        with self._changed:
            self._finished = True
            self._finished_at = time.monotonic()
            if stopped_reason is not None:
                self._stopped_reason = stopped_reason
            self._changed.notify_all()
        if stopped_reason is not None:
            self.log.warning("rounds.stopped", latest_version=version, reason=stopped_reason)
        self.log.info("rounds.finished", latest_version=version, stopped_reason=stopped_reason)
