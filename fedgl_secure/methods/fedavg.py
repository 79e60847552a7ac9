"""FedAvg (Eq. 10), optionally FedProx: the weights-only federated baseline."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.methods.base import WEIGHTS, Broadcast, FederatedMethod, split_weights_sum, weights_term
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.sparse import SparseOperator


class FedAvg(FederatedMethod):
    """Federated averaging (Eq. 10), optionally with FedProx's proximal term; weights only."""

    name = "federated"

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        federation = config.federation
        self.proximal_mu = federation.fedprox_mu if federation.aggregation == "fedprox" else 0.0

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        return (WEIGHTS,)

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        """``weights``: the flat parameters plus the folded weight w_k."""
        return {WEIGHTS: (num_parameters + 1,)}

    def _train(self, trainer: LocalTrainer, broadcast: Broadcast, adjacency: SparseOperator, alpha: float) -> None:
        pseudo_labels = trainer.graph.local_pseudo_labels(broadcast.pseudo_labels) if alpha > 0 else None
        trainer.train(adjacency, broadcast.weights, pseudo_labels, alpha, self.proximal_mu)

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        self._train(trainer, broadcast, self.evaluation_adjacency(trainer.graph, broadcast), alpha=0.0)
        weight = client_weight(trainer.num_nodes)
        return {WEIGHTS: weights_term(weight, trainer.model.flat_parameters().cpu())}

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        return Broadcast(round_number, fedavg(*split_weights_sum(sums[WEIGHTS])))

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator:
        return graph.adjacency(None, 0.0, False)
