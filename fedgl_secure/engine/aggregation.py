"""Aggregation rules (the client weights of Eq. 10; its average is ``model/averaging.py``) and the summation step
every secure backend replaces.

The engine only ever needs *sums* of pre-weighted client terms: ``Σ_k w_k X_k``. Keeping the
summation behind one small interface is what lets the plaintext simulation and the CKKS
consortium share every other line of the algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from fedgl_secure.errors import ConfigError

if TYPE_CHECKING:  # tenseal's import is paid only where a round is really encrypted
    from fedgl_secure.crypto.bank_encryption import BankEncryption, EncryptedTerms


def client_weight(num_nodes: int) -> float:
    """FedAvg's client weight ``w_k = N_k`` (the number of nodes the client holds)."""
    return float(num_nodes)


def normalise_contribution(contribution: Mapping[str, torch.Tensor], normaliser: float) -> dict[str, torch.Tensor]:
    """Every pre-weighted term divided by the public ``w_max = max_k w_k``, so a bank uploads ``ŵ_k·X_k`` with
    ``ŵ_k = w_k / w_max ∈ (0, 1]``.

    Eqs. 10, 12 and 14 are ratios of sums in which every term carries the same factor, so the fused
    results do not change; what changes is the range: with ``w_k = N_k`` the encrypted values grow with
    the bank (a 20,000-customer bank's embeddings crossed CKKS' 8.7e4 bound at scale 2^40), with ``ŵ_k``
    they stay within the values themselves. The DP step normalises the same way
    (:mod:`fedgl_secure.privacy.dp_round`).
    """
    if not normaliser > 0:
        raise ConfigError(f"aggregation: the weight normaliser w_max must be positive, got {normaliser}")
    return {kind: tensor / normaliser for kind, tensor in contribution.items()}


class Summation(Protocol):
    """Adds the clients' pre-weighted terms of one round, kind by kind (plaintext, or CKKS).

    ``contributions`` maps each participating client id to its ``{kind: tensor}`` terms; the
    round number and the sender ids are what a secure backend binds its receipts to. ``reference`` is
    the broadcast W̄ the terms were trained from: a secure backend encrypts the weights kind centred on
    it (:mod:`fedgl_secure.crypto.centring`) and returns the same sums.
    """

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]: ...


class RoundSum(Protocol):
    """One round's sum in the making: each client's terms added as the client finishes, the sums at the end. A
    context manager: leaving it before :meth:`result` abandons the round."""

    def add(self, client_id: int, contribution: Mapping[str, torch.Tensor] | EncryptedTerms) -> None: ...

    def result(self) -> dict[str, torch.Tensor]: ...

    def bank_encryption(self) -> BankEncryption | None:
        """How a bank encrypts its terms for this round where it runs (then :meth:`add` takes them encrypted), or
        None where the round is not encrypted."""
        ...

    def __enter__(self) -> RoundSum: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class StreamingSummation(Protocol):
    """A summation that starts on each client's terms as they come (the secure one encrypts a bank's upload while
    the next bank trains, as banks on their own machines would) instead of once all have come."""

    def open_round(
        self, round_number: int, participants: Sequence[int], reference: torch.Tensor | None = None
    ) -> RoundSum: ...


class CollectedRound:
    """A round for a summation that sums all terms at once: it collects them, and sums on :meth:`result`."""

    def __init__(self, summation: Summation, round_number: int, reference: torch.Tensor | None) -> None:
        self.summation, self.round_number, self.reference = summation, round_number, reference
        self.contributions: dict[int, Mapping[str, torch.Tensor]] = {}

    def __enter__(self) -> CollectedRound:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def add(self, client_id: int, contribution: Mapping[str, torch.Tensor]) -> None:
        self.contributions[client_id] = contribution

    def result(self) -> dict[str, torch.Tensor]:
        return self.summation(self.round_number, self.contributions, reference=self.reference)

    def bank_encryption(self) -> None:
        return None  # a summation of plain terms


def open_round(
    summation: Summation, round_number: int, participants: Sequence[int], reference: torch.Tensor | None = None
) -> RoundSum:
    """Round ``round_number``'s sum over ``participants``: streamed when ``summation`` can start on each client's
    terms as they come (:class:`StreamingSummation`), collected otherwise — the same sums either way."""
    if isinstance(summation, StreamingSummation):
        return summation.open_round(round_number, participants, reference)
    return CollectedRound(summation, round_number, reference)


class PlaintextSummation:
    """The simulation's summation: plain float64 addition, nothing hidden (and no range to keep within, so the
    weights are not centred on ``reference``)."""

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        return plaintext_sum([contributions[k] for k in sorted(contributions)])


def plaintext_sum(contributions: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Kind-wise sum of the clients' terms, in float64 so the order of clients does not matter."""
    if not contributions:
        raise ConfigError("aggregation: no client contributed to this round")
    kinds = set(contributions[0])
    for contribution in contributions[1:]:
        if set(contribution) != kinds:
            raise ConfigError(
                f"aggregation: clients uploaded different kinds {sorted(kinds)} vs {sorted(contribution)}"
            )
    return {
        kind: torch.stack([c[kind].to(torch.float64) for c in contributions]).sum(dim=0).to(torch.float32)
        for kind in sorted(kinds)
    }
