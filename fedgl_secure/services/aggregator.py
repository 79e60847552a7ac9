"""The aggregator's round state machine (DESIGN §5.3), as a library the HTTP service wraps.

The aggregator holds the *public* CKKS context only. Per round it

1. waits for at least the quorum of live banks, picks the participants, opens the round at
   the key authority (fresh nonce) and publishes it;
2. accepts each participant's encrypted, receipted upload per kind — checking the receipt,
   the digest, the chunk count and that every chunk is a ciphertext of this context, so one bad
   upload can never spoil the sum;
3. once every participant has uploaded every kind, adds the ciphertexts; a participant missing at
   the deadline (or withdrawn) aborts the round, which reopens with a fresh nonce without the banks
   that missed it — every receipt names the round's participants and every decryptor refuses a sum
   that does not hold exactly them (``partial_decryption.check_exact_cover``, R13); then, for each
   kind, it asks the key authority for its partial decryption of the sum (sending each receipted
   upload's ``c1``; the key authority sums them itself) and ``t`` banks for theirs through the
   decryption board (``decryption_board.py``), fuses them (``crypto/partial_decryption.fused_values``),
   decodes, and stores each decrypted sum at once, and
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

Under label DP with the consortium prior (``dp.labels.prior = "consortium-sgc"``) the banks release their
labels together before round 1: the aggregator first runs the prior's FedAvg rounds
(:meth:`Coordinator._fit_label_prior`), numbered like training rounds and decrypted by the key authority like
them, one ``weights`` kind each, every bank taking part; training round 1 takes the next number.

Fail closed, visibly: a bank whose privacy budget is spent *withdraws* (:meth:`Coordinator.withdraw`,
recorded in SQLite). It is invited to no further round; an open round stops waiting for it (and is
aborted at once when the banks left cannot reach the quorum); and once fewer than the quorum of a
round's chosen banks are left, the federation finishes with a ``stopped_reason`` instead of
reopening rounds that can never be decrypted — the simulation's rule (``RunResult.stopped_reason``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.consortium.aggregator_store import (
    AggregatorStore,
    Enrolment,
    Withdrawal,
    best_report,
    pooled_test_metrics,
    round_history,
    validation_scores,
)
from fedgl_secure.consortium.config import BANK_SOURCES
from fedgl_secure.consortium.decryption_board import DecryptionBoard
from fedgl_secure.consortium.pseudonyms import union_positions
from fedgl_secure.crypto import ckks, packing, residue_sum, residues
from fedgl_secure.crypto.broadcast_signature import sign_broadcast
from fedgl_secure.crypto.centring import restore_sum, wire_reference
from fedgl_secure.crypto.partial_decryption import fused_values
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.crypto.residue_sum import ChunkedCiphertext
from fedgl_secure.crypto.upload import RoundTicket, Upload, check_upload, read_checked
from fedgl_secure.data.sampling import select_participants
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import EarlyStopping, ratio
from fedgl_secure.engine.self_training import check_services as check_self_training_services
from fedgl_secure.errors import CiphertextError, ConfigError, FedGLError, ProtocolConflict
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.log import get_logger
from fedgl_secure.methods import apply_in_method_policy, build_method
from fedgl_secure.methods.base import (
    Broadcast,
    check_stage_kinds,
    load_server_state,
    method_stages,
    server_state,
    stage_update,
    stage_upload_kinds,
)
from fedgl_secure.methods.fed2gnn import check_services, signal_width
from fedgl_secure.methods.fed2gnn_relay import ExchangeRelay
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.consortium_prior import (
    LABEL_PRIOR_STAGE,
    prior_average,
    prior_size,
    prior_steps,
    starts_stage,
)
from fedgl_secure.privacy.dp_round import releases_labels_together
from fedgl_secure.simulation.experiment import method_initial_parameters
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import (
    decode_broadcast,
    encode_broadcast,
    encode_projection,
    model_label,
    stage_label,
)

PRIOR_BASE_VERSION = -1  # a label-prior round's base version in the store: it comes before model version 0
PRIOR_FITTED = "fitted"  # a label-prior round's status once its θ̄ is published
# a round's final statuses: a restarted aggregator retires the last round only when it has none of them
CLOSED_STATUSES = ("applied", "aborted", "abandoned", "interrupted", PRIOR_FITTED)
BUDGET_EXHAUSTED = "privacy-budget-exhausted"
WITHDRAWAL_REASONS = {BUDGET_EXHAUSTED: "privacy budget exhausted"}  # code → what a stopped_reason says


class Decryptor(Protocol):
    """The key authority as the aggregator sees it (HTTP client, or the in-process library)."""

    def open_round(
        self, federation: str, round_number: int, nonce: str, participants: Sequence[str], policy_sha256: str
    ) -> None: ...

    def decrypt(
        self,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt],
        fingerprint: str,
        length: int,
        upload_c1: Sequence[np.ndarray],
    ) -> np.ndarray: ...  # the key authority's partial decryption's residues (uint64), not values


# --- the coordinator -------------------------------------------------------------------------


def check_consortium_can_run(config: ExperimentConfig, policy: Policy, num_banks: int) -> None:
    """Refuse, before any key is used, a set-up whose every round would fail.

    The method must upload only kinds the policy lets leave a bank (the key authority would
    refuse to decrypt the others), and a round's share of banks must reach the quorum. The
    policy's DP must be one the consortium can enforce: what the simulation refuses (e.g. the pseudo
    graph under DP on predictions/embeddings) and plain-text protection are refused by
    :func:`~fedgl_secure.methods.privacy_checks.check_consortium`, the check every bank also runs (central
    noise is run: the key authority adds it).
    """
    check_services(config, bank_sources=config.dataset == BANK_SOURCES)  # what of Fed²GNN the services run
    check_self_training_services(config)
    check_consortium(policy, config)  # a method of several stages under DP is refused here (check_stages)
    method = build_method(config)
    check_stage_kinds(method)
    kinds = method.upload_kinds
    refused = [kind for kind in kinds if kind not in policy.allowed_kinds]
    if refused:
        raise ConfigError(
            f"the experiment's method {config.method!r} uploads {list(kinds)}, but the policy's allowed_kinds "
            f"{list(policy.allowed_kinds)} keep {refused} inside the banks; allow them or choose another method"
        )
    if policy.protection == "he" and policy.he.threshold > num_banks:
        raise ConfigError(
            f"he.threshold t = {policy.he.threshold} exceeds the consortium's {num_banks} banks: no sum could ever be "
            "decrypted (t banks and the key authority decrypt together); lower he.threshold"
        )
    # the count of participants is the same every round; only which banks changes
    per_round = len(select_participants(num_banks, config.federation.participation, config.seed, 1))
    if per_round < _quorum(policy):
        raise ConfigError(
            f"participation {config.federation.participation} of {num_banks} banks gives {per_round} per round, "
            f"below the policy's quorum {_quorum(policy)}: no round could ever be decrypted"
        )


def _quorum(policy: Policy) -> int:
    """Banks a round's sum needs: the policy's quorum (never below two, which the policy's validator
    enforces: one bank's sum is its data)."""
    return policy.quorum


@dataclass
class _OpenRound:
    """One stage of an open round (a single-stage method's round is one): its participants (the round's in
    the first stage, afterwards the banks whose uploads the previous stage's sums hold) and its kinds."""

    round: int
    base_version: int
    nonce: str
    participants: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    deadline: float
    stage: str
    uploads: dict[str, dict[str, Upload]] = field(default_factory=dict)
    # each upload read and checked: what the aggregator adds; its c1 what the decryptors are sent
    ciphertexts: dict[str, dict[str, ChunkedCiphertext]] = field(default_factory=dict)

    def complete_banks(self) -> tuple[str, ...]:
        return tuple(b for b in self.participants if set(self.uploads.get(b, {})) == set(self.shapes))


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
    prior_rounds: tuple[int, ...] = ()
    policy_sha256: str = ""  # phase == "open": the aggregator's policy digest, which the banks' must equal


FINAL_VERSION = "final_version"
FINAL_GRACE_SECONDS = 60.0  # how long a finished federation waits for the banks' reports of its last version


@dataclass
class _Projections:
    """The broadcast last asked for (its signature label), decoded, and each bank's signed projection of it."""

    label: str
    source: Broadcast | None
    served: dict[str, tuple[bytes, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Choice:
    """Who takes part in the next round and how many must upload everything — or why the run stops."""

    participants: tuple[str, ...] = ()
    stopped_reason: str | None = None


class Coordinator:
    """Enrolment, the union index and the round loop of one federation.

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
        self._projections = _Projections("", None)  # the latest broadcast served, decoded, and its projections
        self._projections_lock = threading.Lock()
        self.context = ckks.load_public_context(public_context)
        self.fingerprint = ckks.fingerprint(public_context)
        self.store = store
        self.decryptor = decryptor
        self.board = DecryptionBoard(residues.data_level(self.context))  # the banks' partial decryptions
        self.liveness_seconds = liveness_seconds
        self.method = build_method(config)
        self._stages = method_stages(self.method)
        self._layouts = {kind: policy.upload_layout(kind) for kind in policy.allowed_kinds}
        self.log = get_logger(role="aggregator", federation=federation)
        self._changed = threading.Condition()
        # held while a round's result is stored and becomes the latest version, and while status() reads both:
        # otherwise a status read between the two shows an applied round beyond latest_version
        self._applying = threading.Lock()
        self._seen: dict[str, float] = {}
        self._open: _OpenRound | None = None
        self._aggregating = False
        self._started = time.monotonic()
        self._finished = store.finished()
        final = store.get_meta(FINAL_VERSION)
        self._final_version: int | None = None if final is None else int(final)
        self._finished_at: float | None = None  # a restarted, finished aggregator waits no longer
        self._enrolled: set[str] = set(store.enrolled_banks())  # kept by enrol(); the round loop waits on it
        # kept in memory (the poll path reads them under the lock): set by _build_index, _apply and _finish
        self._latest_version: int | None = store.latest_version()
        self._stopped_reason: str | None = store.stopped_reason()
        self._withdrawn: dict[str, Withdrawal] = store.withdrawals()
        # base version → banks that missed an upload deadline of a round from it: its reopening goes without them
        self._missed: dict[int, set[str]] = {}
        self._index: tuple[int, dict[str, np.ndarray]] | None = store.index()
        self._upload_shapes: dict[str, tuple[int, ...]] | None = None  # fixed once the index exists
        self._prior_upload_shapes: dict[str, tuple[int, ...]] | None = None  # likewise (the label prior's)
        self._num_parameters: int | None = None  # likewise
        # (version, its W̄ as banks download it): the weights sums of a round from that version are centred on it
        self._reference: tuple[int, np.ndarray] | None = None
        # Fed²GNN's set-up exchange, relayed before enrolment (the banks enrol their reconstructed graphs); kept in
        # memory: a restarted aggregator has a fresh nonce, and banks still exchanging start again
        self._exchange: ExchangeRelay | None = None
        # the consortium label prior's FedAvg rounds, run before training round 1 (:meth:`_fit_label_prior`)
        stages = policy.dp.labels.effective_stages if releases_labels_together(policy) else 1
        self._prior_steps = prior_steps(stages)
        self._prior_rounds: list[int] = [
            row.round for row in store.rounds() if row.base_version == PRIOR_BASE_VERSION and row.status == PRIOR_FITTED
        ]
        if config.method == "fed2gnn":
            width = signal_width(config, 0) if config.fed2gnn.projection_dim > 0 else None
            self._exchange = ExchangeRelay(federation, self.banks, config.fed2gnn.hops, width, signing_keys)

    # --- request handlers (any thread) ----------------------------------------------------

    def _bank_index(self, bank: str) -> int:
        if bank not in self.banks:
            raise ProtocolConflict("unknown-bank", f"{bank!r} is not a bank of this consortium")
        return self.banks.index(bank)

    def exchange(self) -> ExchangeRelay:
        """The relay of the method's bank-to-bank set-up exchange (409 ``no-exchange`` for a method without one)."""
        if self._exchange is None:
            raise ProtocolConflict("no-exchange", f"method {self.config.method!r} has no bank-to-bank exchange")
        return self._exchange

    def heartbeat(self, bank: str) -> None:
        self._bank_index(bank)
        with self._changed:
            self._seen[bank] = time.monotonic()
            self._changed.notify_all()

    def withdraw(self, bank: str, reason: str, round_number: int) -> bool:
        """Record that ``bank`` takes no further part (``reason``: a :data:`WITHDRAWAL_REASONS` code; it
        declined round ``round_number``). True when new, False when it repeats a recorded withdrawal.

        Durable before it counts; the round loop stops inviting the bank, stops waiting for it in an
        open round, and ends the run once too few banks are left (:meth:`_choose_participants`).
        """
        self._bank_index(bank)
        if reason not in WITHDRAWAL_REASONS:
            raise ProtocolConflict("bad-withdrawal", f"unknown reason {reason!r}; known: {sorted(WITHDRAWAL_REASONS)}")
        with self._changed:
            # a bank declines a round it was invited to: one this aggregator opened (or is about to open)
            latest = self.store.last_round_number()
            if round_number > latest + 1:
                raise ProtocolConflict(
                    "bad-withdrawal", f"round {round_number} was never opened (the latest is {latest}); not recorded"
                )
            self._seen[bank] = time.monotonic()
            if bank in self._withdrawn:
                return False
            self._withdrawn[bank] = self.store.withdraw(bank, reason, round_number)
            left = [b for b in self.banks if b not in self._withdrawn]
            self._changed.notify_all()
        self.log.warning("bank.withdrew", bank=bank, reason=reason, round=round_number, banks_left=left)
        return True

    def enrol(self, bank: str, num_features: int, num_classes: int, pseudonyms: Sequence[str]) -> None:
        """Record a bank's pseudonym set and data dimensions (idempotent for the same set)."""
        self._bank_index(bank)
        if len(set(pseudonyms)) != len(pseudonyms) or not pseudonyms:
            raise ProtocolConflict("bad-enrolment", f"{bank}: pseudonyms must be non-empty and distinct")
        enrolment = Enrolment(bank, num_features, num_classes, tuple(pseudonyms))
        with self._changed:
            existing = self.store.enrolment(bank)
            if existing is not None:
                if existing != enrolment:
                    raise ProtocolConflict(
                        "enrolment-changed", f"{bank} enrolled before with other nodes or dimensions; it cannot change"
                    )
            else:
                if self._index is not None:
                    raise ProtocolConflict("enrolment-closed", "the union index is already built")
                for other in self.store.enrolments().values():
                    if (other.num_features, other.num_classes) != (num_features, num_classes):
                        raise ProtocolConflict(
                            "dimension-mismatch",
                            f"{bank} has {num_features} features/{num_classes} classes, {other.bank} has "
                            f"{other.num_features}/{other.num_classes}",
                        )
                self.store.enrol(enrolment)
                self._enrolled.add(bank)
                self.log.info("bank.enrolled", bank=bank, nodes=len(pseudonyms))
            self._seen[bank] = time.monotonic()
            self._changed.notify_all()

    def index_for(self, bank: str) -> tuple[int, np.ndarray]:
        """(M, positions of this bank's pseudonyms in the union index, in the order it enrolled them)."""
        self._bank_index(bank)
        if self._index is None:
            raise ProtocolConflict("not-ready", "the union index is built once every bank has enrolled")
        size, positions = self._index
        return size, positions[bank]

    def upload_body_limit(self, floor: int) -> int:
        """The largest upload body this round's shapes allow: the biggest kind's chunks at the largest ciphertext
        these parameters make, plus framing; never below ``floor`` (the service's default cap). One kind of a
        3 x 1,000,000-customer federation is ~161 MB (M = 2.5 M rows), past a fixed 64 MiB cap."""
        if self._index is None:
            return floor
        slots = self.policy.he.poly_modulus_degree // 2
        shapes = [*self._shapes().values(), *(self._prior_shapes().values() if self._prior_steps else ())]
        largest = max(int(np.prod(shape)) for shape in shapes)
        chunks = ckks.chunk_count(largest, slots)
        return max(floor, chunks * (ckks.max_chunk_bytes(self.policy.he) + 8) + 4096)

    def max_bank_nodes(self) -> int:
        """The largest bank's node count: the DP step's public ``w_max`` (node membership is public to the
        aggregator anyway; every bank gets the same number)."""
        if self._index is None:
            raise ProtocolConflict("not-ready", "the union index is built once every bank has enrolled")
        return max(int(p.size) for p in self._index[1].values())

    def model(self, version: int) -> bytes:
        data = self.store.model(version)
        if data is None:
            raise ProtocolConflict("unknown-version", f"model version {version} does not exist (yet)")
        return data

    def broadcast_for(self, bank: str, version: int) -> tuple[bytes, str]:
        """Model ``version`` as ``bank`` is served it: its projection (W̄, its rows of Ȳ and Ā) and the signature."""
        return self._projection(bank, version, self.model(version), model_label(version))

    def stage_broadcast_for(self, bank: str, round_number: int, stage: str) -> tuple[bytes, str]:
        """The broadcast after ``stage`` of round ``round_number`` as ``bank`` is served it (projected, signed)."""
        data = self.stage_model(round_number, stage)
        label = stage_label(round_number, stage)
        if stage == LABEL_PRIOR_STAGE:  # the fitted prior θ̄: model parameters, nothing per customer
            self.index_for(bank)
            return data, sign_broadcast(self.broadcast_key, self.federation, bank, label, data)
        return self._projection(bank, round_number, data, label)

    def _projection(self, bank: str, version: int, data: bytes, label: str) -> tuple[bytes, str]:
        """``bank``'s signed projection of the broadcast ``label``. The banks of a round ask for the same broadcast
        at once: it is decoded once and each projection made once, for the latest broadcast asked for."""
        size, positions = self.index_for(bank)
        with self._projections_lock:
            if self._projections.label != label:
                self._shapes()
                neighbors = self.config.self_supervision.neighbors
                source = decode_broadcast(version, data, self._num_parameters, size, neighbors)
                self._projections = _Projections(label, source)
            cache = self._projections
            served = cache.served.get(bank)
        if served is None:  # outside the lock: the banks' projections are made side by side
            body = encode_projection(cache.source, positions)
            served = cache.served.setdefault(
                bank, (body, sign_broadcast(self.broadcast_key, self.federation, bank, label, body))
            )
        return served

    def stage_model(self, round_number: int, stage: str) -> bytes:
        """The broadcast published after ``stage`` of round ``round_number`` (the next stage starts from it)."""
        data = self.store.stage_model(round_number, stage)
        if data is None:
            raise ProtocolConflict(
                "unknown-stage", f"round {round_number} has published no broadcast after stage {stage!r} (yet)"
            )
        return data

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
                prior_rounds=tuple(self._prior_rounds),
            )
        with self._changed:
            if self._index is None:
                return RoundView("enrolling", self.federation)
            prior_rounds = tuple(self._prior_rounds)
            current = self._open
            if current is None:
                phase = "aggregating" if self._aggregating else "waiting"
                return RoundView(phase, self.federation, latest_version=latest, prior_rounds=prior_rounds)
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
                prior_rounds=prior_rounds,
                policy_sha256=self.policy_digest,
            )

    def accept_upload(self, bank: str, round_number: int, kind: str, chunks: list[bytes], receipt: Receipt) -> bool:
        """Check and keep one upload; True when it is new, False when it repeats an accepted one."""
        self._bank_index(bank)
        with self._changed:
            if bank in self._withdrawn:
                raise ProtocolConflict(
                    "withdrawn", f"{bank} withdrew ({self._withdrawn[bank].reason}); it uploads no more"
                )
            current = self._open
            if current is None or current.round != round_number:
                open_number = current.round if current else None
                raise ProtocolConflict("stale-round", f"round {round_number} is not open (open: {open_number})")
            if receipt.nonce != current.nonce:
                raise ProtocolConflict("stale-round", f"round {round_number} was reopened with a fresh nonce; retrain")
            if bank not in current.participants:
                raise ProtocolConflict("not-participant", f"{bank} is not a participant of round {round_number}")
            if kind not in current.shapes:
                raise CiphertextError(
                    f"round {round_number} (stage {current.stage!r}) expects kinds {sorted(current.shapes)}, "
                    f"not {kind!r}"
                )
            length = int(np.prod(current.shapes[kind]))
            ticket = RoundTicket(
                self.federation,
                current.round,
                current.nonce,
                current.participants,
                self.fingerprint,
                self.policy_digest,
            )
            upload = Upload(kind, list(chunks), length, receipt)
            check_upload(upload, self.signing_keys[bank], ticket, bank)
            previous = current.uploads.get(bank, {}).get(kind)
            if previous is not None:
                if previous.receipt.ciphertext_sha256 == receipt.ciphertext_sha256:
                    return False
                raise ProtocolConflict("already-uploaded", f"{bank} already uploaded other {kind!r} for this round")
        # parsing ciphertexts is the slow part: outside the lock, then re-check the round
        ciphertext = read_checked(self.context, upload, bank, packing.slot_length(self._layouts.get(kind), length))
        with self._changed:
            if self._open is not current:
                raise ProtocolConflict("stale-round", f"round {round_number} closed while the upload was checked")
            self.store.save_receipt(receipt)  # durable before the upload can count towards a decryption
            current.uploads.setdefault(bank, {})[kind] = upload
            current.ciphertexts.setdefault(bank, {})[kind] = ciphertext
            self._seen[bank] = time.monotonic()
            self._changed.notify_all()
        return True

    def accept_report(
        self, bank: str, version: int, counts: tuple[int, int, int, int], histograms: np.ndarray | None = None
    ) -> None:
        """A bank's evaluation of model ``version`` on its own validation and test nodes: counts, and with a
        positive class its score histograms (:mod:`fedgl_secure.engine.score_histograms`)."""
        self._bank_index(bank)
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
            "exchange": None if self._exchange is None else self._exchange.progress(),  # Fed²GNN's set-up
        }

    def round_phase(self) -> str:
        with self._changed:
            if self._finished:
                return "finished"
            if self._index is None:
                return "enrolling"
            return "open" if self._open is not None else ("aggregating" if self._aggregating else "waiting")

    # --- the round loop (its own thread) --------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Drive rounds until ``max_rounds`` model versions exist, early stopping, too few banks left
        within their budget (``stopped_reason``), or ``stop``."""
        self._started = time.monotonic()
        try:
            if not self._wait_for_enrolment(stop):
                return
            version = self._resume()
            if not self._fit_label_prior(stop):
                return
            round_number = self.store.last_round_number() + 1
            stopper = EarlyStopping(self.config.federation.patience)
            stopped_reason = self._stopped_reason  # a restarted aggregator of a stopped run says it again
            while not stop.is_set() and not self._finished and version < self.config.federation.max_rounds:
                choice = self._choose_participants(stop, version)
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
            while self._index is None:
                if len(self._enrolled) == len(self.banks):
                    self._build_index(self.store.enrolments())
                    break
                if stop.is_set():
                    return False
                self._changed.wait(0.2)  # the timeout only re-checks ``stop``; nothing is read from the store
        return True

    def _build_index(self, enrolled: Mapping[str, Enrolment]) -> None:
        size, positions = union_positions([enrolled[bank].pseudonyms for bank in self.banks])
        by_bank = dict(zip(self.banks, positions, strict=True))
        first = enrolled[self.banks[0]]
        if self._latest_version is None:
            weights = method_initial_parameters(self.method, self.config, first.num_features, first.num_classes)
            self.store.save_initial_model(encode_broadcast(Broadcast(0, weights)))
            self._latest_version = 0
        self.store.save_index(size, by_bank)
        self._index = (size, by_bank)
        self.log.info("index.built", num_global_nodes=size, banks=len(self.banks))

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """Every kind's upload shape, over all stages (computed once: they depend only on the index and the
        dimensions)."""
        if self._upload_shapes is None:
            size, _ = self._index
            first = self.store.enrolment(self.banks[0])
            initial = method_initial_parameters(self.method, self.config, first.num_features, first.num_classes)
            self._num_parameters = int(initial.numel())
            self._upload_shapes = self.method.upload_shapes(self._num_parameters, size, first.num_classes)
        return self._upload_shapes

    def _stage_shapes(self, stage: str) -> dict[str, tuple[int, ...]]:
        """The upload shapes of ``stage``'s kinds (all of them for a single-stage method)."""
        shapes = self._shapes()
        return {kind: shapes[kind] for kind in stage_upload_kinds(self.method, stage)}

    def _base_broadcast(self, version: int) -> Broadcast | None:
        """The broadcast of model ``version`` as the banks download it (float32), which a round's first stage
        starts from, with the method's server back in the state it had after that version
        (:func:`~fedgl_secure.methods.base.server_state`): a round retried from the same version, or resumed
        after a restart, starts where the simulation's would. None for a method without ``stage_update``
        (every single-stage one): its ``server_update`` reads no earlier broadcast, so none is decoded (a large
        federation's pseudo graph is gigabytes)."""
        state = self.store.server_state(version)
        arrays = {} if state is None else encodings.decode_arrays(state)
        load_server_state(self.method, {name: torch.from_numpy(array) for name, array in arrays.items()})
        if not hasattr(self.method, "stage_update"):
            return None
        self._shapes()
        size, _ = self._index
        neighbors = self.config.self_supervision.neighbors
        return decode_broadcast(version, self.model(version), self._num_parameters, size, neighbors)

    def _version_weights(self, version: int) -> np.ndarray:
        """W̄ of model ``version`` as the banks download it: what a round from it centres its weights on."""
        if self._reference is None or self._reference[0] != version:
            self._shapes()
            size, _ = self._index
            neighbors = self.config.self_supervision.neighbors
            broadcast = decode_broadcast(version, self.model(version), self._num_parameters, size, neighbors)
            self._reference = (version, wire_reference(broadcast.weights))
        return self._reference[1]

    def _resume(self) -> int:
        """Last applied model version; finishes a fully decrypted round, retires an unfinished one."""
        version = self.store.latest_version() or 0
        last = self.store.round(self.store.last_round_number())
        if last is not None and last.status not in CLOSED_STATUSES:
            sums = self.store.sums(last.round)
            if set(sums) == set(self._shapes()) and last.base_version == version:
                # every stage's sums are stored: replay the stages' server updates on them
                broadcast = self._base_broadcast(version)
                for stage in self._stages:
                    kinds = stage_upload_kinds(self.method, stage)
                    broadcast = self._stage_update(stage, version, {k: sums[k][1] for k in kinds}, broadcast)
                contributors = sums[stage_upload_kinds(self.method, self._stages[-1])[0]][2]
                self._apply(last.round, version, broadcast, contributors)
                self.log.info("round.resumed", round=last.round)
                return version + 1
            status = "abandoned" if sums else "interrupted"
            self.store.close_round(last.round, status, "the aggregator stopped while the round was open")
            self.log.warning("round.retired", round=last.round, status=status)
        return version

    # --- the consortium label prior (before training round 1) ---------------------------------

    def _prior_shapes(self) -> dict[str, tuple[int, ...]]:
        """A label-prior round's one kind: the prior's parameters and the bank's weight
        (:func:`~fedgl_secure.privacy.consortium_prior.prior_term`). Computed once: every upload request's body
        limit reads it (:meth:`upload_body_limit`)."""
        if self._prior_upload_shapes is None:
            first = self.store.enrolment(self.banks[0])
            self._prior_upload_shapes = {WEIGHTS: (prior_size(first.num_features, first.num_classes) + 1,)}
        return self._prior_upload_shapes

    def _prior_start(self, step: int) -> torch.Tensor:
        """θ̄ that FedAvg round ``step`` of the prior starts from: zero at the first round of each stage's prior,
        else the θ̄ the previous round published."""
        size = self._prior_shapes()[WEIGHTS][0] - 1
        if starts_stage(step):
            return torch.zeros(size)
        arrays = encodings.decode_arrays(self.store.stage_model(self._prior_rounds[-1], LABEL_PRIOR_STAGE))
        return torch.from_numpy(arrays["prior"])

    def _fit_label_prior(self, stop: threading.Event) -> bool:
        """Under ``dp.labels.prior = "consortium-sgc"``, the prior's FedAvg rounds before training round 1
        (:mod:`~fedgl_secure.privacy.consortium_prior`): each a round of its own number, stage
        ``label-prior``, one ``weights`` kind centred on the θ̄ it starts from, every bank taking part
        (so every decrypted sum is over the same banks: two sums over different sets would reveal a bank's
        term), and θ̄ published as the round's stage model. The banks release each stage of their labels from
        the θ̄ of the last round before it (``RoundView.prior_rounds`` says which rounds those are). Resumes
        after the last fitted round; False if ``stop`` was set."""
        round_number = self.store.last_round_number() + 1
        while len(self._prior_rounds) < self._prior_steps:
            if not self._wait_for_every_bank(stop):
                return False
            step = len(self._prior_rounds) + 1
            outcome = self._run_prior_round(stop, round_number, step)
            if outcome == "stopped":
                return False
            if outcome in (PRIOR_FITTED, "abandoned"):
                round_number += 1
        return True

    def _wait_for_every_bank(self, stop: threading.Event) -> bool:
        """Wait until every bank was heard from within ``liveness_seconds`` (the prior needs them all)."""
        with self._changed:
            while not stop.is_set():
                now = time.monotonic()
                if all(now - self._seen.get(bank, -1e18) <= self.liveness_seconds for bank in self.banks):
                    return True
                self._changed.wait(0.2)
        return False

    def _run_prior_round(self, stop: threading.Event, round_number: int, step: int) -> str:
        """FedAvg round ``step`` of the label prior as round ``round_number``: "fitted", or "stopped", "aborted"
        (the same number reopens) or "abandoned" (the next number retries), as :meth:`_run_stage` says."""
        log = self.log.bind(round=round_number, stage=LABEL_PRIOR_STAGE)
        try:
            nonce = self._open_at_key_authority(stop, round_number, self.banks)
        except FedGLError:
            return "stopped"
        self.store.open_round(round_number, PRIOR_BASE_VERSION, nonce, self.banks)
        start = self._prior_start(step)
        timer = PhaseTimer()
        outcome, contributors, sums = self._run_stage(
            stop,
            round_number,
            PRIOR_BASE_VERSION,
            nonce,
            LABEL_PRIOR_STAGE,
            self.banks,
            timer,
            wire_reference(start),
            first=True,
            shapes=self._prior_shapes(),
        )
        if outcome != "decrypted":
            return outcome
        fitted = prior_average(torch.from_numpy(np.asarray(sums[WEIGHTS])), start)
        self.store.save_stage_model(
            round_number, LABEL_PRIOR_STAGE, encodings.encode_arrays({"prior": fitted.to(torch.float32).numpy()})
        )
        self.store.close_round(round_number, PRIOR_FITTED, f"label prior: FedAvg round {step} of {self._prior_steps}")
        with self._changed:
            self._prior_rounds.append(round_number)
            self._changed.notify_all()
        log.info("prior.round_fitted", step=step, steps=self._prior_steps, contributors=list(contributors))
        return PRIOR_FITTED

    def _chosen(self, training_round: int) -> tuple[str, ...]:
        """The banks :func:`select_participants` draws for ``training_round``, withdrawn ones included."""
        chosen = select_participants(
            len(self.banks), self.config.federation.participation, self.config.seed, training_round
        )
        return tuple(self.banks[k] for k in chosen)

    def _participants(self, training_round: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(chosen for this round and not withdrawn, of those the banks heard from within ``liveness_seconds``)."""
        names = tuple(b for b in self._chosen(training_round) if b not in self._withdrawn)
        now = time.monotonic()
        return names, tuple(b for b in names if now - self._seen.get(b, -1e18) <= self.liveness_seconds)

    def _exhausted(self, version: int, pinned: tuple[str, ...]) -> str | None:
        """Why no round from ``version`` can ever be decrypted, now that banks withdrew; None while one can.

        Fewer than the quorum of the banks chosen for the training round are left (with every bank
        chosen: fewer than the quorum in the federation) — the simulation stops on the same rule — or
        a pinned retry (:meth:`_pinned_contributors`) lost one of the banks it must have exactly.
        """
        if not self._withdrawn:
            return None
        withdrawn = sorted(self._withdrawn.values(), key=lambda w: (w.round, w.bank))
        why = "; ".join(sorted({WITHDRAWAL_REASONS[w.reason] for w in withdrawn}))
        listed = ", ".join(f"{w.bank} at round {w.round}" for w in withdrawn)
        if gone := [bank for bank in pinned if bank in self._withdrawn]:
            return (
                f"{why}: {', '.join(gone)} withdrew, but the retry of an abandoned round from version {version} "
                f"must have exactly its contributors {list(pinned)} (withdrawn: {listed})"
            )
        chosen = self._chosen(version + 1)
        left = [bank for bank in chosen if bank not in self._withdrawn]
        quorum = _quorum(self.policy)
        if len(left) >= quorum:
            return None
        banks = f"{len(left)} bank{'' if len(left) == 1 else 's'}"
        if len(chosen) == len(self.banks):
            return f"{why}: {banks} left, quorum {quorum} (withdrawn: {listed})"
        return (
            f"{why}: {banks} left of the {len(chosen)} chosen for training round {version + 1}, quorum {quorum} "
            f"(withdrawn: {listed})"
        )

    def _pinned_contributors(self, version: int) -> tuple[str, ...]:
        """Banks whose sums for a round from ``version`` were already decrypted, if that round never applied.

        A retry from the same version must have exactly these contributors: banks retrain from
        the same state, so their terms repeat, and a sum over another set would let the
        difference of the two decrypted sums reveal one bank's term.
        """
        for row in self.store.rounds():
            if row.base_version == version and row.status != "applied":
                sums = self.store.sums(row.round)
                if sums:  # a later stage's banks are among the first's: the union is the first stage's
                    decrypted = {bank for _, _, banks in sums.values() for bank in banks}
                    return tuple(bank for bank in self.banks if bank in decrypted)
        return ()

    def _choose_participants(self, stop: threading.Event, version: int) -> _Choice | None:
        """The participants of a round from ``version`` (each must upload everything), or the reason the run
        stops (:meth:`_exhausted`); None if ``stop`` was set.

        Every chosen bank that has not withdrawn, or — once a silent bank has had ``liveness_seconds``
        since this aggregator (re)started to show up — at least the quorum of live ones; banks that missed
        an attempt from ``version`` are left out while the others reach the quorum; a pinned set (see
        :meth:`_pinned_contributors`) must be live in full.
        """
        pinned = self._pinned_contributors(version)
        with self._changed:
            while not stop.is_set():
                reason = self._exhausted(version, pinned)
                if reason is not None:
                    return _Choice(stopped_reason=reason)
                chosen, live = self._participants(version + 1)
                if pinned:
                    if set(pinned) <= set(live):
                        return _Choice(pinned)
                else:
                    missed = self._missed.get(version, set())
                    if len([bank for bank in live if bank not in missed]) >= _quorum(self.policy):
                        chosen = tuple(bank for bank in chosen if bank not in missed)
                        live = tuple(bank for bank in live if bank not in missed)
                    waited_long_enough = time.monotonic() - self._started >= self.liveness_seconds
                    if len(live) >= _quorum(self.policy) and (len(live) == len(chosen) or waited_long_enough):
                        return _Choice(live)
                self._changed.wait(0.2)
        return None

    def _open_at_key_authority(self, stop: threading.Event, round_number: int, participants: tuple[str, ...]) -> str:
        """Open the round at the key authority (fresh nonce); waits out an unreachable or refusing one."""
        attempt = 0
        while True:
            nonce = secrets.token_hex(16)
            try:
                self.decryptor.open_round(self.federation, round_number, nonce, participants, self.policy_digest)
                return nonce
            except FedGLError as error:
                attempt += 1
                if attempt == 1 or attempt % 30 == 0:
                    self.log.error("round.open_failed", round=round_number, error=str(error)[:300], attempt=attempt)
                if stop.wait(1.0):
                    raise

    def _run_round(self, stop: threading.Event, round_number: int, version: int, choice: _Choice) -> str:
        """One round from ``version``: each of the method's stages in turn (:meth:`_run_stage`), under one
        nonce; "applied", "aborted" (reopened), "abandoned" (the next round number retries) or "stopped"."""
        participants = choice.participants
        log = self.log.bind(round=round_number)
        try:
            nonce = self._open_at_key_authority(stop, round_number, participants)
        except FedGLError:
            return "stopped"
        self.store.open_round(round_number, version, nonce, participants)
        opened = time.monotonic()
        log.info("round.opened", participants=list(participants), base_version=version, stages=list(self._stages))
        broadcast = self._base_broadcast(version)
        reference = self._version_weights(version)
        timer = PhaseTimer()
        for index, stage in enumerate(self._stages):
            outcome, participants, sums = self._run_stage(
                stop, round_number, version, nonce, stage, participants, timer, reference, first=index == 0
            )
            if outcome != "decrypted":
                return outcome
            with timer.phase("server_step"):
                broadcast = self._stage_update(stage, version, sums, broadcast)
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

    def _run_stage(
        self,
        stop: threading.Event,
        round_number: int,
        version: int,
        nonce: str,
        stage: str,
        participants: tuple[str, ...],
        timer: PhaseTimer,
        reference: np.ndarray,
        *,
        first: bool,
        shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[str, tuple[str, ...], dict[str, np.ndarray]]:
        """Collect ``stage``'s uploads until its deadline (or every expected bank's), then decrypt its sums
        (the weights restored from their centring on ``reference``, the W̄ the stage's banks trained from).
        Returns ("decrypted", the banks whose uploads the sums hold, the sums), or the round's outcome with
        nothing: "stopped", "aborted" (a participant missing in the first stage: nothing was decrypted, the
        round reopens without it) or "abandoned" (a later stage, or a refused decryption: the next round number
        retries).
        ``shapes``: the stage's kinds and shapes when it is not one of the method's (the label prior's)."""
        log = self.log.bind(round=round_number, stage=stage)
        timeouts = self.policy.timeouts
        deadline = time.monotonic() + min(timeouts.upload_seconds, timeouts.round_seconds)
        shapes = self._stage_shapes(stage) if shapes is None else shapes
        current = _OpenRound(round_number, version, nonce, participants, shapes, deadline, stage)
        with self._changed:
            self._open = current
            self._changed.notify_all()
        with self._changed:
            while time.monotonic() < deadline:
                if stop.is_set():
                    self._open = None
                    return "stopped", (), {}
                # banks that withdrew during the round are not waited for
                complete = current.complete_banks()
                expected = [b for b in participants if b in complete or b not in self._withdrawn]
                if len(complete) == len(expected) or len(expected) < len(participants):  # done, or never complete
                    break
                self._changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            complete = current.complete_banks()
            withdrew = sorted(b for b in participants if b in self._withdrawn and b not in complete)
            self._open = None
            self._aggregating = len(complete) == len(participants)
        if len(complete) < len(participants):  # every decryptor refuses a sum without all the participants (R13)
            missing = sorted(set(participants) - set(complete) - set(withdrew))
            detail = f"{len(complete)} of {len(participants)} banks uploaded every kind; each participant is needed"
            if not withdrew:  # the deadline passed: the reopened round goes without the late banks
                self._missed.setdefault(version, set()).update(missing)
                detail += f"; late: {', '.join(missing)}"
            if len(self._stages) > 1:
                detail = f"stage {stage!r}: {detail}"
            if withdrew:
                detail += f"; withdrawn: {', '.join(withdrew)}"
            # after a first stage nothing was decrypted (reopen with a fresh nonce); after a later one the
            # round's earlier sums were, and the key authority never decrypts a (round, kind) twice
            status = "aborted" if first else "abandoned"
            self.store.close_round(round_number, status, detail)
            log.warning(f"round.{status}", complete=list(complete), missing=missing, withdrawn=withdrew, detail=detail)
            return status, (), {}
        try:
            sums = self._decrypt_sums(stop, current, complete, timer, reference)
        except FedGLError as error:  # DecryptionRefused included
            self.store.close_round(round_number, "abandoned", str(error))
            log.error("round.abandoned", error=str(error))
            return "abandoned", (), {}
        finally:
            with self._changed:
                self._aggregating = False
        return "decrypted", complete, sums

    def _decrypt_sums(
        self,
        stop: threading.Event,
        current: _OpenRound,
        complete: tuple[str, ...],
        timer: PhaseTimer,
        reference: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Each kind's sum, threshold-decrypted: the key authority's partial decryption, then ``t`` banks' from the
        board (contributors first, then any bank alive), fused here (``crypto/partial_decryption.py``)."""
        sums = {}
        threshold = self.policy.he.threshold
        left_out: set[str] = set()  # banks that failed a decryption of this round are not asked for its next sums
        for kind, shape in current.shapes.items():
            uploads = [current.uploads[bank][kind] for bank in complete]
            length = int(np.prod(shape))
            layout = self._layouts.get(kind)
            slots = packing.slot_length(layout, length)
            receipts = [upload.receipt for upload in uploads]
            read = [current.ciphertexts[bank][kind] for bank in complete]
            c1s = [ciphertext.c1 for ciphertext in read]  # every decryptor sums them itself
            with timer.phase("aggregation"):
                summed = residue_sum.add(self.context, read)
            with timer.phase("decryption"):  # the key authority's share, then t banks' (on their machines)
                authority = self.decryptor.decrypt(
                    self.federation, current.round, kind, receipts, self.fingerprint, slots, c1s
                )
                candidates = [*complete, *sorted(b for b in self.banks if b not in complete and self._alive(b))]
                candidates = [bank for bank in candidates if bank not in left_out]
                _, partials = self.board.gather(
                    current.round,
                    kind,
                    receipts,
                    c1s,
                    candidates,
                    threshold,
                    self.policy.timeouts.decryption_seconds,
                    self._alive,
                    stop,
                    left_out,
                )
            with timer.phase("aggregation"):  # fusing and decoding
                values = fused_values(self.context, summed, [authority, *partials], length, layout, len(uploads))
                values = restore_sum(kind, values, reference)
            self.log.info(  # the key authority's share of the decryption traffic (each bank logs its own)
                "sum.decrypted",
                round=current.round,
                kind=kind,
                values=length,
                uploads=len(uploads),
                authority_c1_bytes=sum(c1.nbytes for c1 in c1s),
                authority_partial_bytes=authority.nbytes,
            )
            self.store.save_sum(current.round, kind, current.nonce, values, complete)
            sums[kind] = values
        return sums

    def _alive(self, bank: str) -> bool:
        """Whether ``bank`` polled within the liveness window (its decryption thread polls while it trains)."""
        seen = self._seen.get(bank)
        return seen is not None and time.monotonic() - seen <= self.liveness_seconds

    def _stage_update(
        self, stage: str, version: int, sums: Mapping[str, np.ndarray], broadcast: Broadcast | None
    ) -> Broadcast:
        """The method's server update after ``stage`` of the round from ``version`` (on its decrypted sums)."""
        shapes = self._shapes()
        tensors = {
            kind: torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(shapes[kind])
            for kind, values in sums.items()
        }
        return stage_update(self.method, stage, tensors, version + 1, broadcast)

    def _apply(self, round_number: int, version: int, broadcast: Broadcast, contributors: tuple[str, ...]) -> None:
        """Store the round's result as model ``version + 1`` (with the method's server state, if it keeps one)."""
        state = server_state(self.method)
        encoded_state = (
            None if state is None else encodings.encode_arrays({k: v.cpu().numpy() for k, v in state.items()})
        )
        encoded = encode_broadcast(broadcast)
        with self._applying:
            self.store.apply_round(round_number, version + 1, encoded, contributors, encoded_state)
            self._reference = (version + 1, wire_reference(broadcast.weights))
            with self._projections_lock:  # the banks ask for it next: projected from memory, not decoded again
                self._projections = _Projections(model_label(version + 1), broadcast)
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
        with self._changed:
            if self._final_version is not None or not self._finished:
                return self._final_version
            latest, finished_at = self._latest_version, self._finished_at
            expected = len([bank for bank in self.banks if bank not in self._withdrawn])
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
