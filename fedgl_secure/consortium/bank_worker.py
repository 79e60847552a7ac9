"""A bank's round client: its own graph slice, local training, and encrypted, receipted uploads (DESIGN §5.3 step 2).

The bank pulls: it asks the aggregator for the open round, downloads the model version the
round starts from, evaluates it on its own validation/test nodes (counts only are reported),
trains, and uploads each kind as CKKS ciphertext chunks with a signed receipt. Raw node ids
never leave the bank: it enrols HMAC pseudonyms and receives only its own positions in the
union index.

A method of several stages per round (``methods.base.method_stages``, e.g. GraphFL's meta step and
fine-tuning) takes them in turn, as the aggregator opens them: the first stage starts from the base
version, a later one from the broadcast the aggregator published after the stage before
(``GET /v1/rounds/{round}/stages/{stage}``), and each computes (``stage_contribution``) and uploads
only that stage's kinds.

A round that is reopened (aborted below quorum, or the aggregator restarted) is retrained from
the same starting state (``consortium/bank_session.py``), so a reopened round gives the same contribution as the
first attempt would have, and a consortium run reproduces the in-process simulation with the same seed.

Under a policy with DP each contribution is released as the simulation releases it (``consortium/bank_releases.py``,
the bank's DP state on disk). Once a round would exceed the budget the bank stops contributing for good: it logs
``privacy.budget_exhausted``, uploads nothing, and **withdraws** (``POST /v1/withdraw``, reason
``privacy-budget-exhausted``, retried at every poll until the aggregator has it), so the aggregator
stops inviting it and ends the run with a ``stopped_reason`` once too few banks are left; the bank
keeps polling until the federation has finished.

:class:`BankWorker` holds the bank's identity (name, keys, the public context), its graph, and the parts it composes:
its releases (``bank_releases.py``), its uploads (``bank_uploads.py``: encrypting and sending), the bank's side of
each set-up phase the run declares (``phases.py``: Fed²GNN's exchange before enrolment, the consortium label prior's
rounds in its label release) and its files (``bank_state.py``). The aggregator is an
:class:`~fedgl_secure.consortium.aggregator_port.AggregatorPort` (HTTP in the bank node, scripted in tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.consortium.aggregator_port import AggregatorPort, RoundResponse, Served, ticket_for
from fedgl_secure.consortium.bank_label_prior import poll_round
from fedgl_secure.consortium.bank_releases import BankReleases
from fedgl_secure.consortium.bank_session import Session, restore, snapshot, stage_key
from fedgl_secure.consortium.bank_state import save_final_model, save_union_index
from fedgl_secure.consortium.bank_uploads import BankUploads, EncryptionRefused
from fedgl_secure.consortium.config import BANK_SOURCES
from fedgl_secure.consortium.coordinator import FINAL_GRACE_SECONDS
from fedgl_secure.consortium.participant_choice import BUDGET_EXHAUSTED
from fedgl_secure.consortium.phases import BankParts, bank_phases, declared_phases
from fedgl_secure.consortium.pseudonyms import pseudonymise
from fedgl_secure.consortium.retry import StopRequested, retry_until_ready
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.broadcast_signature import verify_broadcast
from fedgl_secure.crypto.upload import Upload
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors, accuracy
from fedgl_secure.engine.score_histograms import score_histogram
from fedgl_secure.engine.self_training import check_services as check_self_training_services
from fedgl_secure.errors import ConfigError, FedGLError, ProtocolConflict
from fedgl_secure.log import get_logger
from fedgl_secure.methods import apply_in_method_policy, build_method
from fedgl_secure.methods.base import Broadcast, method_model, method_stages, stage_contribution
from fedgl_secure.methods.fed2gnn import check_services
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.dp_round import RandomBytes
from fedgl_secure.simulation.experiment import resolve_device
from fedgl_secure.wire.broadcast import decode_broadcast, model_label, stage_label


class BankWorker:
    """One bank's side of every round, pulling work from the aggregator."""

    def __init__(
        self,
        *,
        name: str,
        federation: str,
        client_index: int,
        config: ExperimentConfig,
        graph: GraphDataset,
        aggregator: AggregatorPort,
        public_context: bytes,
        policy: Policy,
        signing_key: Ed25519PrivateKey,
        pseudonym_key: bytes,
        broadcast_key: Ed25519PublicKey,
        poll_seconds: float = 0.2,
        state_dir: Path | None = None,
        random_bytes: RandomBytes | None = None,
        phase_inputs: Mapping[str, object] | None = None,
    ) -> None:
        """``state_dir`` keeps the union index, the final model and (under DP) the ledger; it is required
        when the policy has DP. ``random_bytes`` replaces the CSPRNG for the noise (tests only). The
        public w_max of the DP step comes with the union index. ``phase_inputs``: what the bank's side of a declared
        set-up phase needs from the node's wiring, by phase name (Fed²GNN's exchange: this bank's share of it and
        who it is in it; the bank then enrols the reconstructed graph instead of ``graph``). ``broadcast_key``: the
        aggregator's public key, which every broadcast this bank is served must be signed with."""
        self.name = name
        self.federation = federation
        self.client_index = client_index
        config = apply_in_method_policy(config, policy)  # a node mechanism inside its method: see BankReleases
        self.config = config
        self.graph_data = graph
        self.aggregator = aggregator
        self.context = ckks.load_public_context(public_context)
        self.fingerprint = ckks.fingerprint(public_context)
        self.policy = policy
        self.signing_key = signing_key
        self.pseudonym_key = pseudonym_key
        self.broadcast_key = broadcast_key
        self.poll_seconds = poll_seconds
        check_services(config, bank_sources=config.dataset == BANK_SOURCES)  # what of Fed²GNN the services run
        check_self_training_services(config)  # as the aggregator: refused, not silently ignored
        self.method = build_method(config)
        self.stages = method_stages(self.method)
        self.log = get_logger(node=name, role="bank")
        self.rounds_done: list[int] = []
        self.finished = threading.Event()
        self.withdrawn = False  # the aggregator has recorded this bank's withdrawal
        self.state_dir = None if state_dir is None else Path(state_dir)
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        self.releases = BankReleases(
            name=name,
            client_index=client_index,
            config=config,
            policy=policy,
            method=self.method,
            state_dir=self.state_dir,
            random_bytes=random_bytes,
            log=self.log,
        )
        parts = BankParts(
            name=name,
            federation=federation,
            client_index=client_index,
            config=config,
            policy=policy,
            aggregator=aggregator,
            context=self.context,
            fingerprint=self.fingerprint,
            signing_key=signing_key,
            broadcast_key=broadcast_key,
            state_dir=self.state_dir,
            poll_seconds=poll_seconds,
            log=self.log,
        )
        self.phases = bank_phases(declared_phases(config, policy), parts, phase_inputs)
        self.uploads = BankUploads(
            name=name,
            context=self.context,
            public_context=public_context,
            policy=policy,
            signing_key=signing_key,
            aggregator=aggregator,
        )

    def run(self, stop: threading.Event) -> None:
        """(The declared set-up phases' part before enrolment first, e.g. Fed²GNN's exchange.) Enrol, then take part
        in every round this bank is invited to, until the federation finishes."""
        try:
            for phase in self.phases:
                self.graph_data = phase.before_enrolment(self.graph_data, stop)
        except StopRequested:
            return
        pseudonyms = pseudonymise(self.pseudonym_key, self.graph_data.node_ids.tolist())
        features, classes = int(self.graph_data.features.shape[1]), int(self.graph_data.num_classes)
        try:
            retry_until_ready(
                lambda: self.aggregator.enrol(features, classes, pseudonyms), "the aggregator", self.log, stop=stop
            )
            index = retry_until_ready(
                self._index_when_ready, "the union index", self.log, retry_on=(_NotReady,), stop=stop
            )
        except StopRequested:
            return  # told to stop before the federation started: nothing to save
        size, positions = index.num_global_nodes, index.positions
        if positions.shape != (self.graph_data.num_nodes,) or positions.min() < 0 or positions.max() >= size:
            raise ConfigError(
                f"the aggregator's union index does not fit this bank's {self.graph_data.num_nodes} nodes"
            )
        self.releases.privacy_normaliser = client_weight(index.max_bank_nodes)
        if self.state_dir is not None:
            save_union_index(self.state_dir, size, positions)
        device = resolve_device(self.config.device)
        graph = GraphTensors.from_graph(
            self.graph_data, positions, size, device, self.config.training.normalize_features
        )
        training = self.config.training
        features = graph.features.shape[1]
        model = method_model(self.method, features, training.hidden, graph.num_classes, training.dropout)
        try:
            private = self.releases.private_graph(graph, self.graph_data, stop, self.phases)
        except StopRequested:
            return  # stopped during the consortium label release: what it drew is on disk
        trainer = LocalTrainer(self.client_index, private, training, self.config.seed, model)
        if self.releases.privacy is not None:
            self.releases.privacy.attach_training(self.client_index, trainer)
            self.releases.restore_method_release(trainer)
        evaluator = method_model(self.method, features, training.hidden, graph.num_classes, 0.0).to(device)
        num_parameters = int(trainer.model.flat_parameters().numel())
        self.log.info("bank.ready", nodes=graph.num_nodes, num_global_nodes=size)
        session = Session(trainer, evaluator, graph, num_parameters)
        while not stop.is_set():
            view = poll_round(self.aggregator, self.log, stop, self.poll_seconds, "round.poll_failed")
            if view is None:
                continue
            if self._withdrawal_pending():
                self._withdraw()
            if view.phase == "finished":
                self._report_final(session, view.latest_version)
                self._keep_final_model(stop)
                self.finished.set()
                self.log.info("bank.finished", rounds=len(self.rounds_done), stopped_reason=view.stopped_reason)
                return
            if view.phase == "open" and self.name in view.participants and stage_key(view) not in session.done:
                self._take_part(session, view)
                continue
            stop.wait(self.poll_seconds)

    def _keep_final_model(self, stop: threading.Event) -> None:
        """Save the federation's final model for ``fedgl-secure predict``, once the aggregator has fixed it
        (after every bank's report of the last version, or its grace period); a failure only costs a
        download later (predict fetches it then)."""
        if self.state_dir is None:
            return
        deadline = time.monotonic() + FINAL_GRACE_SECONDS + 30.0
        try:
            while (version := self.aggregator.current_round().final_version) is None:
                if time.monotonic() > deadline or stop.is_set():
                    self.log.warning("final_model.not_fixed", detail="predict will fetch it from the aggregator")
                    return
                stop.wait(self.poll_seconds)
            served = self._verified(model_label(version), self.aggregator.model(version))
            save_final_model(self.state_dir, self.federation, version, served)
            self.log.info("bank.final_model_saved", version=version)
        except (FedGLError, OSError) as error:
            self.log.warning("final_model.not_saved", error=str(error)[:300])

    def _withdrawal_pending(self) -> bool:
        """The budget is spent but the aggregator has not confirmed the withdrawal yet."""
        bank = self.releases.bank_privacy
        return bank is not None and bank.stopped_round is not None and not self.withdrawn

    def _withdraw(self) -> None:
        """Tell the aggregator this bank takes no further part (budget spent); after a failure the next poll retries."""
        stopped = self.releases.bank_privacy.stopped_round
        try:
            answer = self.aggregator.withdraw(stopped, BUDGET_EXHAUSTED)
        except (
            FedGLError,
            OSError,
        ) as error:  # conflicts, service and transport errors: retried at the next poll
            self.log.warning("privacy.withdraw_failed", round=stopped, error=str(error)[:300])
            return
        self.withdrawn = True
        self.log.warning("bank.withdrawn", round=stopped, reason=BUDGET_EXHAUSTED, duplicate=answer.duplicate)

    def _index_when_ready(self):
        try:
            return self.aggregator.index()
        except ProtocolConflict as conflict:
            if conflict.code == "not-ready":
                raise _NotReady(conflict.detail) from None
            raise

    def _evaluate(self, session: Session, broadcast: Broadcast) -> tuple[tuple[int, int, int, int], np.ndarray | None]:
        """Counts (validation correct/total, test correct/total) and, with a positive class, the score
        histograms of validation and test customers by label (``4 × bins``; never a customer's score)."""
        session.evaluator.load_flat_parameters(broadcast.weights)
        session.evaluator.eval()
        with torch.no_grad():
            adjacency = self.method.evaluation_adjacency(session.graph, broadcast)
            logits = session.evaluator(session.graph.features, adjacency).logits
        graph = session.graph
        counts = (*accuracy(logits, graph.labels, graph.val_mask), *accuracy(logits, graph.labels, graph.test_mask))
        positive = self.config.evaluation.scored_class(graph.num_classes)
        if positive is None:
            return counts, None
        histograms = np.concatenate(
            [score_histogram(logits, graph.labels, mask, positive) for mask in (graph.val_mask, graph.test_mask)]
        )
        return counts, histograms

    def _download(self, session: Session, version: int) -> Broadcast:
        return self._decode(session, version, self._verified(model_label(version), self.aggregator.model(version)))

    def _stage(self, view: RoundResponse) -> str:
        """The stage ``view`` opens; an open round that names none is the method's first (an aggregator that
        runs single-stage rounds only)."""
        return view.stage if view.stage is not None else self.stages[0]

    def _download_stage(self, session: Session, round_number: int, stage: str) -> Broadcast:
        """The broadcast published after ``stage`` of round ``round_number``, checked like a model version."""
        served = self.aggregator.stage_model(round_number, stage)
        return self._decode(session, round_number, self._verified(stage_label(round_number, stage), served))

    def _verified(self, label: str, served: Served) -> bytes:
        """The body of a broadcast this bank was served, once its signature is the aggregator's over it, for this
        bank (``crypto/broadcast_signature.py``); else :class:`ReceiptError`."""
        verify_broadcast(self.broadcast_key, self.federation, self.name, label, served.body, served.signature)
        return served.body

    def _decode(self, session: Session, version: int, data: bytes) -> Broadcast:
        """``data`` as a broadcast of this federation's shapes (a wrong size or kind is refused, not trained on)."""
        return decode_broadcast(
            version,
            data,
            session.num_parameters,
            session.graph.num_global_nodes,
            self.config.self_supervision.neighbors,
            rows=session.graph.positions,  # served its projection only: its own rows of Ȳ and Ā
        )

    def _report(self, session: Session, version: int, broadcast: Broadcast) -> None:
        if version in session.reported:
            return
        self.aggregator.report(version, *self._evaluate(session, broadcast))
        session.reported.add(version)

    def _report_final(self, session: Session, version: int | None) -> None:
        if version is None or version in session.reported:
            return
        try:
            self._report(session, version, self._download(session, version))
        except (FedGLError, OSError) as error:
            self.log.warning("report.failed", version=version, error=str(error)[:300])

    def _take_part(self, session: Session, view: RoundResponse) -> None:
        log = self.log.bind(round=view.round, base_version=view.base_version)
        # encrypted once per (round, nonce, stage): a retry after a broken connection resends the same
        # bytes (no download, no retraining), which the aggregator accepts as a repeat instead of a
        # conflicting second upload
        key = stage_key(view)
        if view.context_fingerprint != self.fingerprint or view.federation != self.federation:
            log.error(
                "round.foreign",
                context=view.context_fingerprint[:12],
                ours=self.fingerprint[:12],
                federation=view.federation,
            )
            session.done.add(key)
            return
        if view.policy_sha256 != self.policy.digest:
            log.error(
                "round.foreign_policy",
                detail=f"the aggregator runs policy {view.policy_sha256[:12]}…, this bank {self.policy.digest[:12]}…; "
                "every node must run the same policy file",
            )
            session.done.add(key)
            return
        if self.releases.bank_privacy is not None and self.releases.bank_privacy.stopped_round is not None:
            session.done.add(key)  # budget spent: withdrawn (or retrying it at each poll)
            return
        started = time.perf_counter()
        timer = PhaseTimer()
        try:
            if key in session.uploads:
                uploaded = self.uploads.send(view.round, iter(session.uploads[key]), [], timer)
            else:
                encrypted = self._prepare_uploads(session, view, log, timer)
                if encrypted is None:
                    return
                sent: list[Upload] = []
                try:  # each kind goes out as soon as it is encrypted, while later ones are still encrypting
                    uploaded = self.uploads.send(view.round, encrypted, sent, timer)
                finally:
                    sent.extend(encrypted)  # a retry must resend these very bytes, never re-encrypt
                    if len(sent) == len(view.shapes):
                        session.uploads = {key: sent}
        except EncryptionRefused as refused:  # deterministic (e.g. a value outside the packed range): retrying
            # would fail again, after the kinds already sent: this bank sits the round out (fail closed)
            log.error("round.encryption_refused", error=str(refused)[:300])
            session.done.add(key)
            return
        except ProtocolConflict as conflict:  # the round closed (deadline) or moved on: wait for the next
            log.warning("round.upload_refused", code=conflict.code, detail=conflict.detail[:300])
            session.done.add(key)
            return
        except (FedGLError, OSError) as error:  # an unreachable aggregator included: the round reopens
            log.warning("round.failed", error=str(error)[:300])
            time.sleep(self.poll_seconds * 5)
            return
        session.done.add(key)
        if self._stage(view) == self.stages[-1]:
            self.rounds_done.append(view.round)
        log.info(
            "round.uploaded",
            bytes=uploaded,
            values=sum(int(np.prod(shape)) for shape in view.shapes.values()),  # bytes per value in benchmarks
            seconds=round(time.perf_counter() - started, 3),
            phases=timer.seconds(),
        )

    def _prepare_uploads(
        self, session: Session, view: RoundResponse, log, timer: PhaseTimer
    ) -> Iterator[Upload] | None:
        """Train from the broadcast the round's stage starts from and start encrypting the (released)
        contribution of that stage's kinds (an iterator of uploads, :meth:`BankUploads.encrypt_kinds`); None once the
        privacy budget is spent (the bank then withdraws), or for a stage this bank's method does not have.
        ``timer`` gets the download, evaluation, training and encryption seconds.

        The first stage starts from the model version ``base_version`` (which the bank also evaluates and
        reports); a later stage from the broadcast the aggregator published after the stage before it."""
        stage = self._stage(view)
        if stage not in self.stages:
            log.error("round.unknown_stage", stage=stage, stages=list(self.stages))
            session.done.add(stage_key(view))
            return None
        position = self.stages.index(stage)
        with timer.phase("download"):
            if position == 0:
                broadcast = self._download(session, view.base_version)
            else:
                broadcast = self._download_stage(session, view.round, self.stages[position - 1])
        if position == 0:
            with timer.phase("evaluation"):
                self._report(session, view.base_version, broadcast)
        # a reopened round (or stage) restarts from the same state, so it yields the same contribution
        state = (view.base_version, stage)
        if state in session.snapshots:
            restore(session.trainer, session.snapshots[state])
        else:  # the states of earlier versions are never needed again
            kept = {key: value for key, value in session.snapshots.items() if key[0] == view.base_version}
            session.snapshots = {**kept, state: snapshot(session.trainer)}
        with timer.phase("training"):
            privacy = self.releases.privacy
            if privacy is not None and privacy.recomputes_node_terms:
                # under DP (single-stage methods only: check_stages) P_k and H_k are computed once, with W̄,
                # by the DP step (protect_contributions)
                contribution = self.method.client_contribution(session.trainer, broadcast, with_node_terms=False)
            else:
                contribution = stage_contribution(self.method, stage, session.trainer, broadcast)
            self.releases.keep_method_release(session, view)
            contribution = self.releases.release(session, view, broadcast, contribution)
        if contribution is not None:
            expected = {kind: tuple(shape) for kind, shape in view.shapes.items()}
            actual = {kind: tuple(tensor.shape) for kind, tensor in contribution.items()}
            if actual != expected:
                raise ConfigError(f"round {view.round} expects uploads {expected}, this bank computes {actual}")
        if contribution is None:
            log.warning(
                "privacy.budget_exhausted",
                stopped_round=self.releases.bank_privacy.stopped_round,
                action="stop-contributing",
                detail="this bank uploads nothing more and withdraws from the federation",
            )
            session.done.add(stage_key(view))
            self._withdraw()
            return None
        ticket = ticket_for(view, self.policy.digest)
        return self.uploads.encrypt_kinds(ticket, contribution, broadcast.weights)

    def close(self) -> None:
        """Stop the encryption pool's workers (the node calls it when it shuts down)."""
        self.uploads.close()


class _NotReady(FedGLError):
    pass
