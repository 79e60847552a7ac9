"""Which graph a bank trains on: its own tables (bank-sources), its slice of a benchmark dataset (research mode), or
its Fed²GNN set-up (the seeded Louvain client it reconstructs from).

Every party derives the slices from the shared consortium file, in the consortium's bank order: bank k holds slice
(or Louvain client) k.
"""

from __future__ import annotations

from fedgl_secure.consortium.config import ConsortiumConfig, NodeConfig
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.partition import louvain_clients
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.sampling import make_clients
from fedgl_secure.data.sources.bank_data import BankData
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.methods.fed2gnn import BankReconstruction, bank_reconstruction, check_services


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


def fed2gnn_setup(node: NodeConfig, consortium: ConsortiumConfig) -> BankReconstruction:
    """This bank's Fed²GNN set-up (benchmark slices only: the seeded Louvain client of the experiment's dataset)."""
    config = consortium.experiment_config()
    check_services(config, bank_sources=consortium.bank_sources)
    client_index = bank_index(node, consortium)
    dataset = load_dataset(config.dataset, node.bank.data_root, seed=config.seed, split=config.data)
    return bank_reconstruction(config, dataset, client_index)
