"""The consortium label prior's rounds at the aggregator, before training round 1 (``dp.labels.prior =
"consortium-sgc"``; the library is :mod:`~fedgl_secure.privacy.consortium_prior`, a bank's side
``consortium/bank_label_prior.py``): the aggregator's side of the label unit's set-up phase
(:data:`~fedgl_secure.privacy.unit_phases.LABEL_PRIOR`), which the coordinator runs because the policy declares it
(``consortium/phases.py``).

Each is a FedAvg round of its own number, stage ``label-prior``, one ``weights`` kind centred on the θ̄ it starts
from, every bank taking part (so every decrypted sum is over the same banks: two sums over different sets would
reveal a bank's term), decrypted by the key authority and ``t`` banks like a training round; the fitted θ̄ is
published as the round's stage model. :class:`LabelPriorRounds` holds how many rounds the prior takes, the rounds
fitted so far (what ``RoundView.prior_rounds`` tells the banks) and the upload shape of one.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from fedgl_secure.consortium.phases import SETUP_BASE_VERSION, SETUP_ROUND_DONE, AggregatorParts, AggregatorPhase
from fedgl_secure.crypto.broadcast_signature import sign_broadcast
from fedgl_secure.crypto.centring import wire_reference
from fedgl_secure.errors import FedGLError
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.privacy.consortium_prior import (
    LABEL_PRIOR_STAGE,
    prior_average,
    prior_size,
    prior_steps,
    starts_stage,
)
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import stage_label

PRIOR_BASE_VERSION = SETUP_BASE_VERSION  # a label-prior round's base version: it comes before model version 0
PRIOR_FITTED = SETUP_ROUND_DONE  # a label-prior round's status once its θ̄ is published


class LabelPriorRounds(AggregatorPhase):
    """The label prior's FedAvg rounds (module doc), the aggregator's side of the set-up phase
    :data:`~fedgl_secure.privacy.unit_phases.LABEL_PRIOR`. ``parts.changed`` is the coordinator's condition: a fitted
    round notifies it."""

    owned_stages = (LABEL_PRIOR_STAGE,)

    def __init__(self, parts: AggregatorParts) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.participation = parts.participation
        self.round_stages = parts.stages
        self.changed = parts.changed
        self.log = parts.log
        self.steps = prior_steps(parts.policy.dp.labels.effective_stages)
        self.rounds: list[int] = [
            row.round
            for row in self.store.rounds()
            if row.base_version == PRIOR_BASE_VERSION and row.status == PRIOR_FITTED
        ]
        self._shapes: dict[str, tuple[int, ...]] | None = None  # fixed once the index exists

    def before_training(self, stop: threading.Event) -> bool:
        return self.fit(stop)

    def upload_shapes(self) -> list[tuple[int, ...]]:
        return list(self.shapes().values()) if self.steps else []

    def serve_stage(self, bank: str, round_number: int, stage: str, data: bytes) -> tuple[bytes, str]:
        """The fitted prior θ̄: model parameters, nothing per customer, so every enrolled bank is served it whole."""
        self.parts.enrolment.index_for(bank)
        label = stage_label(round_number, stage)
        return data, sign_broadcast(self.parts.broadcast_key, self.parts.federation, bank, label, data)

    def round_view(self) -> dict[str, object]:
        return {"prior_rounds": tuple(self.rounds)}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """A label-prior round's one kind: the prior's parameters and the bank's weight
        (:func:`~fedgl_secure.privacy.consortium_prior.prior_term`). Computed once: every upload request's body
        limit reads it (``Coordinator.upload_body_limit``)."""
        if self._shapes is None:
            first = self.store.enrolment(self.participation.banks[0])
            self._shapes = {WEIGHTS: (prior_size(first.num_features, first.num_classes) + 1,)}
        return self._shapes

    def start(self, step: int) -> torch.Tensor:
        """θ̄ that FedAvg round ``step`` of the prior starts from: zero at the first round of each stage's prior,
        else the θ̄ the previous round published."""
        size = self.shapes()[WEIGHTS][0] - 1
        if starts_stage(step):
            return torch.zeros(size)
        arrays = encodings.decode_arrays(self.store.stage_model(self.rounds[-1], LABEL_PRIOR_STAGE))
        return torch.from_numpy(arrays["prior"])

    def fit(self, stop: threading.Event) -> bool:
        """The prior's FedAvg rounds (module doc), each once every bank is live. The banks release each stage of
        their labels from the θ̄ of the last round before it (``RoundView.prior_rounds`` says which rounds those
        are). Resumes after the last fitted round; False if ``stop`` was set."""
        round_number = self.store.last_round_number() + 1
        while len(self.rounds) < self.steps:
            if not self.participation.wait_for_every_bank(stop):
                return False
            step = len(self.rounds) + 1
            outcome = self._run_round(stop, round_number, step)
            if outcome == "stopped":
                return False
            if outcome in (PRIOR_FITTED, "abandoned"):
                round_number += 1
        return True

    def _run_round(self, stop: threading.Event, round_number: int, step: int) -> str:
        """FedAvg round ``step`` of the label prior as round ``round_number``: "fitted", or "stopped", "aborted"
        (the same number reopens) or "abandoned" (the next number retries), as :meth:`RoundStages.run_stage` says."""
        log = self.log.bind(round=round_number, stage=LABEL_PRIOR_STAGE)
        banks = self.participation.banks
        try:
            nonce = self.round_stages.open_at_key_authority(stop, round_number, banks)
        except FedGLError:
            return "stopped"
        self.store.open_round(round_number, PRIOR_BASE_VERSION, nonce, banks)
        start = self.start(step)
        timer = PhaseTimer()
        outcome, contributors, sums = self.round_stages.run_stage(
            stop,
            round_number,
            PRIOR_BASE_VERSION,
            nonce,
            LABEL_PRIOR_STAGE,
            banks,
            timer,
            wire_reference(start),
            first=True,
            shapes=self.shapes(),
        )
        if outcome != "decrypted":
            return outcome
        fitted = prior_average(torch.from_numpy(np.asarray(sums[WEIGHTS])), start)
        self.store.save_stage_model(
            round_number, LABEL_PRIOR_STAGE, encodings.encode_arrays({"prior": fitted.to(torch.float32).numpy()})
        )
        self.store.close_round(round_number, PRIOR_FITTED, f"label prior: FedAvg round {step} of {self.steps}")
        with self.changed:
            self.rounds.append(round_number)
            self.changed.notify_all()
        log.info("prior.round_fitted", step=step, steps=self.steps, contributors=list(contributors))
        return PRIOR_FITTED
