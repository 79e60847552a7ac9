"""A bank's part in the consortium label release (``[dp.labels] prior = "consortium-sgc"``), before round 1: the
bank's side of the label unit's set-up phase (:data:`~fedgl_secure.privacy.unit_phases.LABEL_PRIOR`,
:class:`LabelPriorPhase`), which the bank runs because the policy declares it (``consortium/phases.py``).

The library is :mod:`~fedgl_secure.privacy.consortium_prior`; this is its bank-side shell over the aggregator's
label-prior rounds (:meth:`~fedgl_secure.consortium.label_prior_rounds.LabelPriorRounds.fit`):

1. The bank draws stage 1 of its release (randomised response on its validation labels under
   ``validation-first``), keeps the release in progress in its state directory (:data:`STAGED_LABELS_FILE`),
   and only then records its one label release (ε at round 0) in its ledger — before any upload reads a
   released label.
2. For each label-prior round the aggregator opens, it fits the prior from the θ̄ the round starts from (zero
   at the first round of a stage, else the θ̄ the previous prior round published), on its own Â²X and
   released labels, and uploads the term (:func:`~fedgl_secure.privacy.consortium_prior.prior_term`)
   encrypted and receipted like any upload, centred on that θ̄.
3. Once the rounds of a stage's prior are all fitted it releases that stage by RRWithPrior with the last θ̄'s
   softmax on its nodes, and keeps the release in progress again. After the last stage the release is
   complete: the caller keeps it as the bank's label release (``privacy-labels.npz``).

A restarted bank takes its release in progress back from disk: nothing is drawn twice, so nothing is paid twice.
A reopened round (or a retry after a broken connection) resends the bytes it encrypted the first time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import tenseal as ts
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.consortium.aggregator_port import AggregatorPort, RoundResponse, ticket_for
from fedgl_secure.consortium.bank_state import LABEL_RELEASE_FILE, release_settings, save_label_release
from fedgl_secure.consortium.kept_release import keep_release, take_back_release
from fedgl_secure.consortium.phases import BankPhase
from fedgl_secure.consortium.retry import StopRequested
from fedgl_secure.crypto.broadcast_signature import verify_broadcast
from fedgl_secure.crypto.centring import bank_term, wire_reference
from fedgl_secure.crypto.upload import Upload, finite_term, make_upload
from fedgl_secure.errors import CiphertextError, ConfigError, FedGLError, ProtocolConflict
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.consortium_prior import (
    LABEL_PRIOR_STAGE,
    ROUNDS,
    prior_probabilities,
    prior_size,
    prior_steps,
    prior_term,
    starts_stage,
    step_stage,
)
from fedgl_secure.privacy.label_release import LabelRelease, StagedRelease, propagated_features
from fedgl_secure.privacy.secure_noise import RandomBytes
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import stage_label

if TYPE_CHECKING:
    from fedgl_secure.consortium.bank_releases import BankReleases
    from fedgl_secure.engine.graph_tensors import GraphTensors

STAGED_LABELS_FILE = "privacy-labels-staged.npz"  # the release in progress, between the prior's stages


def save_staged_release(path: Path, release: StagedRelease, settings: dict) -> None:
    """The release in progress and the ``[dp.labels]`` settings it is made under (:func:`keep_release`)."""
    keep_release(path, settings, **release.state())


def load_staged_release(
    path: Path, policy: Policy, settings: dict, num_nodes: int, random_bytes: RandomBytes | None = None
) -> StagedRelease:
    """The release in progress :func:`save_staged_release` kept, refused (naming the file) when it was made under
    other ``[dp.labels]`` settings or for a graph of another size."""
    state = take_back_release(path, settings, "a label release in progress", "dp.labels")
    if state["labels"].shape != (num_nodes,) or state["likelihood"].shape[0] != num_nodes:
        size = state["labels"].shape[0]
        raise ConfigError(f"{path}: a release of {size} nodes, but this bank's graph has {num_nodes}")
    labels = policy.dp.labels
    try:
        return StagedRelease.from_state(
            state,
            float(labels.epsilon),
            labels.effective_stages,
            labels.effective_prior_temperature,
            _random_bytes=random_bytes,
        )
    except ValueError as error:
        raise ConfigError(f"{path}: {error}") from None


def poll_round(
    aggregator: AggregatorPort, log, stop: threading.Event, poll_seconds: float, event: str
) -> RoundResponse | None:
    """The aggregator's current round, or None (logged as ``event``, after a pause) when it cannot be had: a
    ProtocolConflict, or an unreachable (restarting) aggregator."""
    try:
        return aggregator.current_round()
    except (FedGLError, OSError) as error:
        log.warning(event, error=str(error)[:300])
        stop.wait(poll_seconds * 5)
        return None


class LabelPriorParticipant:
    """One bank's side of the label-prior rounds and of its staged release (module doc)."""

    def __init__(
        self,
        *,
        name: str,
        federation: str,
        aggregator: AggregatorPort,
        context: ts.Context,
        fingerprint: str,
        policy: Policy,
        signing_key: Ed25519PrivateKey,
        broadcast_key: Ed25519PublicKey,
        normaliser: float,
        release: StagedRelease,
        release_path: Path,
        settings: dict,
        adjacency: sp.spmatrix,
        features: sp.spmatrix | np.ndarray,
        num_classes: int,
        log,
        poll_seconds: float = 0.2,
    ) -> None:
        self.name, self.federation, self.aggregator = name, federation, aggregator
        self.context, self.fingerprint, self.policy = context, fingerprint, policy
        self.signing_key, self.normaliser, self.broadcast_key = signing_key, normaliser, broadcast_key
        self.release, self.release_path, self.settings = release, release_path, settings
        self.propagated = propagated_features(adjacency, features)
        self.num_classes = num_classes
        self.total_steps = prior_steps(release.stages)
        self.log = log
        self.poll_seconds = poll_seconds
        self._done: set[tuple[int, str]] = set()  # (round, nonce) taken part in
        self._uploads: dict[tuple[int, str], list[Upload]] = {}  # what was encrypted, for resending

    def run(self, stop: threading.Event) -> LabelRelease:
        """Take part in every label-prior round, releasing each stage when its prior is fitted; the complete
        release. Raises :class:`~fedgl_secure.consortium.retry.StopRequested` when ``stop`` is set first."""
        while not self.release.complete:
            if stop.is_set():
                raise StopRequested("stopped during the consortium label release")
            view = poll_round(self.aggregator, self.log, stop, self.poll_seconds, "prior.poll_failed")
            if view is None:
                continue
            if view.phase == "enrolling":
                stop.wait(self.poll_seconds)
                continue
            try:
                self._release_fitted_stages(view.prior_rounds)
            except ConfigError:
                raise
            except (FedGLError, OSError) as error:  # the published prior could not be had: the next poll retries
                self.log.warning("prior.download_failed", error=str(error)[:300])
                stop.wait(self.poll_seconds * 5)
                continue
            if self.release.complete:
                break
            if view.phase == "finished":  # it will never be: the bank cannot train on labels it has not released
                raise ConfigError(
                    f"the federation finished after {len(view.prior_rounds)} of the label prior's {self.total_steps} "
                    "rounds, before this bank's label release was complete"
                )
            if view.phase == "open" and view.stage == LABEL_PRIOR_STAGE and (view.round, view.nonce) not in self._done:
                self._take_part(view)
                continue
            stop.wait(self.poll_seconds)
        self.log.info("prior.release_complete", stages=self.release.stages, rounds=self.total_steps)
        return self.release.result()

    def _release_fitted_stages(self, prior_rounds: list[int]) -> None:
        """Release every stage whose prior's rounds are all fitted (from the θ̄ of its last one), keeping the
        release in progress on disk after each."""
        while not self.release.complete and len(prior_rounds) >= self.release.released * ROUNDS:
            number = self.release.released
            parameters = self._download_prior(prior_rounds[number * ROUNDS - 1])
            self.release.release(number, prior_probabilities(parameters, self.propagated, self.num_classes))
            save_staged_release(self.release_path, self.release, self.settings)
            self.log.info("prior.stage_released", stage=number + 1, stages=self.release.stages)

    def _download_prior(self, round_number: int) -> torch.Tensor:
        """θ̄ that label-prior round ``round_number`` published, checked for its size."""
        served = self.aggregator.stage_model(round_number, LABEL_PRIOR_STAGE)
        label = stage_label(round_number, LABEL_PRIOR_STAGE)
        verify_broadcast(self.broadcast_key, self.federation, self.name, label, served.body, served.signature)
        arrays = encodings.decode_arrays(served.body)
        expected = prior_size(self.propagated.shape[1], self.num_classes)
        prior = arrays.get("prior")
        if prior is None or prior.shape != (expected,):
            raise ProtocolConflict(
                "bad-prior", f"round {round_number}'s prior is not {expected} parameters ({sorted(arrays)})"
            )
        return torch.from_numpy(prior.astype(np.float32))

    def _take_part(self, view: RoundResponse) -> None:
        """Fit, encrypt and upload this bank's term of the prior round ``view`` opens (once per attempt)."""
        key = (view.round, view.nonce)
        log = self.log.bind(round=view.round, stage=LABEL_PRIOR_STAGE)
        if view.policy_sha256 != self.policy.digest:
            log.error("prior.foreign_policy", aggregator=view.policy_sha256[:12], ours=self.policy.digest[:12])
            self._done.add(key)
            return
        if view.context_fingerprint != self.fingerprint or view.federation != self.federation:
            log.error("prior.foreign_round", federation=view.federation, context=view.context_fingerprint[:12])
            self._done.add(key)
            return
        if self.name not in view.participants:
            self._done.add(key)
            return
        try:
            uploads = self._uploads.get(key) or self._encrypt(view)
        except CiphertextError as error:  # deterministic: a reopened round would compute the same term again
            raise ConfigError(
                f"{self.name}: its term of label-prior round {view.round} cannot be encrypted under the policy's "
                f"[he] ({error}); the prior needs packing = 'none' (as policies/label-dp.toml) or a wider "
                "[he.precision.weights] range"
            ) from error
        except ConfigError:
            raise
        except (FedGLError, OSError) as error:  # the θ̄ to start from could not be had: the next poll retries
            log.warning("prior.download_failed", error=str(error)[:300])
            return
        try:
            self._uploads = {key: uploads}
            for upload in uploads:
                self.aggregator.upload(view.round, upload.kind, upload.chunks, upload.receipt)
        except ProtocolConflict as conflict:  # the round closed (deadline) or moved on: wait for the next
            log.warning("prior.upload_refused", code=conflict.code, detail=conflict.detail[:300])
        except (FedGLError, OSError) as error:  # an unreachable aggregator: retried at the next poll
            log.warning("prior.upload_failed", error=str(error)[:300])
            return
        self._done.add(key)
        log.info("prior.uploaded", step=len(view.prior_rounds) + 1, steps=self.total_steps)

    def _encrypt(self, view: RoundResponse) -> list[Upload]:
        step = len(view.prior_rounds) + 1
        if step_stage(step) != self.release.released:
            raise ConfigError(
                f"label-prior round {view.round} fits the prior of stage {step_stage(step) + 1}, but this bank has "
                f"released {self.release.released} of {self.release.stages} stages"
            )
        if starts_stage(step):
            start = torch.zeros(prior_size(self.propagated.shape[1], self.num_classes))
        else:
            start = self._download_prior(view.prior_rounds[-1])
        term = prior_term(
            start,
            self.propagated,
            self.release.likelihood,
            self.release.known(self.release.released),
            self.num_classes,
            self.normaliser,
        )
        expected = tuple(view.shapes.get(WEIGHTS, ()))
        if tuple(term.shape) != expected or set(view.shapes) != {WEIGHTS}:
            raise ConfigError(f"label-prior round {view.round} expects {view.shapes}, this bank computes {term.shape}")
        values = finite_term(WEIGHTS, bank_term(WEIGHTS, term, wire_reference(start)))
        ticket = ticket_for(view, self.policy.digest)
        layout = self.policy.upload_layout(WEIGHTS)
        return [make_upload(self.context, self.policy.he, ticket, self.name, self.signing_key, WEIGHTS, values, layout)]


class LabelPriorPhase(BankPhase):
    """The bank's side of the label unit's set-up phase: its whole label release, made in the aggregator's
    label-prior rounds (module doc, steps 1–3) and kept as ``privacy-labels.npz``."""

    def labels_in_progress(self) -> bool:
        return self.parts.state_dir is not None and (self.parts.state_dir / STAGED_LABELS_FILE).exists()

    def release_labels(
        self, releases: BankReleases, graph: GraphTensors, adjacency: sp.spmatrix, stop: threading.Event
    ) -> np.ndarray:
        """The release in progress is drawn (stage 1) or taken back from disk, recorded in ``releases``' ledger once
        (before any upload reads it), completed in the label-prior rounds and kept as ``privacy-labels.npz``."""
        parts = self.parts
        staged_path = parts.state_dir / STAGED_LABELS_FILE  # a DP policy has a state directory (BankReleases)
        settings = release_settings(parts.policy)
        labels = parts.policy.dp.labels
        random_bytes = releases.privacy.random_bytes
        if staged_path.exists():
            release = load_staged_release(staged_path, parts.policy, settings, graph.num_nodes, random_bytes)
            parts.log.info("privacy.labels_in_progress", stages_released=release.released)
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
        if releases.bank_privacy.record_label_release():
            releases.save_ledger()
        participant = LabelPriorParticipant(
            name=parts.name,
            federation=parts.federation,
            aggregator=parts.aggregator,
            context=parts.context,
            fingerprint=parts.fingerprint,
            policy=parts.policy,
            signing_key=parts.signing_key,
            broadcast_key=parts.broadcast_key,
            normaliser=releases.privacy_normaliser,
            release=release,
            release_path=staged_path,
            settings=settings,
            adjacency=adjacency,
            features=graph.features.to_scipy(),
            num_classes=graph.num_classes,
            log=parts.log,
            poll_seconds=parts.poll_seconds,
        )
        result = participant.run(stop)
        save_label_release(parts.state_dir / LABEL_RELEASE_FILE, result, settings)
        staged_path.unlink()
        return releases.bank_privacy.restore_label_release(result)
