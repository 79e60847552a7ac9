"""What a bank's round client calls on the aggregator, and the answers it reads.

:class:`AggregatorPort` is the aggregator as a bank sees it: over HTTP it is
:class:`~fedgl_secure.services.aggregator_client.AggregatorClient`; tests script it in-process. Its answers —
the open round (:class:`RoundResponse`), the union index (:class:`IndexView`) and a signed broadcast
(:class:`Served`) — are the aggregator's JSON and binary bodies as the bank reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.crypto.upload import RoundTicket
from fedgl_secure.methods.fed2gnn_relay import RelayPort


class RoundResponse(BaseModel):
    """The aggregator's answer to a bank's poll (``GET /v1/round``): the coordinator's ``RoundView``."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    phase: str
    federation: str
    round: int | None = None
    nonce: str | None = None
    base_version: int | None = None
    participants: list[str] = []
    shapes: dict[str, list[int]] = {}
    context_fingerprint: str = ""
    seconds_left: float | None = None
    latest_version: int | None = None
    stopped_reason: str | None = None  # set when phase == "finished" and the run stopped early
    final_version: int | None = None  # phase == "finished": the final model, once the aggregator has fixed it
    stage: str | None = None  # phase == "open": the round's stage whose kinds (shapes) it collects
    prior_rounds: list[int] = []  # the consortium label prior's fitted FedAvg rounds, in order
    policy_sha256: str = ""  # phase == "open": the aggregator's policy digest (Policy.digest)


def ticket_for(view: RoundResponse, policy_sha256: str) -> RoundTicket:
    """What a bank uploads into the open round ``view`` under its own policy (whose digest the view's must equal)."""
    return RoundTicket(
        view.federation, view.round, view.nonce, tuple(view.participants), view.context_fingerprint, policy_sha256
    )


class Served(NamedTuple):
    """A broadcast as the aggregator served it: the bytes and its signature over them (``broadcast_signature``)."""

    body: bytes
    signature: str | None


class IndexView(NamedTuple):
    """What a bank learns of the union index: M, its own positions, and the largest bank's size."""

    num_global_nodes: int
    positions: np.ndarray
    max_bank_nodes: int


class Withdrawal(Protocol):
    """The aggregator's answer to a withdrawal."""

    withdrawn: bool
    duplicate: bool  # the bank had already withdrawn; nothing changed


class AggregatorPort(RelayPort, Protocol):
    """The aggregator as a bank's round client calls it (Fed²GNN's set-up exchange included, :class:`RelayPort`).

    Errors are the coordinator's own: a 409 is :class:`~fedgl_secure.errors.ProtocolConflict` with its code; an
    unreachable aggregator or any other error a :class:`~fedgl_secure.errors.FedGLError`.
    """

    def enrol(self, num_features: int, num_classes: int, pseudonyms: Sequence[str]) -> None: ...

    def index(self) -> IndexView: ...

    def current_round(self) -> RoundResponse: ...

    def model(self, version: int) -> Served: ...

    def stage_model(self, round_number: int, stage: str) -> Served: ...

    def upload(self, round_number: int, kind: str, chunks: Sequence[bytes], receipt: Receipt) -> object: ...

    def report(self, version: int, counts: tuple[int, int, int, int], histograms: np.ndarray | None = None) -> None: ...

    def withdraw(self, round_number: int, reason: str) -> Withdrawal: ...
