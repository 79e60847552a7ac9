"""The round pipeline both drivers run — the in-process simulation (``simulation/experiment.py``) and the
consortium's bank and aggregator (``consortium/``): W̄ of round 0, a round's stages (each client's pre-weighted
terms, summed, then the method's update), and the hook through which every contribution passes its bank's
privacy step before it is summed.

The pipeline knows methods only through the interface of ``methods/base.py`` (``stages``,
``stage_contribution``, ``stage_update``, ``upload_kinds``, ``node_terms``, ``build_model``) and privacy
through ``privacy/dp_round.py``'s ``FederationPrivacy``, one floor below; so it sits on the engine's floor, between
the two, and names no method.

The hooks of a round, in order: *prepare a client's graph* (once, before round 1: ``FederationPrivacy.setup`` and
``private_graphs`` — edge DP, the degree bound, the label release), *protect a contribution*
(:func:`protect_contributions`), *after the sum* (a summation that adds central noise: ``with_central_noise``),
and *record* (the ledgers and the run's observer, which see every broadcast).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedgl_secure.engine.aggregation import Summation, client_weight, normalise_contribution, open_round
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.kinds import EMBEDDINGS, PREDICTIONS
from fedgl_secure.model.backbones import build_backbone
from fedgl_secure.seeding import torch_stream

if TYPE_CHECKING:
    from fedgl_secure.crypto.bank_encryption import BankEncryption
    from fedgl_secure.methods.base import Broadcast
    from fedgl_secure.privacy.dp_round import FederationPrivacy


def public_model_outputs(trainer, public_weights: torch.Tensor, adjacency) -> object:
    """The trainer's GCN output with the public global model W̄, its trained weights restored afterwards.

    P_k and H_k under DP must not depend on weights trained without DP on the bank's data (their
    sensitivity counts the rows one node moves through message passing, with public weights).
    """
    trained = trainer.model.flat_parameters().detach().clone()
    trainer.model.load_flat_parameters(public_weights)
    try:
        return trainer.infer(adjacency)
    finally:
        trainer.model.load_flat_parameters(trained)


def initial_parameters(config: ExperimentConfig, num_features: int, num_classes: int) -> torch.Tensor:
    """W̄ of round 0, drawn from the run's "init" stream so every party can rebuild it."""
    model = build_backbone(config.training, num_features, num_classes)
    model.reset_parameters(torch_stream(config.seed, "init"))
    return model.flat_parameters()


def method_initial_parameters(method, config: ExperimentConfig, num_features: int, num_classes: int) -> torch.Tensor:
    """W̄ of round 0 for ``method``'s model: :func:`initial_parameters` (the GCN) unless the method brings its
    own model (``build_model``), which is then initialised from the same "init" stream."""
    model = method.build_model(num_features, num_classes)
    if model is None:
        return initial_parameters(config, num_features, num_classes)
    model.reset_parameters(torch_stream(config.seed, "init"))
    return model.flat_parameters()


@dataclass(frozen=True)
class BankUpload:
    """What a bank does with its terms of a stage before they leave it, made for each stage by :func:`run_stages`
    and handed to the executor (picklable: it travels to a Ray actor with the stage): divide them by the public
    ``normaliser`` w_max (:func:`~fedgl_secure.engine.aggregation.normalise_contribution`) and, where the executor
    runs the bank in another process and the round is encrypted, encrypt them there (``encryption``: the open
    round's :meth:`~fedgl_secure.engine.aggregation.RoundSum.bank_encryption`, None for plain sums)."""

    normaliser: float
    encryption: BankEncryption | None = None

    def terms(self, contribution: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The bank's pre-weighted terms as they are uploaded (normalised; encrypted by the caller if it must)."""
        return normalise_contribution(contribution, self.normaliser)


# A round's contributions of one stage: ``contribute(stage, participants, broadcast, upload)`` yields each
# participant's terms as ``(client id, terms)``, in ``participants``' order, each through ``upload`` (the
# simulation's executors: in this process, where the round encrypts the plain terms itself, or on Ray actors,
# which encrypt them in the bank's actor when ``upload.encryption`` is set and hand them over as ciphertexts).
Contribute = Callable[[str, Sequence[int], "Broadcast", BankUpload], Iterable[tuple[int, object]]]


def local_contributions(method, trainers: Sequence[LocalTrainer]) -> Contribute:
    """The contributions of ``trainers`` computed here, one client after the other, each as it is asked for."""

    def contribute(stage: str, participants: Sequence[int], broadcast: Broadcast, upload: BankUpload):
        for k in participants:
            yield k, upload.terms(method.stage_contribution(stage, trainers[k], broadcast))

    return contribute


def run_round_stages(
    method,
    trainers: list[LocalTrainer],
    participants: list[int],
    broadcast: Broadcast,
    round_number: int,
    summation: Summation,
    weight_normaliser: float,
) -> Broadcast:
    """:func:`run_stages` with the contributions of ``trainers`` computed in this process."""
    contribute = local_contributions(method, trainers)
    return run_stages(method, contribute, participants, broadcast, round_number, summation, weight_normaliser)


def run_stages(
    method,
    contribute: Contribute,
    participants: list[int],
    broadcast: Broadcast,
    round_number: int,
    summation: Summation,
    weight_normaliser: float,
) -> Broadcast:
    """One round of ``method``: each of its stages in turn (one for most methods), the same participants in
    each; every stage's uploads are ``ŵ_k·X_k`` (``w_max`` public, as a bank's), summed by ``summation``
    under the round's number, and the stage's server update gives the broadcast the next stage starts from."""
    for stage in method.stages:
        # each client's terms go to the summation as soon as the client is done (a secure one encrypts them
        # while the next client trains)
        with open_round(summation, round_number, participants, reference=broadcast.weights) as round_sum:
            upload = BankUpload(weight_normaliser, round_sum.bank_encryption())
            for k, terms in contribute(stage, participants, broadcast, upload):
                round_sum.add(k, terms)
            sums = round_sum.result()
        broadcast = method.stage_update(stage, sums, round_number, broadcast)
    return broadcast


def protect_contributions(
    privacy: FederationPrivacy,
    method,
    trainers: list[LocalTrainer],
    broadcast: Broadcast,
    round_number: int,
    contributions: dict[int, dict[str, torch.Tensor]],
) -> dict[int, dict[str, torch.Tensor]]:
    """Every contribution through its bank's DP step; banks that refuse (budget spent) are left out.

    Under DP, P_k and H_k (``predictions``, ``embeddings`` of ``method.upload_kinds``) are computed here
    with the public W̄ on the bank's own graph (their sensitivity assumes it), replacing any the
    contribution carries; a contribution built with ``with_node_terms=False`` carries none, so each
    bank runs one inference per round.
    """
    node_kinds = [kind for kind in method.upload_kinds if kind in (PREDICTIONS, EMBEDDINGS)]
    protected = {}
    for k, contribution in contributions.items():
        trainer = trainers[k]
        weight = client_weight(trainer.num_nodes)
        stopped = privacy.banks[k].stopped_round is not None  # it will refuse: no outputs to compute
        if privacy.recomputes_node_terms and not stopped and node_kinds:
            # never on the pseudo graph: under DP-SGD (which trains on it) β > 0 was refused at set-up
            output = public_model_outputs(trainer, broadcast.weights, trainer.own_adjacency())
            merged = {**contribution, **method.node_terms(trainer, output, weight)}
            order = [*method.upload_kinds, *(kind for kind in merged if kind not in method.upload_kinds)]
            contribution = {kind: merged[kind] for kind in order if kind in merged}
        released = privacy.protect(k, round_number, contribution, broadcast.weights, weight)
        if released is not None:
            protected[k] = released
    return protected
