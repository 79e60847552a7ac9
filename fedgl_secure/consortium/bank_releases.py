"""A bank's DP state: its privacy ledger, what it released once at the source (the graph after its edge release, its
labels, a method's own release) kept in its state directory, and each round's release.

Under a policy with DP the bank applies it exactly as the simulation does (:mod:`fedgl_secure.privacy.dp_round`),
before encryption: its graph is prepared once (edge DP, degree bound) and its training and validation labels
released once (label DP: randomised response, or RRWithPrior in stages with the bank's own prior, or — when a
declared set-up phase makes the release (``consortium/phases.py``) — with the prior all banks fit together in the
aggregator's label-prior rounds, ``prior = "consortium-sgc"``: :mod:`~fedgl_secure.consortium.bank_label_prior`),
both before round 1 and kept in its state directory
(``consortium/bank_state.py``) so that a restart reuses them instead of drawing (and paying for) them again; each
contribution goes through its :class:`~fedgl_secure.privacy.dp_round.BankPrivacy` step (P/H with the public W̄,
clipping, its noise share, the ``w_max`` normalisation), and its
:class:`~fedgl_secure.privacy.accounting.PrivacyLedger` is saved to ``<state_dir>/privacy-ledger.json`` after every
recorded round, before anything is uploaded, and loaded at start — a restart never refills the budget. A channel
with ``noise = "central"`` gets no share from the bank (the key authority adds its noise to the decrypted sum) but
is recorded in the ledger like any other release. The noised release of a round is kept for a reopened attempt of
the same round (one decryption per round number at the key authority), so reopening neither charges the budget
again nor re-draws the noise.

:class:`BankReleases` holds the bank's :class:`~fedgl_secure.privacy.dp_round.FederationPrivacy` (None without DP),
its ledger's path, the releases a method makes inside the bank (the class sums, GAP) and the public ``w_max``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedgl_secure.consortium.aggregator_port import RoundResponse
from fedgl_secure.consortium.bank_session import Session
from fedgl_secure.consortium.bank_state import (
    LABEL_RELEASE_FILE,
    LEDGER_FILE,
    METHOD_RELEASE_FILE,
    PREPARED_GRAPH_FILE,
    edge_release_settings,
    load_label_release,
    load_prepared_graph,
    release_settings,
    save_label_release,
    save_prepared_graph,
)
from fedgl_secure.consortium.kept_release import keep_release, take_back_release
from fedgl_secure.consortium.phases import BankPhase
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.aggregation import normalise_contribution
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import protect_contributions
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import in_method_mechanism
from fedgl_secure.methods.base import Broadcast, FederatedMethod
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.accounting import EDGES, LABELS, PrivacyLedger
from fedgl_secure.privacy.dp_round import FederationPrivacy, RandomBytes
from fedgl_secure.privacy.label_release import LabelRelease
from fedgl_secure.privacy.release_schedule import setup_releases
from fedgl_secure.seeding import numpy_stream


class BankReleases:
    """A bank's DP state and releases (module doc)."""

    def __init__(
        self,
        *,
        name: str,
        client_index: int,
        config: ExperimentConfig,
        policy: Policy,
        method: FederatedMethod,
        state_dir: Path | None,
        random_bytes: RandomBytes | None,
        log,
    ) -> None:
        """``config``: the experiment with the policy's in-method settings applied. ``state_dir`` is required when
        the policy has DP; ``random_bytes`` replaces the CSPRNG for the noise (tests only)."""
        self.name = name
        self.client_index = client_index
        self.config = config
        self.policy = policy
        self.method = method
        self.state_dir = state_dir
        self.log = log
        # a node mechanism inside its method (the class sums) fixes the method's ε, δ and rounds from the policy,
        # and its releases (ledger channels, what each round releases) replace the per-upload DP step
        in_method = in_method_mechanism(policy)
        self.method_releases = None if in_method is None else in_method.releases(config)
        self.privacy: FederationPrivacy | None = None
        self.ledger_path: Path | None = None
        self.privacy_normaliser: float | None = None  # w_max, from the union index
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

    def private_graph(
        self, graph: GraphTensors, graph_data: GraphDataset, stop: threading.Event, phases: Sequence[BankPhase] = ()
    ) -> GraphTensors:
        """The graph the bank trains on: as it is, or under DP prepared once as the simulation does
        (:meth:`FederationPrivacy.setup_bank`, :meth:`FederationPrivacy.private_graph`: edge DP, degree bound,
        the label release), with the ledger of earlier runs of this bank. What was drawn at the source is kept
        in the state directory and reused on restart, never drawn (and paid for) again. A declared set-up phase of
        ``phases`` may make the label release instead (:meth:`BankPhase.release_labels`: the consortium prior's
        rounds before round 1)."""
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
            graph_data.adjacency(),
            numpy_stream(self.config.seed, "privacy", "degree", self.client_index),
            ledger=ledger,
            prepared=prepared,
            read_features=graph.features.to_scipy,  # read only by a weighting that needs them
        )
        if releases_edges and prepared is None:
            save_prepared_graph(graph_path, adjacency, edge_release_settings(self.policy))
        kept = self._kept_labels(graph, ledger, phases)
        for phase in phases:
            if kept is None:
                kept = phase.release_labels(self, graph, adjacency, stop)
        private = self.privacy.private_graph(self.client_index, graph, adjacency, kept)
        if self.policy.dp.labels.enabled and kept is None:  # released just now: on disk before the ledger records it
            release = LabelRelease(private.labels.cpu().numpy(), self.bank_privacy.label_likelihood)
            save_label_release(self.state_dir / LABEL_RELEASE_FILE, release, release_settings(self.policy))
        self.save_ledger()
        spent = self.bank_privacy.ledger.epsilon(self.policy.budget.delta, self.policy.budget.accountant)
        self.log.info(
            "privacy.ready", epsilon_spent=spent, budget=self.policy.budget.epsilon, resumed=ledger is not None
        )
        return private

    def _kept_labels(
        self, graph: GraphTensors, ledger: PrivacyLedger | None, phases: Sequence[BankPhase]
    ) -> np.ndarray | None:
        """Under label DP, the labels this bank released in an earlier run (``privacy-labels.npz``), taken back
        without a new draw; None when it has released none yet (:meth:`FederationPrivacy.private_graph` then
        releases them once, recorded at round 0, and :meth:`private_graph` stores them before the ledger).

        A release on disk that the ledger does not record (stopped between the two writes) is recorded now, once;
        a ledger that records a release whose labels are gone refuses to start: drawing again would spend ε twice.
        """
        settings = self.policy.dp.labels
        if not settings.enabled:
            return None
        path = self.state_dir / LABEL_RELEASE_FILE
        recorded = ledger is not None and any(release.channel == LABELS for release in ledger.releases)
        if not path.exists():
            if recorded and not any(phase.labels_in_progress() for phase in phases):  # else: resumed by its phase
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

    def save_ledger(self) -> None:
        """Write the ledger (:meth:`PrivacyLedger.save` replaces the file atomically: a torn file would
        fail the next start, closed but needlessly)."""
        self.bank_privacy.ledger.save(self.ledger_path)

    def release(
        self, session: Session, view: RoundResponse, broadcast: Broadcast, contribution: dict[str, torch.Tensor]
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
            self.save_ledger()  # recorded, and on disk, before anything leaves the bank
            session.released = {key: released[k]}
        return session.released[key]

    def _method_releases_of(self, session: Session, view: RoundResponse) -> list:
        """What this round's contribution released inside the method, as records of round number ``view.round``
        (each round number is decrypted once; a retry of the same training round under a new number is a new
        release): what the method says this bank made (``bank_releases``: GAP's hops only in the call that drew
        them), else the method's schedule for the training round (``base_version + 1``)."""
        training_round = view.base_version + 1
        releases = self.method.bank_releases(session.trainer, training_round)
        if releases is None:
            _, releases_of_round = self.method_releases
            releases = releases_of_round(training_round)
        return [release.model_copy(update={"round": view.round}) for release in releases]

    def keep_method_release(self, session: Session, view: RoundResponse) -> None:
        """A release the method made inside the bank and must never draw again (GAP's hops), written to the state
        directory with its round number once it exists — before the ledger records it and before any upload."""
        path = None if self.privacy is None else self.state_dir / METHOD_RELEASE_FILE  # (a DP policy has a state_dir)
        if not self.method.kept_release_channels or path is None or path.exists():  # kept once: not even copied out
            return
        arrays = self.method.kept_release(session.trainer)
        if arrays:
            arrays = {name: value.numpy() for name, value in arrays.items()}
            keep_release(path, self.method.kept_release_settings(), round=np.array(view.round), **arrays)
            self.log.info("privacy.method_release_kept", round=view.round, arrays=sorted(arrays))

    def restore_method_release(self, trainer: LocalTrainer) -> None:
        """Take back what :meth:`keep_method_release` kept (a restarted bank): never drawn again; one kept but not
        yet recorded (stopped between the two writes) is recorded now, once. A ledger that records such a release
        whose file is gone refuses to start: drawing it again would be a second release."""
        if not self.method.kept_release_channels or self.bank_privacy is None:
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
        self.method.restore_kept_release(trainer, {name: torch.from_numpy(array) for name, array in arrays.items()})
        records = self.method.kept_release_records(round_number)
        if not recorded and self.bank_privacy.record_releases(round_number, records):
            self.save_ledger()
        self.log.info("privacy.method_release_reused", round=round_number, recorded_before=recorded)
