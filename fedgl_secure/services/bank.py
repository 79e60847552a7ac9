"""A bank node: its own graph slice, local training, and encrypted, receipted uploads (DESIGN §5.3 step 2).

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
the same starting state — model, optimiser moments and dropout stream are restored from a
snapshot — so a reopened round gives the same contribution as the first attempt would have,
and a consortium run reproduces the in-process simulation with the same seed.

Under a policy with DP the bank applies it exactly as the simulation does
(:mod:`fedgl_secure.privacy.dp_round`), before encryption: its graph is prepared once (edge DP,
degree bound) and its training and validation labels released once (label DP: randomised response, or
RRWithPrior in stages with the bank's own prior, or with the prior all banks fit together in the aggregator's
label-prior rounds, ``prior = "consortium-sgc"``: :mod:`~fedgl_secure.services.bank_label_prior`), both
before round 1 and kept in its state directory (``privacy-graph.npz``, ``privacy-labels.npz``) so that a
restart reuses them instead of drawing (and paying for) them again; each contribution goes through
its :class:`~fedgl_secure.privacy.dp_round.BankPrivacy` step (P/H with the public W̄, clipping, its
noise share, the ``w_max`` normalisation), and its
:class:`~fedgl_secure.privacy.accounting.PrivacyLedger` is saved to ``<state_dir>/privacy-ledger.json``
after every recorded round, before anything is uploaded, and loaded at start — a restart never
refills the budget. ``w_max`` is public: it is the largest bank's size in the consortium's
experiment (the slices every party derives from the shared config, as in the simulation). Once a
round would exceed the budget the bank stops contributing for good: it logs
``privacy.budget_exhausted``, uploads nothing, and **withdraws** (``POST /v1/withdraw``, reason
``privacy-budget-exhausted``, retried at every poll until the aggregator has it), so the aggregator
stops inviting it and ends the run with a ``stopped_reason`` once too few banks are left; the bank
keeps polling until the federation has finished. A channel with ``noise = "central"`` gets no share
from the bank (the key authority adds its noise to the decrypted sum) but is recorded in the ledger
like any other release. The noised release of a round is kept for a reopened attempt of the same
round (one decryption per round number at the key authority), so reopening neither charges the
budget again nor re-draws the noise.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fastapi import Depends, FastAPI
from torch import nn

from fedgl_secure.crypto import ckks, threshold
from fedgl_secure.crypto.broadcast_signature import verify_broadcast
from fedgl_secure.crypto.centring import bank_term, wire_reference
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.encryption_pool import EncryptionPool, term_chunks
from fedgl_secure.crypto.partial_decryption import BankDecryptor
from fedgl_secure.crypto.upload import RoundTicket, Upload, finite_term, make_upload, sign_upload
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.partition import louvain_clients
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.sampling import make_clients
from fedgl_secure.data.sources.bank_data import BankData
from fedgl_secure.engine.aggregation import client_weight, normalise_contribution
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors, accuracy
from fedgl_secure.engine.score_histograms import score_histogram
from fedgl_secure.engine.self_training import check_services as check_self_training_services
from fedgl_secure.errors import CiphertextError, ConfigError, FedGLError
from fedgl_secure.fileio import write_arrays_atomically, write_atomically
from fedgl_secure.log import configure_logging, get_logger
from fedgl_secure.methods import apply_in_method_policy, build_method, in_method_mechanism
from fedgl_secure.methods.base import Broadcast, method_model, method_stages, stage_contribution
from fedgl_secure.methods.fed2gnn import BankReconstruction, bank_reconstruction, check_services
from fedgl_secure.methods.fed2gnn_relay import BankIdentity, ExchangeKeyFile, run_bank_exchange
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy, load_policy
from fedgl_secure.privacy.accounting import EDGES, LABELS, PrivacyLedger
from fedgl_secure.privacy.dp_round import FederationPrivacy, RandomBytes, releases_labels_together
from fedgl_secure.privacy.label_release import LabelRelease, StagedRelease
from fedgl_secure.privacy.release_schedule import setup_releases
from fedgl_secure.seeding import numpy_stream
from fedgl_secure.services import http_conventions
from fedgl_secure.services.aggregator import (
    BUDGET_EXHAUSTED,
    FINAL_GRACE_SECONDS,
    ProtocolConflict,
)
from fedgl_secure.services.aggregator_service import AggregatorClient, RoundResponse, Served, ticket_for
from fedgl_secure.services.bank_keys import PartialDecryptionWorker, ensure_key_share
from fedgl_secure.services.bank_label_prior import (
    STAGED_LABELS_FILE,
    LabelPriorParticipant,
    load_staged_release,
    poll_round,
    save_staged_release,
)
from fedgl_secure.services.config import BANK_SOURCES, ConsortiumConfig, NodeConfig, NodeRole, PkiLayout
from fedgl_secure.services.kept_release import SETTINGS, keep_release, take_back_release
from fedgl_secure.services.key_authority_service import KeyAuthorityClient, read_operator_secret
from fedgl_secure.services.pki import load_pseudonym_key, load_signing_key, load_signing_public_keys
from fedgl_secure.services.pseudonyms import pseudonymise
from fedgl_secure.services.retry import StopRequested, retry_until_ready
from fedgl_secure.services.runtime import serve_with_worker
from fedgl_secure.services.tls import Caller, caller_identity, make_http_client
from fedgl_secure.simulation.experiment import protect_contributions, resolve_device
from fedgl_secure.wire.broadcast import decode_broadcast, model_label, stage_label

LEDGER_FILE = "privacy-ledger.json"
PREPARED_GRAPH_FILE = "privacy-graph.npz"  # the graph after edge DP, kept so a restart does not re-draw it
LABEL_RELEASE_FILE = "privacy-labels.npz"  # the labels after label DP (and their likelihood rows), likewise
METHOD_RELEASE_FILE = "privacy-method-release.npz"  # what a method released inside the bank once (GAP's hops)
INDEX_FILE = "union-index.npz"  # M and this bank's positions in the union index (for scoring after the run)
FINAL_MODEL_FILE = "final-model.npz"  # the federation's final model (the broadcast bytes), for predict
FINAL_META_FILE = "final-model.json"  # which version that is, and of which federation
EXCHANGE_FILE = "fed2gnn-exchange.npz"  # Fed²GNN: the sums the set-up exchange gave this bank (a restart reuses them)
EXCHANGE_KEY_FILE = "fed2gnn-exchange.key"  # and its key for the exchange under way (a restart republishes it)
EXCHANGE_TIMEOUT_SECONDS = 3600.0  # how long a bank retries the exchange while the aggregator is unreachable


@dataclass(frozen=True)
class _TrainerState:
    model: dict
    optimizer: dict
    generator: torch.Tensor


def _snapshot(trainer: LocalTrainer) -> _TrainerState:
    return _TrainerState(
        copy.deepcopy(trainer.model.state_dict()),
        copy.deepcopy(trainer.optimizer.state_dict()),
        trainer.generator.get_state(),
    )


def _restore(trainer: LocalTrainer, state: _TrainerState) -> None:
    trainer.model.load_state_dict(state.model)
    trainer.optimizer.load_state_dict(copy.deepcopy(state.optimizer))
    trainer.generator.set_state(state.generator)


def consortium_slices(config: ExperimentConfig, data_root: str | None) -> list[GraphDataset]:
    """Research mode (``data = "benchmark-slices"``): every bank's graph, in the consortium's bank order
    (slice k of the experiment's dataset for bank k). Real banks read their own tables
    (:func:`bank_graph`)."""
    # one proportion (or Louvain client) per bank is checked when the consortium file is loaded (ConsortiumConfig)
    dataset = load_dataset(config.dataset, data_root, seed=config.seed, split=config.data)
    if config.federation.partition == "louvain":  # disjoint banks, as Federation.build makes them
        federation = config.federation
        return louvain_clients(
            dataset, federation.num_clients, config.seed, federation.louvain_balance, federation.louvain_delta
        )
    return make_clients(dataset, config.federation.proportions, config.seed, config.federation.overlap)


def bank_index(node: NodeConfig, consortium: ConsortiumConfig) -> int:
    """This bank's place in the consortium's bank order (its client index: slice, Louvain client, exchange)."""
    return [bank.name for bank in consortium.banks].index(node.name)


def bank_graph(node: NodeConfig, consortium: ConsortiumConfig) -> BankData:
    """This bank's own customer graph: its ``[bank.data]`` tables checked against the consortium's schema
    (bank-sources), or its slice of the benchmark dataset (research mode; no own customer ids then)."""
    config = consortium.experiment_config()
    if consortium.bank_sources:
        # imported here: the tables' readers load pyarrow and SQLAlchemy, which a benchmark slice never needs
        from fedgl_secure.data.sources.bank_graph import load_bank_data

        return load_bank_data(node.bank.data, consortium.feature_schema, name=node.name, seed=config.seed)
    client_index = bank_index(node, consortium)
    graph = consortium_slices(config, node.bank.data_root)[client_index]
    return BankData(graph, graph.node_ids.astype(str), None)


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
        aggregator: AggregatorClient,
        public_context: bytes,
        policy: Policy,
        signing_key: Ed25519PrivateKey,
        pseudonym_key: bytes,
        broadcast_key: Ed25519PublicKey,
        poll_seconds: float = 0.2,
        state_dir: Path | None = None,
        random_bytes: RandomBytes | None = None,
        reconstruction: tuple[BankReconstruction, BankIdentity] | None = None,
    ) -> None:
        """``state_dir`` keeps the union index, the final model and (under DP) the ledger; it is required
        when the policy has DP. ``random_bytes`` replaces the CSPRNG for the noise (tests only). The
        public w_max of the DP step comes with the union index. ``reconstruction``: Fed²GNN's set-up (this
        bank's share of the exchange and who it is in it), run before enrolment; ``graph`` is then replaced
        by the reconstructed graph. ``broadcast_key``: the aggregator's public key, which every broadcast this
        bank is served must be signed with."""
        self.name = name
        self.federation = federation
        self.client_index = client_index
        # a node mechanism inside its method (the class sums) fixes the method's ε, δ and rounds from the policy,
        # and its releases (ledger channels, what each round releases) replace the per-upload DP step
        config = apply_in_method_policy(config, policy)
        in_method = in_method_mechanism(policy)
        self.method_releases = None if in_method is None else in_method.releases(config)
        self.config = config
        self.graph_data = graph
        self.aggregator = aggregator
        self.context = ckks.load_public_context(public_context)
        # a large upload's kinds are encrypted on worker processes, started by the first such upload
        self.encryption = EncryptionPool(public_context, policy.he, workers=max(1, min(4, os.cpu_count() or 1)))
        self.fingerprint = ckks.fingerprint(public_context)
        self.policy = policy
        self.signing_key = signing_key
        self.pseudonym_key = pseudonym_key
        self.broadcast_key = broadcast_key
        self.poll_seconds = poll_seconds
        check_services(config, bank_sources=config.dataset == BANK_SOURCES)  # what of Fed²GNN the services run
        check_self_training_services(config)  # as the aggregator: refused, not silently ignored
        if (config.method == "fed2gnn") != (reconstruction is not None):
            raise ConfigError(f"{name}: method {config.method!r} and the Fed²GNN set-up must come together")
        self.reconstruction = reconstruction
        self.method = build_method(config)
        self.stages = method_stages(self.method)
        self.log = get_logger(node=name, role="bank")
        self.rounds_done: list[int] = []
        self.finished = threading.Event()
        self.withdrawn = False  # the aggregator has recorded this bank's withdrawal
        self.privacy: FederationPrivacy | None = None
        self.ledger_path: Path | None = None
        self.privacy_normaliser: float | None = None  # w_max, from the union index
        self.state_dir = None if state_dir is None else Path(state_dir)
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        if policy.has_dp:
            check_consortium(policy, config)
            if self.state_dir is None:
                raise ConfigError(f"{name}: a DP policy needs a state directory (for the privacy ledger)")
            self.privacy = FederationPrivacy(policy, random_bytes=random_bytes)
            self.ledger_path = self.state_dir / LEDGER_FILE

    @property
    def bank_privacy(self):
        """This bank's :class:`~fedgl_secure.privacy.dp_round.BankPrivacy` (None without DP or before start)."""
        return None if self.privacy is None else self.privacy.banks.get(self.client_index)

    def _private_graph(self, graph: GraphTensors, stop: threading.Event) -> GraphTensors:
        """The graph the bank trains on: as it is, or under DP prepared once as the simulation does
        (:meth:`FederationPrivacy.setup_bank`, :meth:`FederationPrivacy.private_graph`: edge DP, degree bound,
        the label release), with the ledger of earlier runs of this bank. What was drawn at the source is kept
        in the state directory and reused on restart, never drawn (and paid for) again. With the consortium prior
        the labels are released in the label-prior rounds before round 1 (:meth:`_release_together`)."""
        if self.privacy is None:
            return graph
        ledger = PrivacyLedger.load(self.ledger_path) if self.ledger_path.exists() else None
        if ledger is not None and ledger.bank != self.name:
            raise ConfigError(f"{self.ledger_path}: the ledger of {ledger.bank!r}, not of {self.name!r}")
        if ledger is None and self.method_releases is not None:  # a ledger of the method's own channels
            channels, _ = self.method_releases
            ledger = PrivacyLedger(self.name, channels=tuple(channels))
        graph_path = self.state_dir / PREPARED_GRAPH_FILE
        releases_edges = any(release.channel == EDGES for release in setup_releases(self.policy))
        prepared = None
        if releases_edges and ledger is not None and graph_path.exists():
            # already drawn and paid for: never re-drawn on restart, and refused under other edge settings
            prepared = load_prepared_graph(graph_path, edge_release_settings(self.policy), graph.num_nodes, self.log)
        adjacency = self.privacy.setup_bank(
            self.client_index,
            self.name,
            self.privacy_normaliser,
            self.graph_data.adjacency(),
            numpy_stream(self.config.seed, "privacy", "degree", self.client_index),
            ledger=ledger,
            prepared=prepared,
            read_features=graph.features.to_scipy,  # read only by a weighting that needs them
        )
        if releases_edges and prepared is None:
            save_prepared_graph(graph_path, adjacency, edge_release_settings(self.policy))
        kept = self._kept_labels(graph, ledger)
        if kept is None and releases_labels_together(self.policy):
            kept = self._release_together(stop, graph, adjacency)
        private = self.privacy.private_graph(self.client_index, graph, adjacency, kept)
        if self.policy.dp.labels.enabled and kept is None:  # released just now: on disk before the ledger records it
            release = LabelRelease(private.labels.cpu().numpy(), self.bank_privacy.label_likelihood)
            save_label_release(self.state_dir / LABEL_RELEASE_FILE, release, release_settings(self.policy))
        self._save_ledger()
        spent = self.bank_privacy.ledger.epsilon(self.policy.budget.delta, self.policy.budget.accountant)
        self.log.info(
            "privacy.ready", epsilon_spent=spent, budget=self.policy.budget.epsilon, resumed=ledger is not None
        )
        return private

    def _kept_labels(self, graph: GraphTensors, ledger: PrivacyLedger | None) -> np.ndarray | None:
        """Under label DP, the labels this bank released in an earlier run (``privacy-labels.npz``), taken back
        without a new draw; None when it has released none yet (:meth:`FederationPrivacy.private_graph` then
        releases them once, recorded at round 0, and :meth:`_private_graph` stores them before the ledger).

        A release on disk that the ledger does not record (stopped between the two writes) is recorded now, once;
        a ledger that records a release whose labels are gone refuses to start: drawing again would spend ε twice.
        """
        settings = self.policy.dp.labels
        if not settings.enabled:
            return None
        path = self.state_dir / LABEL_RELEASE_FILE
        recorded = ledger is not None and any(release.channel == LABELS for release in ledger.releases)
        if not path.exists():
            if recorded and not (self.state_dir / STAGED_LABELS_FILE).exists():  # else: a release in progress
                raise ConfigError(
                    f"{path}: missing, but {self.ledger_path} records this bank's label release (dp.labels): "
                    "drawing the labels again would spend ε a second time; restore the file, or start the bank "
                    "with a new state directory and a new budget"
                )
            return None
        release = load_label_release(path, release_settings(self.policy), graph.num_nodes)
        bank = self.bank_privacy
        labels = bank.restore_label_release(release) if recorded else bank.accept_label_release(release)
        self.log.info("privacy.labels_reused", recorded_before=recorded)
        return labels

    def _release_together(self, stop: threading.Event, graph: GraphTensors, adjacency: sp.spmatrix) -> np.ndarray:
        """The labels released with the consortium prior (:mod:`~fedgl_secure.services.bank_label_prior`): the
        release in progress is drawn (stage 1) or taken back from disk, recorded in the ledger once (before any
        upload reads it), completed in the aggregator's label-prior rounds and kept as ``privacy-labels.npz``."""
        staged_path = self.state_dir / STAGED_LABELS_FILE
        settings = release_settings(self.policy)
        labels = self.policy.dp.labels
        random_bytes = self.privacy.random_bytes
        if staged_path.exists():
            release = load_staged_release(staged_path, self.policy, settings, graph.num_nodes, random_bytes)
            self.log.info("privacy.labels_in_progress", stages_released=release.released)
        else:
            release = StagedRelease(
                graph.labels.cpu().numpy(),
                graph.train_mask.cpu().numpy(),
                graph.val_mask.cpu().numpy(),
                graph.num_classes,
                float(labels.epsilon),
                labels.effective_stages,
                labels.effective_stage_order,
                labels.effective_prior_temperature,
                _random_bytes=random_bytes,
            )
            save_staged_release(staged_path, release, settings)  # on disk before the ledger records it
        if self.bank_privacy.record_label_release():
            self._save_ledger()
        participant = LabelPriorParticipant(
            name=self.name,
            federation=self.federation,
            aggregator=self.aggregator,
            context=self.context,
            fingerprint=self.fingerprint,
            policy=self.policy,
            signing_key=self.signing_key,
            broadcast_key=self.broadcast_key,
            normaliser=self.privacy_normaliser,
            release=release,
            release_path=staged_path,
            settings=settings,
            adjacency=adjacency,
            features=graph.features.to_scipy(),
            num_classes=graph.num_classes,
            log=self.log,
            poll_seconds=self.poll_seconds,
        )
        result = participant.run(stop)
        save_label_release(self.state_dir / LABEL_RELEASE_FILE, result, settings)
        staged_path.unlink()
        return self.bank_privacy.restore_label_release(result)

    def _save_ledger(self) -> None:
        """Write the ledger (:meth:`PrivacyLedger.save` replaces the file atomically: a torn file would
        fail the next start, closed but needlessly)."""
        self.bank_privacy.ledger.save(self.ledger_path)

    def _release(
        self, session: _Session, view: RoundResponse, broadcast: Broadcast, contribution: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor] | None:
        """The contribution as uploaded: normalised by the public w_max (:func:`normalise_contribution`), after
        the bank's DP step when the policy has DP (which normalises alike), or None once its budget is spent.

        A round's release is made once: a reopened attempt of the same round reuses it.
        """
        if self.privacy is None:
            return normalise_contribution(contribution, self.privacy_normaliser)
        key = (view.round, view.base_version)
        if key not in session.released:
            k = self.client_index
            if self.method_releases is not None:  # the method's own release, recorded; no per-upload DP step
                releases = self._method_releases_of(session, view)
                protected = self.bank_privacy.release_in_method(view.round, contribution, releases)
                released = {} if protected is None else {k: protected}
            else:
                released = protect_contributions(
                    self.privacy, self.method, {k: session.trainer}, broadcast, view.round, {k: contribution}
                )
            if k not in released:
                return None
            self._save_ledger()  # recorded, and on disk, before anything leaves the bank
            session.released = {key: released[k]}
        return session.released[key]

    def _method_releases_of(self, session: _Session, view: RoundResponse) -> list:
        """What this round's contribution released inside the method, as records of round number ``view.round``
        (each round number is decrypted once; a retry of the same training round under a new number is a new
        release): what the method says this bank made (``bank_releases``: GAP's hops only in the call that drew
        them), else the method's schedule for the training round (``base_version + 1``)."""
        training_round = view.base_version + 1
        made = getattr(self.method, "bank_releases", None)
        if made is not None:
            releases = made(session.trainer, training_round)
        else:
            _, releases_of_round = self.method_releases
            releases = releases_of_round(training_round)
        return [release.model_copy(update={"round": view.round}) for release in releases]

    def _keep_method_release(self, session: _Session, view: RoundResponse) -> None:
        """A release the method made inside the bank and must never draw again (GAP's hops), written to the state
        directory with its round number once it exists — before the ledger records it and before any upload."""
        kept = getattr(self.method, "kept_release", None)
        path = None if self.privacy is None else self.state_dir / METHOD_RELEASE_FILE  # (a DP policy has a state_dir)
        if kept is None or path is None or path.exists():  # kept once: not even copied out again
            return
        arrays = kept(session.trainer)
        if arrays:
            arrays = {name: value.numpy() for name, value in arrays.items()}
            keep_release(path, self.method.kept_release_settings(), round=np.array(view.round), **arrays)
            self.log.info("privacy.method_release_kept", round=view.round, arrays=sorted(arrays))

    def _restore_method_release(self, trainer: LocalTrainer) -> None:
        """Take back what :meth:`_keep_method_release` kept (a restarted bank): never drawn again; one kept but not
        yet recorded (stopped between the two writes) is recorded now, once. A ledger that records such a release
        whose file is gone refuses to start: drawing it again would be a second release."""
        restore = getattr(self.method, "restore_kept_release", None)
        if restore is None or self.bank_privacy is None:
            return
        path = self.state_dir / METHOD_RELEASE_FILE
        channels = set(self.method.kept_release_channels)
        recorded = any(release.channel in channels for release in self.bank_privacy.ledger.releases)
        if not path.exists():
            if recorded:
                raise ConfigError(
                    f"{path}: missing, but {self.ledger_path} records this bank's {sorted(channels)} release: drawing "
                    "it again would be a second release; restore the file, or start the bank with a new state "
                    "directory and a new budget"
                )
            return
        arrays = take_back_release(
            path, self.method.kept_release_settings(), f"a {self.config.method} release", self.config.method
        )
        round_number = int(arrays.pop("round"))
        restore(trainer, {name: torch.from_numpy(array) for name, array in arrays.items()})
        records = self.method.kept_release_records(round_number)
        if not recorded and self.bank_privacy.record_releases(round_number, records):
            self._save_ledger()
        self.log.info("privacy.method_release_reused", round=round_number, recorded_before=recorded)

    def _reconstruct(self, stop: threading.Event) -> GraphDataset:
        """Fed²GNN's set-up: the bank-to-bank exchange through the aggregator (``methods/fed2gnn_relay.py``), then the
        local reconstruction. The sums are kept in the state directory, so a restarted bank rebuilds the same graph
        without a second exchange."""
        setup, identity = self.reconstruction
        saved = None if self.state_dir is None else load_exchange_sums(self.state_dir, self.config.fed2gnn.hops)
        if saved is not None:
            boundary, received = saved
            self.log.info("fed2gnn.exchange_reused", boundary=int(boundary.size))
        else:

            def wait() -> None:
                if stop.wait(self.poll_seconds):
                    raise StopRequested("stopped during the Fed²GNN exchange")

            started = time.perf_counter()
            key_for = None if self.state_dir is None else ExchangeKeyFile(self.state_dir / EXCHANGE_KEY_FILE).key_for
            hops = self.config.fed2gnn.hops
            boundary, received = retry_until_ready(
                lambda: run_bank_exchange(setup.bank, identity, self.aggregator, hops, wait, key_for),
                "the Fed²GNN exchange",
                self.log,
                timeout=EXCHANGE_TIMEOUT_SECONDS,
                stop=stop,
            )
            if self.state_dir is not None:
                levels = {f"level_{k}": e for k, e in enumerate(received, start=1)}
                write_arrays_atomically(self.state_dir / EXCHANGE_FILE, boundary=boundary, **levels)
                (self.state_dir / EXCHANGE_KEY_FILE).unlink(missing_ok=True)  # the sums are kept: the key is not needed
            self.log.info(
                "fed2gnn.exchanged", boundary=int(boundary.size), seconds=round(time.perf_counter() - started, 3)
            )
        graph = setup.augment(boundary, received, self.config)
        self.log.info("fed2gnn.reconstructed", nodes=graph.num_nodes, own=int(setup.bank.nodes.size))
        return graph

    def run(self, stop: threading.Event) -> None:
        """(Fed²GNN: the set-up exchange first.) Enrol, then take part in every round this bank is invited to, until
        the federation finishes."""
        try:
            if self.reconstruction is not None:
                self.graph_data = self._reconstruct(stop)
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
        self.privacy_normaliser = client_weight(index.max_bank_nodes)
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
            private = self._private_graph(graph, stop)
        except StopRequested:
            return  # stopped during the consortium label release: what it drew is on disk
        trainer = LocalTrainer(self.client_index, private, training, self.config.seed, model)
        if self.privacy is not None:
            self.privacy.attach_training(self.client_index, trainer)
            self._restore_method_release(trainer)
        evaluator = method_model(self.method, features, training.hidden, graph.num_classes, 0.0).to(device)
        num_parameters = int(trainer.model.flat_parameters().numel())
        self.log.info("bank.ready", nodes=graph.num_nodes, num_global_nodes=size)
        session = _Session(trainer, evaluator, graph, num_parameters)
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
            if view.phase == "open" and self.name in view.participants and _stage_key(view) not in session.done:
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
        return self.bank_privacy is not None and self.bank_privacy.stopped_round is not None and not self.withdrawn

    def _withdraw(self) -> None:
        """Tell the aggregator this bank takes no further part (budget spent); after a failure the next poll retries."""
        stopped = self.bank_privacy.stopped_round
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

    def _evaluate(self, session: _Session, broadcast: Broadcast) -> tuple[tuple[int, int, int, int], np.ndarray | None]:
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

    def _download(self, session: _Session, version: int) -> Broadcast:
        return self._decode(session, version, self._verified(model_label(version), self.aggregator.model(version)))

    def _stage(self, view: RoundResponse) -> str:
        """The stage ``view`` opens; an open round that names none is the method's first (an aggregator that
        runs single-stage rounds only)."""
        return view.stage if view.stage is not None else self.stages[0]

    def _download_stage(self, session: _Session, round_number: int, stage: str) -> Broadcast:
        """The broadcast published after ``stage`` of round ``round_number``, checked like a model version."""
        served = self.aggregator.stage_model(round_number, stage)
        return self._decode(session, round_number, self._verified(stage_label(round_number, stage), served))

    def _verified(self, label: str, served: Served) -> bytes:
        """The body of a broadcast this bank was served, once its signature is the aggregator's over it, for this
        bank (``crypto/broadcast_signature.py``); else :class:`ReceiptError`."""
        verify_broadcast(self.broadcast_key, self.federation, self.name, label, served.body, served.signature)
        return served.body

    def _decode(self, session: _Session, version: int, data: bytes) -> Broadcast:
        """``data`` as a broadcast of this federation's shapes (a wrong size or kind is refused, not trained on)."""
        return decode_broadcast(
            version,
            data,
            session.num_parameters,
            session.graph.num_global_nodes,
            self.config.self_supervision.neighbors,
            rows=session.graph.positions,  # served its projection only: its own rows of Ȳ and Ā
        )

    def _report(self, session: _Session, version: int, broadcast: Broadcast) -> None:
        if version in session.reported:
            return
        self.aggregator.report(version, *self._evaluate(session, broadcast))
        session.reported.add(version)

    def _report_final(self, session: _Session, version: int | None) -> None:
        if version is None or version in session.reported:
            return
        try:
            self._report(session, version, self._download(session, version))
        except (FedGLError, OSError) as error:
            self.log.warning("report.failed", version=version, error=str(error)[:300])

    def _take_part(self, session: _Session, view: RoundResponse) -> None:
        log = self.log.bind(round=view.round, base_version=view.base_version)
        # encrypted once per (round, nonce, stage): a retry after a broken connection resends the same
        # bytes (no download, no retraining), which the aggregator accepts as a repeat instead of a
        # conflicting second upload
        key = _stage_key(view)
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
        if self.bank_privacy is not None and self.bank_privacy.stopped_round is not None:
            session.done.add(key)  # budget spent: withdrawn (or retrying it at each poll)
            return
        started = time.perf_counter()
        timer = PhaseTimer()
        try:
            if key in session.uploads:
                uploaded = self._send(view.round, iter(session.uploads[key]), [], timer)
            else:
                encrypted = self._prepare_uploads(session, view, log, timer)
                if encrypted is None:
                    return
                sent: list[Upload] = []
                try:  # each kind goes out as soon as it is encrypted, while later ones are still encrypting
                    uploaded = self._send(view.round, encrypted, sent, timer)
                finally:
                    sent.extend(encrypted)  # a retry must resend these very bytes, never re-encrypt
                    if len(sent) == len(view.shapes):
                        session.uploads = {key: sent}
        except _EncryptionRefused as refused:  # deterministic (e.g. a value outside the packed range): retrying
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
        self, session: _Session, view: RoundResponse, log, timer: PhaseTimer
    ) -> Iterator[Upload] | None:
        """Train from the broadcast the round's stage starts from and start encrypting the (released)
        contribution of that stage's kinds (an iterator of uploads, :meth:`_encrypt_kinds`); None once the
        privacy budget is spent (the bank then withdraws), or for a stage this bank's method does not have.
        ``timer`` gets the download, evaluation, training and encryption seconds.

        The first stage starts from the model version ``base_version`` (which the bank also evaluates and
        reports); a later stage from the broadcast the aggregator published after the stage before it."""
        stage = self._stage(view)
        if stage not in self.stages:
            log.error("round.unknown_stage", stage=stage, stages=list(self.stages))
            session.done.add(_stage_key(view))
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
            _restore(session.trainer, session.snapshots[state])
        else:  # the states of earlier versions are never needed again
            kept = {key: value for key, value in session.snapshots.items() if key[0] == view.base_version}
            session.snapshots = {**kept, state: _snapshot(session.trainer)}
        with timer.phase("training"):
            if self.privacy is not None and self.privacy.recomputes_node_terms:
                # under DP (single-stage methods only: check_stages) P_k and H_k are computed once, with W̄,
                # by the DP step (protect_contributions)
                contribution = self.method.client_contribution(session.trainer, broadcast, with_node_terms=False)
            else:
                contribution = stage_contribution(self.method, stage, session.trainer, broadcast)
            self._keep_method_release(session, view)
            contribution = self._release(session, view, broadcast, contribution)
        if contribution is not None:
            expected = {kind: tuple(shape) for kind, shape in view.shapes.items()}
            actual = {kind: tuple(tensor.shape) for kind, tensor in contribution.items()}
            if actual != expected:
                raise ConfigError(f"round {view.round} expects uploads {expected}, this bank computes {actual}")
        if contribution is None:
            log.warning(
                "privacy.budget_exhausted",
                stopped_round=self.bank_privacy.stopped_round,
                action="stop-contributing",
                detail="this bank uploads nothing more and withdraws from the federation",
            )
            session.done.add(_stage_key(view))
            self._withdraw()
            return None
        ticket = ticket_for(view, self.policy.digest)
        return self._encrypt_kinds(ticket, contribution, broadcast.weights)

    def _encrypt_kinds(
        self, ticket: RoundTicket, contribution: Mapping[str, torch.Tensor], reference: torch.Tensor
    ) -> Iterator[Upload]:
        """Each kind's upload, in the order the encryptions finish: a large upload's kinds are encrypted
        concurrently on the bank's encryption pool (worker processes: TenSEAL holds the GIL, so threads would
        take turns), so the caller can send the first while the rest are still being encrypted (:meth:`_send`
        times the waiting); a small one here, kind after kind. The weights are centred on ``reference``, the W̄
        this stage trained from (:mod:`~fedgl_secure.crypto.centring`). Receipts are signed here: the signing
        key never leaves this process."""
        centre = wire_reference(reference)
        kinds = sorted(contribution)
        terms = {kind: finite_term(kind, bank_term(kind, contribution[kind], centre)) for kind in kinds}
        layouts = {kind: self.policy.upload_layout(kind) for kind in kinds}
        chunks = sum(term_chunks(self.policy.he, layouts[kind], terms[kind].size) for kind in kinds)
        if not self.encryption.use_for(chunks):
            for kind in kinds:
                yield make_upload(
                    self.context, self.policy.he, ticket, self.name, self.signing_key, kind, terms[kind], layouts[kind]
                )
            return
        participants = len(ticket.participants)
        jobs = {self.encryption.submit(kind, terms[kind], layouts[kind], participants): kind for kind in kinds}
        try:
            for job in as_completed(jobs):
                kind = jobs[job]
                encrypted = job.result()
                yield sign_upload(
                    self.context,
                    ticket,
                    self.name,
                    self.signing_key,
                    kind,
                    encrypted.chunks,
                    terms[kind].size,
                    encrypted.c1_sha256,
                )
        finally:  # an abandoned round: do not encrypt the kinds nobody will send
            for job in jobs:
                job.cancel()

    def close(self) -> None:
        """Stop the encryption pool's workers (the node calls it when it shuts down)."""
        self.encryption.close()

    def _send(self, round_number: int, uploads: Iterator[Upload], sent: list[Upload], timer: PhaseTimer) -> int:
        """Upload each of ``uploads`` as it comes (appending it to ``sent``); the bytes sent. Encryption and
        uploads overlap, so ``timer`` gets the parts of the round's time: ``encryption`` while it waited for
        the next kind to be encrypted, ``upload`` while it sent one."""
        total = 0
        while True:
            with timer.phase("encryption"):
                try:
                    upload = next(uploads, None)
                except CiphertextError as error:  # raised by make_upload in the pool, not by the aggregator
                    raise _EncryptionRefused(str(error)) from error
            if upload is None:
                return total
            sent.append(upload)
            with timer.phase("upload"):
                self.aggregator.upload(round_number, upload.kind, upload.chunks, upload.receipt)
            total += upload.wire_bytes


class _NotReady(FedGLError):
    pass


class _EncryptionRefused(FedGLError):
    """The bank refused to encrypt a kind of its contribution (NaN, or a value outside the policy's range)."""


@dataclass
class _Session:
    """What a bank keeps between rounds: its trainer, and which rounds and versions it has handled."""

    trainer: LocalTrainer
    evaluator: nn.Module
    graph: GraphTensors
    num_parameters: int
    done: set[tuple[int, str, str]] = field(default_factory=set)  # (round, nonce, stage)
    reported: set[int] = field(default_factory=set)
    snapshots: dict[tuple[int, str], _TrainerState] = field(default_factory=dict)  # (base version, stage)
    uploads: dict[tuple[int, str, str], list[Upload]] = field(default_factory=dict)  # (round, nonce, stage)
    released: dict[tuple[int, int], dict[str, torch.Tensor]] = field(default_factory=dict)


def _stage_key(view: RoundResponse) -> tuple[int, str, str]:
    """What a bank does once: one stage of one attempt (nonce) of a round."""
    return (view.round, view.nonce, view.stage or "")


@dataclass
class _Progress:
    """What the bank's health endpoint reports: its worker once the key ceremony has given it a context."""

    name: str
    worker: BankWorker | None = None


def create_app(progress: _Progress, lifespan=None) -> FastAPI:
    """The bank's own small API: health and progress (any consortium member)."""
    app = FastAPI(title=f"fedgl-secure bank {progress.name}", version="1", lifespan=lifespan)
    http_conventions.install_error_handlers(app)

    @app.get("/v1/health")
    def health(caller: Caller = Depends(caller_identity)) -> dict:
        worker = progress.worker
        return {
            "role": "bank",
            "name": progress.name,
            "phase": "key-ceremony" if worker is None else "federation",
            "rounds_done": 0 if worker is None else len(worker.rounds_done),
            "finished": worker is not None and worker.finished.is_set(),
        }

    return app


def save_union_index(state_dir: Path, size: int, positions: np.ndarray) -> None:
    write_arrays_atomically(state_dir / INDEX_FILE, num_global_nodes=size, positions=positions)


def bank_graph_tensors(
    state_dir: Path, graph: GraphDataset, device: torch.device, normalize_features: bool
) -> GraphTensors:
    """The bank's graph with its rows at their union-index positions (saved at enrolment), as the federation
    placed them: what ``predict`` scores and the audit's bank view attacks. Refused (naming the directory) when
    the bank's tables no longer hold the customers the federation ran with."""
    size, positions = load_union_index(state_dir)
    if positions.shape != (graph.num_nodes,):
        raise ConfigError(
            f"{state_dir}: the union index holds {positions.size} positions, but the bank's tables now hold "
            f"{graph.num_nodes} customers; the data changed since the federation ran"
        )
    return GraphTensors.from_graph(graph, positions, size, device, normalize_features)


def load_union_index(state_dir: Path) -> tuple[int, np.ndarray]:
    path = state_dir / INDEX_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: no union index; this bank has not enrolled in the federation yet")
    with np.load(path, allow_pickle=False) as archive:
        return int(archive["num_global_nodes"]), archive["positions"].astype(np.int64)


RELEASE_FIELDS = frozenset({"mechanism", "epsilon", "stages", "stage_order", "prior", "prior_temperature"})
"""The ``[dp.labels]`` fields a label release depends on; the others (``correction``...) only change how the bank
trains on it. A new field that changes the release belongs here."""


def release_settings(policy: Policy) -> dict:
    """The ``[dp.labels]`` settings a label release depends on (:data:`RELEASE_FIELDS`): a kept release is reused
    only under the same ones, and a field added later that only changes training leaves kept releases valid."""
    return policy.dp.labels.model_dump(mode="json", include=set(RELEASE_FIELDS))


def edge_release_settings(policy: Policy) -> dict:
    """What a bank's prepared graph depends on: ``[dp.edges]`` (mechanism, ε, weighting) and the degree bound it
    was cut to, if any. A kept graph is reused only under the same ones."""
    bound = policy.dp.graph.max_degree if policy.dp.needs_degree_bound else None
    return {"edges": policy.dp.edges.model_dump(mode="json"), "max_degree": bound}


def save_prepared_graph(path: Path, graph: sp.spmatrix, settings: dict) -> None:
    """A bank's graph after its edge release (CSR arrays) and the settings it was made under, atomically
    (:func:`~fedgl_secure.services.kept_release.keep_release`)."""
    graph = sp.csr_matrix(graph, dtype=np.float64)
    keep_release(
        path,
        settings,
        data=graph.data,
        indices=graph.indices.astype(np.int64),
        indptr=graph.indptr.astype(np.int64),
        shape=np.asarray(graph.shape, dtype=np.int64),
    )


def load_prepared_graph(path: Path, settings: dict, num_nodes: int, log) -> sp.csr_matrix:
    """The graph :func:`save_prepared_graph` kept, refused (naming the file and both settings) when it was made
    under other edge settings — it would not be the release the ledger paid for — or for a graph of another size.
    A file of an earlier version (no settings kept) is reused as it is, with a warning."""
    with np.load(path, allow_pickle=False) as archive:
        legacy = SETTINGS not in archive.files
    if legacy:
        log.warning("privacy.graph_without_settings", path=str(path), reused="as is")
        graph = sp.csr_matrix(sp.load_npz(path), dtype=np.float64)
    else:
        arrays = take_back_release(path, settings, "a graph released", "the edge settings")
        shape = tuple(int(n) for n in arrays["shape"])
        graph = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)
    if graph.shape != (num_nodes, num_nodes):
        raise ConfigError(f"{path}: a graph of {graph.shape[0]} nodes, but this bank's graph has {num_nodes}")
    return graph


def save_label_release(path: Path, release: LabelRelease, settings: dict) -> None:
    """A bank's label release (labels; the likelihood rows when the mechanism keeps them) and the ``[dp.labels]``
    settings it was made under (:func:`~fedgl_secure.services.kept_release.keep_release`)."""
    arrays = {"labels": np.asarray(release.labels, dtype=np.int64)}
    if release.likelihood is not None:
        arrays["likelihood"] = np.asarray(release.likelihood, dtype=np.float64)
    keep_release(path, settings, **arrays)


def load_label_release(path: Path, settings: dict, num_nodes: int) -> LabelRelease:
    """The release :func:`save_label_release` kept, refused (naming the file) when it was made under other
    ``[dp.labels]`` settings or for a graph of another size: it would not be the release the ledger paid for."""
    arrays = take_back_release(path, settings, "a label release", "dp.labels")
    labels, likelihood = arrays["labels"].astype(np.int64), arrays.get("likelihood")
    if labels.shape != (num_nodes,) or (likelihood is not None and likelihood.shape[0] != num_nodes):
        raise ConfigError(f"{path}: a label release of {labels.shape[0]} nodes, but this bank's graph has {num_nodes}")
    return LabelRelease(labels, likelihood)


def load_exchange_sums(state_dir: Path, hops: int) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """Fed²GNN: the boundary and E_1..E_K this bank's exchange gave it (None before the exchange finished)."""
    path = state_dir / EXCHANGE_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as archive:
        return archive["boundary"], [archive[f"level_{k}"] for k in range(1, hops + 1)]


def fed2gnn_setup(node: NodeConfig, consortium: ConsortiumConfig) -> BankReconstruction:
    """This bank's Fed²GNN set-up (benchmark slices only: the seeded Louvain client of the experiment's dataset)."""
    config = consortium.experiment_config()
    check_services(config, bank_sources=consortium.bank_sources)
    client_index = bank_index(node, consortium)
    dataset = load_dataset(config.dataset, node.bank.data_root, seed=config.seed, split=config.data)
    return bank_reconstruction(config, dataset, client_index)


def save_final_model(state_dir: Path, federation: str, version: int, data: bytes) -> None:
    """The final broadcast's bytes, then the note naming it (a torn pair is never read as final)."""
    write_atomically(state_dir / FINAL_MODEL_FILE, data)
    meta = {"federation": federation, "version": version, "sha256": hashlib.sha256(data).hexdigest()}
    write_atomically(state_dir / FINAL_META_FILE, json.dumps(meta).encode())


def load_final_model(state_dir: Path, federation: str) -> tuple[int, bytes] | None:
    """(version, bytes) of the saved final model, or None when this bank has none (or a damaged one)."""
    meta_path, model_path = state_dir / FINAL_META_FILE, state_dir / FINAL_MODEL_FILE
    if not meta_path.is_file() or not model_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        data = model_path.read_bytes()
        if meta.get("federation") != federation or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return None
        return int(meta["version"]), data
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # unreadable or damaged: fetch it again
        return None


def _exchange_identity(node: NodeConfig, consortium: ConsortiumConfig, layout: PkiLayout) -> BankIdentity:
    """Who this bank is in Fed²GNN's exchange: its signing key, every bank's verification key, its pseudonyms."""
    pseudonym_key = load_pseudonym_key(layout, node.name)
    return BankIdentity(
        node.name,
        consortium.federation,
        load_signing_key(layout, node.name),
        load_signing_public_keys(layout, [bank.name for bank in consortium.banks]),
        lambda ids: pseudonymise(pseudonym_key, ids),
    )


def run_bank(node: NodeConfig, consortium: ConsortiumConfig) -> None:
    """Serve a bank until the federation finishes or the process is stopped."""
    configure_logging(node.log_level, json=True)
    log = get_logger(node=node.name, role="bank", federation=consortium.federation)
    config = consortium.experiment_config()
    policy = load_policy(consortium.policy)
    layout = PkiLayout(consortium.pki_dir)
    entry = consortium.node(node.name)
    client_index = bank_index(node, consortium)
    reconstruction = None
    if config.method == "fed2gnn":
        setup = fed2gnn_setup(node, consortium)
        local = setup.local_graph()
        data = BankData(local, local.node_ids.astype(str), None)
        reconstruction = (setup, _exchange_identity(node, consortium, layout))
    else:
        data = bank_graph(node, consortium)  # a bank whose tables do not match the schema stops here, naming the column
    config.evaluation.check_classes(data.graph.num_classes)
    if data.summary is not None:
        log.info("bank.data_loaded", **data.summary.to_dict())
    ka_http = make_http_client(layout, node.name, consortium.key_authority.url, expect_role=NodeRole.KEY_AUTHORITY)
    agg_http = make_http_client(layout, node.name, consortium.aggregator.url, expect_role=NodeRole.AGGREGATOR)
    banks = [bank.name for bank in consortium.banks]
    verify_keys = load_signing_public_keys(layout, banks)
    aggregator_key = load_signing_public_keys(layout, [consortium.aggregator.name])[consortium.aggregator.name]
    roster = Roster(consortium.federation, tuple(banks), policy.he.threshold, policy.digest)
    operator_secret = read_operator_secret(node)  # a missing secret stops the node here, naming both options
    aggregator = AggregatorClient(agg_http)
    progress = _Progress(node.name)

    def work(stop: threading.Event) -> None:
        """The key ceremony (first start) or the sealed share, then training beside partial decryption."""
        held = ensure_key_share(
            node.state_dir,
            roster,
            node.name,
            policy.he,
            operator_secret,
            KeyAuthorityClient(ka_http),
            load_signing_key(layout, node.name),
            verify_keys,
            log,
            stop=stop,
        )
        decryptor = BankDecryptor(node.state_dir, policy, threshold.rings_for(policy.he), held, verify_keys)
        decrypting = threading.Event()
        decryption = threading.Thread(
            target=PartialDecryptionWorker(aggregator, decryptor, node.bank.poll_seconds, log).run,
            args=(decrypting,),
            name=f"{node.name}-decryption",
            daemon=True,
        )
        worker = BankWorker(
            name=node.name,
            federation=consortium.federation,
            client_index=client_index,
            config=config,
            graph=data.graph,
            aggregator=aggregator,
            public_context=held.public_context,
            policy=policy,
            signing_key=load_signing_key(layout, node.name),
            pseudonym_key=load_pseudonym_key(layout, node.name),
            broadcast_key=aggregator_key,
            poll_seconds=node.bank.poll_seconds,
            state_dir=node.state_dir,
            reconstruction=reconstruction,
        )
        progress.worker = worker
        decryption.start()
        try:
            worker.run(stop)
        finally:
            decrypting.set()
            decryption.join(timeout=30.0)
            worker.close()
            decryptor.close()

    try:
        serve_with_worker(
            lambda lifespan: create_app(progress, lifespan=lifespan),
            work,
            entry,
            layout,
            log,
            stop_serving_when_done=True,  # the federation is over (or the worker failed)
        )
    finally:
        ka_http.close()
        agg_http.close()
