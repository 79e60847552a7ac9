"""Fed²GNN's set-up at a bank, before it enrols: the bank-to-bank exchange through the aggregator's relay
(``methods/fed2gnn_relay.py``), then the local reconstruction of its graph.

The exchange's sums are kept in the bank's state directory (``fed2gnn-exchange.npz``), so a restarted bank rebuilds
the same graph without a second exchange; while the exchange is under way its key is kept there too
(``fed2gnn-exchange.key``), so a restart republishes the same key.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fedgl_secure.consortium.aggregator_port import AggregatorPort
from fedgl_secure.consortium.bank_state import EXCHANGE_FILE, EXCHANGE_KEY_FILE, load_exchange_sums
from fedgl_secure.consortium.retry import StopRequested, retry_until_ready
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.fileio import write_arrays_atomically
from fedgl_secure.methods.fed2gnn import BankReconstruction
from fedgl_secure.methods.fed2gnn_relay import BankIdentity, ExchangeKeyFile, run_bank_exchange

EXCHANGE_TIMEOUT_SECONDS = 3600.0  # how long a bank retries the exchange while the aggregator is unreachable


def reconstruct(
    reconstruction: tuple[BankReconstruction, BankIdentity],
    aggregator: AggregatorPort,
    config: ExperimentConfig,
    state_dir: Path | None,
    poll_seconds: float,
    log,
    stop: threading.Event,
) -> GraphDataset:
    """Fed²GNN's set-up: the bank-to-bank exchange through the aggregator (``methods/fed2gnn_relay.py``), then the
    local reconstruction. The sums are kept in the state directory, so a restarted bank rebuilds the same graph
    without a second exchange."""
    setup, identity = reconstruction
    saved = None if state_dir is None else load_exchange_sums(state_dir, config.fed2gnn.hops)
    if saved is not None:
        boundary, received = saved
        log.info("fed2gnn.exchange_reused", boundary=int(boundary.size))
    else:

        def wait() -> None:
            if stop.wait(poll_seconds):
                raise StopRequested("stopped during the Fed²GNN exchange")

        started = time.perf_counter()
        key_for = None if state_dir is None else ExchangeKeyFile(state_dir / EXCHANGE_KEY_FILE).key_for
        hops = config.fed2gnn.hops
        boundary, received = retry_until_ready(
            lambda: run_bank_exchange(setup.bank, identity, aggregator, hops, wait, key_for),
            "the Fed²GNN exchange",
            log,
            timeout=EXCHANGE_TIMEOUT_SECONDS,
            stop=stop,
        )
        if state_dir is not None:
            levels = {f"level_{k}": e for k, e in enumerate(received, start=1)}
            write_arrays_atomically(state_dir / EXCHANGE_FILE, boundary=boundary, **levels)
            (state_dir / EXCHANGE_KEY_FILE).unlink(missing_ok=True)  # the sums are kept: the key is not needed
        log.info("fed2gnn.exchanged", boundary=int(boundary.size), seconds=round(time.perf_counter() - started, 3))
    graph = setup.augment(boundary, received, config)
    log.info("fed2gnn.reconstructed", nodes=graph.num_nodes, own=int(setup.bank.nodes.size))
    return graph
