"""FedGL: FedAvg plus global pseudo labels (Eqs. 12-13) and a global pseudo graph (Eqs. 14-15)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig, SelfSupervisionConfig
from fedgl_secure.engine.fusion import fuse_node_values, scatter_to_global
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.pseudo_graph import discover_pseudo_graph, resolve_backend
from fedgl_secure.engine.pseudo_graph_recall import recall_rows, sampled_recall
from fedgl_secure.engine.pseudo_labels import global_pseudo_labels
from fedgl_secure.log import get_logger
from fedgl_secure.methods.base import (
    EMBEDDINGS,
    NODE_WEIGHT,
    PREDICTIONS,
    WEIGHTS,
    Broadcast,
    split_weights_sum,
    weights_term,
)
from fedgl_secure.methods.fedavg import FedAvg
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.gcn import GCNOutput
from fedgl_secure.model.sparse import SparseOperator


class FedGL(FedAvg):
    """FedGL: FedAvg plus global pseudo labels (Eqs. 12-13) and a global pseudo graph (Eqs. 14-15).

    Uploads only what the enabled parts need: with α = 0 no predictions leave a bank, with
    β = 0 no embeddings do.
    """

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.name = config.method
        self.ssl: SelfSupervisionConfig = config.self_supervision
        self.alpha, self.beta = config.effective_alpha_beta()
        self.server_device = None if config.device == "auto" else torch.device(config.device)

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        kinds = [WEIGHTS]
        if self.alpha > 0:
            kinds.append(PREDICTIONS)
        if self.beta > 0:
            kinds.append(EMBEDDINGS)
        if self.alpha > 0 or self.beta > 0:
            kinds.append(NODE_WEIGHT)
        return tuple(kinds)

    def embedding_dim(self, num_classes: int) -> int:
        """D of H_k: C for the output layer (logits), the hidden width for the hidden layer."""
        return num_classes if self.ssl.embedding == "output" else self.config.training.hidden

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        """``weights`` (P + 1,), ``predictions`` (M, C), ``embeddings`` (M, D), ``node_weight`` (M,) — as sent."""
        shapes = {
            WEIGHTS: (num_parameters + 1,),
            PREDICTIONS: (num_global_nodes, num_classes),
            EMBEDDINGS: (num_global_nodes, self.embedding_dim(num_classes)),
            NODE_WEIGHT: (num_global_nodes,),
        }
        return {kind: shapes[kind] for kind in self.upload_kinds}

    def _client_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator:
        return graph.adjacency(broadcast.pseudo_graph, self.beta, self.ssl.renormalize_fused)

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        """Train, then ``cat(w_k·W_k, [w_k])``, ``w_k·P_k``, ``w_k·H_k`` (from the trained local model) and
        ``node_weight``; without ``with_node_terms`` no inference is run and P_k, H_k are left to the caller."""
        adjacency = self._client_adjacency(trainer.graph, broadcast)
        self._train(trainer, broadcast, adjacency, self.alpha)
        weight = client_weight(trainer.num_nodes)
        kinds = self.upload_kinds
        contribution = {WEIGHTS: weights_term(weight, trainer.model.flat_parameters().cpu())}
        if len(kinds) == 1:
            return contribution
        if with_node_terms:
            contribution.update(self.node_terms(trainer, trainer.infer(adjacency), weight))
        positions = torch.as_tensor(trainer.graph.positions)
        m = trainer.graph.num_global_nodes
        contribution[NODE_WEIGHT] = scatter_to_global(torch.full((trainer.num_nodes,), weight), positions, m)
        return contribution

    def node_terms(self, trainer: LocalTrainer, output: GCNOutput, weight: float) -> dict[str, torch.Tensor]:
        """``w_k · P_k`` and ``w_k · H_k`` (those of ``upload_kinds``) in the global index, from the GCN ``output``."""
        kinds = self.upload_kinds
        positions = torch.as_tensor(trainer.graph.positions)
        m = trainer.graph.num_global_nodes
        terms = {}
        if PREDICTIONS in kinds:
            terms[PREDICTIONS] = scatter_to_global(weight * torch.softmax(output.logits, 1).cpu(), positions, m)
        if EMBEDDINGS in kinds:
            embedding = output.logits if self.ssl.embedding == "output" else output.hidden
            terms[EMBEDDINGS] = scatter_to_global(weight * embedding.cpu(), positions, m)
        return terms

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        weighted_parameters, total_weight = split_weights_sum(sums[WEIGHTS])
        weights = fedavg(weighted_parameters, total_weight)
        pseudo_labels = fused_predictions = pseudo_graph = None
        if PREDICTIONS in sums:
            fused_predictions = fuse_node_values(sums[PREDICTIONS], sums[NODE_WEIGHT], total_weight, self.ssl.fusion)
            pseudo_labels = global_pseudo_labels(fused_predictions, self.ssl.threshold)
        if EMBEDDINGS in sums:
            fused_embeddings = fuse_node_values(sums[EMBEDDINGS], sums[NODE_WEIGHT], total_weight, self.ssl.fusion)
            started = time.perf_counter()
            pseudo_graph = discover_pseudo_graph(
                fused_embeddings,
                self.ssl.neighbors,
                similarity=self.ssl.similarity,
                backend=self.ssl.backend,
                device=self.server_device,
            )
            seconds = round(time.perf_counter() - started, 3)
            recall = recall_ties = None
            if self.ssl.recall_sample:  # how right an approximate search was, on a sample of rows
                rows = recall_rows(pseudo_graph.num_nodes, self.ssl.recall_sample, seed=round_number)
                kept = pseudo_graph.neighbors[rows.to(pseudo_graph.neighbors.device)]
                recall, recall_ties = (
                    round(value, 4) for value in sampled_recall(fused_embeddings, self.ssl.similarity, rows, kept)
                )
            # the step that grows fastest with M: logged on its own so a slow round can be placed
            get_logger(round=round_number).info(
                "pseudo_graph.discovered",
                nodes=pseudo_graph.num_nodes,
                neighbors=pseudo_graph.num_neighbors,
                backend=resolve_backend(
                    self.ssl.backend, self.server_device, pseudo_graph.num_nodes, fused_embeddings.shape[1]
                )[0],
                seconds=seconds,
                recall=recall,
                recall_ties=recall_ties,
                recall_sample=self.ssl.recall_sample or None,
            )
        return Broadcast(round_number, weights, pseudo_labels, pseudo_graph, fused_predictions)

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator:
        if self.ssl.pseudo_graph_at_eval:
            return self._client_adjacency(graph, broadcast)
        return graph.adjacency(None, 0.0, False)
