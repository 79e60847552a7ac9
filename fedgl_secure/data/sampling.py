"""Simulated institutions: which nodes each client holds and who takes part in a round (DESIGN §4)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedgl_secure.data.graph import GraphDataset, induced_subgraph
from fedgl_secure.errors import ConfigError
from fedgl_secure.seeding import numpy_stream

PAPER_PROPORTIONS: tuple[float, ...] = (0.3, 0.4, 0.5, 0.5, 0.6, 0.7)


def bank_name(client_id: int) -> str:
    """The consortium name of simulated client ``client_id`` (``bank-0``, ``bank-1``, …): what an in-process
    federation's banks sign receipts and keep ledgers under."""
    return f"bank-{client_id}"


def sample_client_nodes(
    num_nodes: int,
    proportions: Sequence[float],
    seed: int,
    overlap: float = 0.0,
) -> list[np.ndarray]:
    """Node sets of the clients, sorted.

    Client k samples ``round(p_k · n)`` nodes uniformly at random without replacement,
    independently of the other clients, so overlaps arise from sampling alone. With
    ``overlap > 0`` a common set of ``round(overlap · n)`` nodes is drawn first and forced into
    every client; each client then fills the rest of its quota from the remaining nodes.
    """
    if not proportions:
        raise ConfigError("proportions: at least one client is needed")
    for k, p in enumerate(proportions):
        if not 0.0 < p <= 1.0:
            raise ConfigError(f"proportions[{k}] = {p}: each proportion must be in (0, 1]")
    if not 0.0 <= overlap <= 1.0:
        raise ConfigError(f"overlap = {overlap}: must be in [0, 1]")
    common_size = int(round(overlap * num_nodes))
    common_rng = numpy_stream(seed, "sampling", "common")
    common = np.sort(common_rng.choice(num_nodes, size=common_size, replace=False))
    rest = np.setdiff1d(np.arange(num_nodes), common, assume_unique=True)
    node_sets = []
    for k, p in enumerate(proportions):
        size = int(round(p * num_nodes))
        if size < common_size:
            raise ConfigError(
                f"overlap = {overlap}: the common set ({common_size} nodes) is larger than "
                f"client {k}'s share ({size} nodes for proportion {p})"
            )
        rng = numpy_stream(seed, "sampling", "client", k)
        extra = rng.choice(rest, size=size - common_size, replace=False)
        node_sets.append(np.sort(np.concatenate([common, extra])))
    return node_sets


def make_clients(
    dataset: GraphDataset,
    proportions: Sequence[float],
    seed: int,
    overlap: float = 0.0,
) -> list[GraphDataset]:
    """Induced client subgraphs with the nodes' features, labels, split membership and ids."""
    node_sets = sample_client_nodes(dataset.num_nodes, proportions, seed, overlap)
    return [induced_subgraph(dataset, nodes, name=f"{dataset.name}/client-{k}") for k, nodes in enumerate(node_sets)]


def select_participants(num_clients: int, fraction: float, seed: int, round_number: int) -> list[int]:
    """Clients taking part in ``round_number``: all when ``fraction == 1``, else a seeded subset.

    At least one client always takes part. The choice depends only on (seed, round), so every
    party can recompute it.
    """
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"participation = {fraction}: must be in (0, 1]")
    if fraction >= 1.0:
        return list(range(num_clients))
    count = max(1, int(round(fraction * num_clients)))
    rng = numpy_stream(seed, "participation", round_number)
    return sorted(int(k) for k in rng.choice(num_clients, size=count, replace=False))
