"""Fed²GNN's neighbour exchange as a consortium set-up phase (:data:`~fedgl_secure.method_registry.NEIGHBOUR_EXCHANGE`,
declared by the method's spec): the aggregator relays it, the banks run it before they enrol.

The aggregator's side holds the relay (``methods/fed2gnn_relay.py``) that the exchange routes serve
(``Coordinator.exchange``) — in memory: a restarted aggregator has a fresh nonce, and banks still exchanging start
again. A bank's side runs the exchange and enrols its reconstructed graph (``bank_exchange.py``); what it needs from
the node's wiring (its share of the exchange and who it is in it) comes as the phase's input.
"""

from __future__ import annotations

import threading

from fedgl_secure.consortium.bank_exchange import reconstruct
from fedgl_secure.consortium.phases import AggregatorParts, AggregatorPhase, BankParts, BankPhase
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.fed2gnn import signal_width
from fedgl_secure.methods.fed2gnn_relay import ExchangeRelay


class ExchangeRelayPhase(AggregatorPhase):
    """The aggregator's side: the relay, and its progress in the aggregator's status (``exchange``)."""

    def __init__(self, parts: AggregatorParts) -> None:
        super().__init__(parts)
        config = parts.config
        width = signal_width(config, 0) if config.fed2gnn.projection_dim > 0 else None
        self.relay = ExchangeRelay(parts.federation, parts.banks, config.fed2gnn.hops, width, parts.signing_keys)

    def status(self) -> dict[str, object]:
        return {"exchange": self.relay.progress()}


class NeighbourExchange(BankPhase):
    """A bank's side: the exchange through the relay, then the graph it enrols is its reconstruction."""

    def __init__(self, parts: BankParts) -> None:
        super().__init__(parts)
        if parts.inputs is None:
            raise ConfigError(f"{parts.name}: method {parts.config.method!r} and the Fed²GNN set-up must come together")

    def before_enrolment(self, graph: GraphDataset, stop: threading.Event) -> GraphDataset:
        parts = self.parts
        return reconstruct(
            parts.inputs, parts.aggregator, parts.config, parts.state_dir, parts.poll_seconds, parts.log, stop
        )
