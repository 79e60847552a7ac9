"""``fedgl-secure predict``: a bank scores all of its customers with the federation's final global model.

Everything happens at the bank, on the bank's own graph: its customers table is read and encoded
exactly as for training (:func:`fedgl_secure.consortium.bank_data.bank_graph`), the final model is the one
the bank saved when the federation finished (``<state_dir>/final-model.npz``) or — for a bank that
missed the end — fetched from the aggregator over mutual TLS, and the scores (class probabilities
and predicted class per customer, by the bank's own customer id) go to a Parquet/CSV file or back
into the bank's database. Nothing leaves the bank.

The model is applied to the bank's *true* graph even under a DP policy: scoring its own customers
is local use of a released model, not a release (the perturbed graph exists to protect what the
bank uploads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedgl_secure.consortium.bank_data import bank_graph, fed2gnn_setup
from fedgl_secure.consortium.bank_state import (
    bank_graph_tensors,
    load_exchange_sums,
    load_final_model,
    save_final_model,
)
from fedgl_secure.consortium.config import ConsortiumConfig, NodeConfig, NodeRole, PkiLayout, load_node_config
from fedgl_secure.crypto.broadcast_signature import verify_broadcast
from fedgl_secure.data.sources.bank_data import BankData
from fedgl_secure.data.sources.scores import write_scores
from fedgl_secure.errors import ConfigError
from fedgl_secure.log import get_logger
from fedgl_secure.method_registry import NEIGHBOUR_EXCHANGE, method_spec
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import method_model
from fedgl_secure.services.aggregator_client import AggregatorClient
from fedgl_secure.services.pki import load_signing_public_keys
from fedgl_secure.services.tls import make_http_client
from fedgl_secure.simulation.experiment import resolve_device
from fedgl_secure.wire.broadcast import decode_broadcast, model_label


@dataclass(frozen=True)
class ScoreTarget:
    """Where the scores go: a file (``.parquet``/``.csv``) or a table of the bank's own database."""

    output: Path | None = None
    table: str | None = None

    def describe(self) -> str:
        return str(self.output) if self.output is not None else f"table {self.table}"


def score_target(node: NodeConfig, output: Path | None, table: str | None) -> ScoreTarget:
    """``--output``/``--table`` if given, else ``[bank.predict]`` of the node file; exactly one is needed."""
    if output is not None and table is not None:
        raise ConfigError("give at most one of --output and --table")
    if output is None and table is None:
        output, table = node.bank.predict.output, node.bank.predict.table
    if output is None and table is None:
        raise ConfigError(
            f"{node.source}: no target for the scores: pass --output FILE.parquet or --table NAME, "
            "or set [bank.predict] output/table in the node file"
        )
    if table is not None and (node.bank.data is None or node.bank.data.kind != "sql"):
        raise ConfigError(f"--table {table}: this bank's [bank.data] is not a database; use --output FILE")
    return ScoreTarget(output, table)


def fetch_final_model(node: NodeConfig, consortium: ConsortiumConfig) -> tuple[int, bytes]:
    """The finished federation's final model from the aggregator (mutual TLS, as this bank), saved for next time."""
    layout = PkiLayout(consortium.pki_dir)
    with make_http_client(layout, node.name, consortium.aggregator.url, expect_role=NodeRole.AGGREGATOR) as http:
        client = AggregatorClient(http)
        status = client.status()
        if status.get("phase") != "finished":
            raise ConfigError(
                f"the federation {consortium.federation!r} has not finished (phase {status.get('phase')!r}, latest "
                f"model version {status.get('latest_version')}); scores come from the final model only"
            )
        version = status.get("final_version")
        if version is None:
            raise ConfigError(
                f"the federation {consortium.federation!r} has finished but not yet fixed its final model (it waits "
                "for every bank's report of the last version, at most a minute); try again shortly"
            )
        served = client.model(version)
    aggregator = consortium.aggregator.name
    aggregator_key = load_signing_public_keys(layout, [aggregator])[aggregator]
    verify_broadcast(
        aggregator_key, consortium.federation, node.name, model_label(version), served.body, served.signature
    )
    data = served.body
    save_final_model(node.state_dir, consortium.federation, version, data)
    return version, data


def predict(
    config_path: str | Path, output: Path | None = None, table: str | None = None, refresh: bool = False
) -> dict:
    """Score every customer of the bank of ``config_path``; returns a summary (never the scores themselves)."""
    node, consortium = load_node_config(config_path)
    if node.role is not NodeRole.BANK:
        raise ConfigError(f"{config_path}: role {node.role.value!r}; only a bank scores customers")
    target = score_target(node, output, table)
    log = get_logger(node=node.name, role="bank", federation=consortium.federation)
    config = consortium.experiment_config()
    if NEIGHBOUR_EXCHANGE in method_spec(config.method).phases:  # trained on the exchange-completed graph: score on it
        setup = fed2gnn_setup(node, consortium)
        sums = load_exchange_sums(node.state_dir, config.fed2gnn.hops)
        if sums is None:
            raise ConfigError(f"{node.state_dir}: no Fed²GNN exchange sums; this bank has not taken part in a run yet")
        graph_data = setup.augment(*sums, config)
        local = setup.local_graph()
        data = BankData(local, local.node_ids.astype(str), None)
    else:
        data = bank_graph(node, consortium)
        graph_data = data.graph
    saved = None if refresh else load_final_model(node.state_dir, consortium.federation)
    version, model_bytes = saved if saved is not None else fetch_final_model(node, consortium)
    device = resolve_device(config.device)
    graph = bank_graph_tensors(node.state_dir, graph_data, device, config.training.normalize_features)
    method = build_method(config)
    # the method's model (e.g. GraphFL's SGC backbone), as the banks trained it
    model = method_model(method, graph.features.shape[1], config.training.hidden, graph.num_classes, 0.0).to(device)
    broadcast = decode_broadcast(
        version,
        model_bytes,
        int(model.flat_parameters().numel()),
        graph.num_global_nodes,
        config.self_supervision.neighbors,
        rows=graph.positions,  # the bank is served its projection of the final broadcast
    )
    model.load_flat_parameters(broadcast.weights.to(device))
    model.eval()
    with torch.no_grad():
        adjacency = method.evaluation_adjacency(graph, broadcast)
        probabilities = torch.softmax(model(graph.features, adjacency).logits, dim=1).cpu().numpy()
    probabilities = probabilities[: data.graph.num_nodes]  # Fed²GNN's decoded nodes (after the own ones) are no one
    class_names = (
        list(consortium.feature_schema.label_classes)
        if consortium.feature_schema is not None
        else [str(c) for c in range(graph.num_classes)]
    )
    write_scores(
        data.customer_ids,
        probabilities.astype(np.float64),
        class_names,
        output=target.output,
        table=target.table,
        source=node.bank.data if target.table is not None else None,
    )
    predicted = np.bincount(probabilities.argmax(axis=1), minlength=len(class_names))
    summary = {
        "bank": node.name,
        "federation": consortium.federation,
        "model_version": version,
        "customers_scored": int(probabilities.shape[0]),
        "predicted_per_class": {name: int(count) for name, count in zip(class_names, predicted, strict=True)},
        "written_to": target.describe(),
    }
    log.info("predict.written", **summary)
    return summary
