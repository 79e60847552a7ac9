"""Private class centroids with graph propagation (``--method centroids``): node-level DP at one release per bank.

Each bank sums its training customers' unit-norm feature rows per class (Eq. C1), adds Gaussian noise
calibrated to the node unit's ε **once** (:mod:`fedgl_secure.privacy.class_sums`: sensitivity 1, whatever the
graph), and uploads the noisy sums as its ``weights`` term; the consortium averages them (Eq. 10's form, every
bank weighted 1) through the engine's summation (plaintext, or CKKS with ``--secure``). The global model is
that matrix of class directions: each bank scores its customers by their cosine to them (Eq. C3) and propagates
the scores over its own graph (Eq. C4, :mod:`fedgl_secure.model.centroids`). Nothing is trained, so the model
is final after round 1; later rounds upload the same released sums again (post-processing: no new spend).

Why this and not GAP for the node unit (docs/privacy.md §6.11): with 20 labelled customers per class, DP-SGD's
noise over thousands of parameters, and the noise GAP puts on every hop, leave nothing (GAP measures at chance
at ε ≤ 16 on Cora). Sufficient statistics released once need noise on C × F numbers of sensitivity 1, and the
graph — where most of a GNN's gain on Cora comes from — is used inside the bank only, where it costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import CentroidsConfig, ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.base import WEIGHTS, Broadcast, FederatedMethod, split_weights_sum, weights_term
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.centroids import CentroidPropagation
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.privacy import class_sums

__all__ = ["PrivateCentroids", "apply_centroids_policy", "centroids_releases", "check_privacy"]


def centroids_config_values(policy) -> dict:
    """The ``centroids`` config values a ``dp.node_mechanism = "centroids"`` policy fixes: its budget's ε, δ."""
    budget = policy.budget
    noise = policy.dp.centroids.noise if policy.dp.centroids is not None else "local"
    return {"epsilon": budget.epsilon, "delta": budget.delta, "accountant": budget.accountant, "noise": noise}


def apply_centroids_policy(config: ExperimentConfig, policy) -> ExperimentConfig:
    """``config`` with the policy's ε, δ and accountant, refused unless it runs ``--method centroids``.

    The mechanism runs inside the method (one noisy release per bank), and what a bank uploads is
    post-processing of it, so the engine's per-upload DP step has nothing to do under such a policy.
    """
    from fedgl_secure.engine.config import build_config

    if config.method != "centroids":
        raise ConfigError(
            f"dp.node_mechanism = 'centroids' protects the node unit with the method's own release; method "
            f"{config.method!r} has none: run --method centroids, or choose another dp.node_mechanism"
        )
    if policy.he is not None and policy.he.packing != "none":
        raise ConfigError(
            f"he.packing = {policy.he.packing!r} quantises the weights kind for a GCN's weights (a fixed range, "
            "steps of 2^-7 or so), not for the class sums this method uploads (up to tens, with noise): use "
            "he.packing = 'none' (policies/node-dp-centroids.toml)"
        )
    values = config.model_dump(mode="json")
    values["centroids"] = {**values["centroids"], **centroids_config_values(policy)}
    # one round: the model is final after it, and under central noise a second decryption would be a second release
    values["federation"] = {**values["federation"], "max_rounds": 1}
    return build_config(values)


def check_privacy(config: ExperimentConfig, policy) -> None:
    """Refuse central noise without a key authority that adds it: the banks would then release exact sums
    (the method's hook, :func:`fedgl_secure.methods.check_method_privacy`; ``policy`` may be None)."""
    if config.centroids.noise != "central" or math.isinf(config.centroids.epsilon):
        return
    if policy is None or policy.dp.central_kinds() != (WEIGHTS,):
        raise ConfigError(
            "centroids.noise = 'central' leaves the noise to the key authority, but this run has no policy that asks "
            "it to add any (the banks would release exact class sums): run with a policy whose [dp.centroids] "
            "noise = 'central' (policies/node-dp-centroids.toml), or centroids.noise = 'local'"
        )


def check_consortium_policy(policy) -> None:
    """Refuse a consortium under ``dp.centroids.noise = "local"`` (the spec's ``check_consortium_policy``)."""
    if policy.dp.centroids is None or policy.dp.centroids.noise != "central":
        # central noise is drawn by the key authority, which decrypts round 1's sum once (its ledger survives
        # restarts); a bank's own noise would be drawn again by a restarted bank: a second release
        raise ConfigError(
            "dp.centroids.noise = 'local' runs in the simulation only (`simulate --method centroids --policy ...`): "
            "a consortium bank does not yet keep its own noisy class sums across restarts, and a second draw would "
            "be a second release; use noise = 'central' (policies/node-dp-centroids.toml), where the key authority "
            "adds the noise once"
        )


def centroids_releases(config: ExperimentConfig) -> tuple[tuple[str, ...], Callable[[int], list]]:
    """The class sums' one ledger channel and its releases per round: one Gaussian release in round 1, nothing
    after (later rounds re-send the same sums), for :meth:`~fedgl_secure.privacy.dp_round.FederationPrivacy.
    in_method_ledgers` and a bank service's ledger."""
    z = class_sums.noise_multiplier(config.centroids.epsilon, config.centroids.delta)
    return (class_sums.CLASS_SUMS,), lambda round_number: class_sums.releases(z, 1) if round_number == 1 else []


def bank_class_sums(graph: GraphTensors, nonnegative: bool) -> np.ndarray:
    """Eq. C1 on a bank's own graph: its training customers' unit-norm feature rows summed per class.

    Refuses ``nonnegative`` when the bank holds a negative feature value: clipping the released sums at zero
    (Eq. C3) would then throw away real signal, not noise.
    """
    features = graph.features.to_scipy()
    if nonnegative and features.nnz and features.data.min() < 0:
        raise ConfigError(
            "centroids.nonnegative = true, but this bank's features hold negative values; set it to false "
            "(the class directions are then used as released)"
        )
    rows = class_sums.unit_rows(features.toarray())
    labels = graph.labels.cpu().numpy()
    return class_sums.class_sums(rows, labels, graph.train_mask.cpu().numpy(), graph.num_classes)


class PrivateCentroids(FederatedMethod):
    """``--method centroids``: one noisy release of class sums per bank, averaged; scores propagated in the bank."""

    name = "centroids"
    # the engine divides every term by this instead of the public w_max: the sums keep their own scale, the one the
    # key authority's central noise (z × sensitivity 1) is calibrated on
    weight_normaliser = 1.0

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.settings: CentroidsConfig = config.centroids
        # central: the key authority adds the noise to the sum (the simulation checks that one does)
        z = class_sums.noise_multiplier(self.settings.epsilon, self.settings.delta)
        self.noise_multiplier = z if self.settings.noise == "local" else 0.0
        self._released: dict[int, torch.Tensor] = {}  # per bank: drawn once, re-sent unchanged

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        return (WEIGHTS,)

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        return {WEIGHTS: (num_parameters + 1,)}

    def build_model(self, num_features: int, num_classes: int) -> CentroidPropagation:
        s = self.settings
        return CentroidPropagation(num_features, num_classes, s.propagation_steps, s.teleport, s.nonnegative)

    def released_sums(self, trainer: LocalTrainer) -> torch.Tensor:
        """The bank's noisy class sums, drawn on first use and kept: a second draw would be a second release."""
        released = self._released.get(trainer.client_id)
        if released is None:
            sums = bank_class_sums(trainer.graph, self.settings.nonnegative)
            released = torch.as_tensor(class_sums.release(sums, self.noise_multiplier).ravel(), dtype=torch.float32)
            self._released[trainer.client_id] = released
        return released

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        # every bank weighs 1: the sum of the banks' class sums is the consortium's, and equal weights add the
        # banks' independent noise with the least variance for that signal
        return {WEIGHTS: weights_term(1.0, self.released_sums(trainer))}

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        return Broadcast(round_number, fedavg(*split_weights_sum(sums[WEIGHTS])))

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator:
        return graph.adjacency(None, 0.0, False)
