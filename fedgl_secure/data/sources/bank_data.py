"""What a bank's loaded data holds: its graph, its own customer ids in node order, and a summary in counts.

Apart from the reading (:mod:`~fedgl_secure.data.sources.bank_graph`, which needs pyarrow and SQLAlchemy), so
that a bank node of a benchmark slice, which reads no tables, does not import them at start-up (about a tenth of a
bank node's start-up imports, measured with ``python -X importtime``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from fedgl_secure.data.graph import GraphDataset


@dataclass(frozen=True)
class DegreeSummary:
    """Degrees of the kept undirected graph (number of distinct counterparties per customer)."""

    min: int
    median: float
    mean: float
    max: int
    isolated: int

    @classmethod
    def of(cls, edge_index: np.ndarray, num_nodes: int) -> DegreeSummary:
        if num_nodes == 0:
            return cls(0, 0.0, 0.0, 0, 0)
        degree = np.bincount(edge_index[0], minlength=num_nodes)
        return cls(
            min=int(degree.min()),
            median=float(np.median(degree)),
            mean=round(float(degree.mean()), 4),
            max=int(degree.max()),
            isolated=int((degree == 0).sum()),
        )


@dataclass(frozen=True)
class SourceSummary:
    """What a bank contributes, in counts only (never an id or a value): printed by ``data check`` and
    logged by the bank node when it loads its data."""

    bank: str
    customers_source: str
    transactions_source: str
    customers: int
    feature_width: int
    labelled: dict[str, int]
    unlabelled: int
    split: dict[str, int]
    transactions_read: int
    edges_kept: int
    dropped_unknown_customer: int
    repeats_merged: int
    degree: DegreeSummary
    amount_range: tuple[float, float] | None = None
    time_range: tuple[str, str] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready (tuples as lists)."""
        values = asdict(self)
        for key in ("amount_range", "time_range"):
            if values[key] is not None:
                values[key] = list(values[key])
        return values


@dataclass(frozen=True)
class BankData:
    """A bank's graph, its own customer ids in node order (for scores), and what was read.

    ``summary`` is None for a benchmark slice (research mode), which has no tables of its own.
    """

    graph: GraphDataset
    customer_ids: np.ndarray
    summary: SourceSummary | None
