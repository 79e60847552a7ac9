"""One bank's own customer graph, read from its declared tables and checked against the consortium's schema.

:func:`load_bank_data` reads the customers table (one node per customer, encoded by
:mod:`~fedgl_secure.data.sources.encode`) and the transactions table (one row per transfer, by the
bank's own customer ids), and returns a :class:`~fedgl_secure.data.graph.GraphDataset` whose
``node_ids`` are the **shared customer keys** — what is pseudonymised and joined into the union index
across banks — with the bank's own ids kept alongside (row order) for scoring output.

Transactions become an undirected, unweighted graph: ``a → b`` and ``b → a`` and repeated transfers
are one edge (the GCN of DESIGN §3 uses the binary symmetric adjacency). A transfer whose other end is
not a customer of this bank (a customer of another bank, an account the bank does not score) is
dropped and counted. The amount and time columns, when the schema names them, are validated (an
amount must be a finite number >= 0) and summarised (range), **but not yet used by the model**.
A transfer from a customer to itself is an error: it is almost always a broken extract.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.sources.bank_data import BankData, DegreeSummary, SourceSummary
from fedgl_secure.data.sources.declaration import DataSource
from fedgl_secure.data.sources.encode import (
    EncodedCustomers,
    encode_customers,
    first_true,
    id_strings,
    numeric_values,
    where,
)
from fedgl_secure.data.sources.schema import SPLIT_VALUES, FeatureSchema
from fedgl_secure.data.sources.tables import SourceTable, read_customers, read_transactions
from fedgl_secure.errors import DataSourceError
from fedgl_secure.log import get_logger


@dataclass(frozen=True)
class _Edges:
    edge_index: np.ndarray
    read: int
    dropped: int
    merged: int
    amount_range: tuple[float, float] | None
    time_range: tuple[str, str] | None


def _endpoints(transactions: SourceTable, schema: FeatureSchema, ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Node index of each transaction's source and target (``-1``: not a customer of this bank)."""
    columns = schema.transactions
    origin, table = transactions.origin, transactions.table
    source, target = (
        id_strings(table.column(column), origin=origin, name=column, what=what)
        for column, what in ((columns.source_column, "source id"), (columns.target_column, "target id"))
    )
    if (row := first_true(pc.equal(source, target))) is not None:
        raise DataSourceError(
            f"{where(origin, row, columns.target_column)}: a transfer from customer {source[row].as_py()!r} "
            "to itself (a broken extract?); remove it"
        )
    return (
        pc.index_in(source, value_set=ids).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64),
        pc.index_in(target, value_set=ids).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64),
    )


def _amount_range(transactions: SourceTable, column: str | None) -> tuple[float, float] | None:
    if column is None:
        return None
    amounts = numeric_values(transactions.table.column(column), origin=transactions.origin, name=column)
    if (row := first_true(~np.isfinite(amounts) | (amounts < 0))) is not None:
        problem = "missing" if np.isnan(amounts[row]) else f"{amounts[row]}"
        raise DataSourceError(
            f"{where(transactions.origin, row, column)}: amount {problem}; an amount must be a finite number >= 0"
        )
    return (float(amounts.min()), float(amounts.max())) if amounts.size else None


def _time_range(transactions: SourceTable, column: str | None) -> tuple[str, str] | None:
    if column is None or transactions.num_rows == 0:
        return None
    extremes = pc.min_max(transactions.table.column(column))
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low is None:
        return None
    return tuple(value.isoformat() if hasattr(value, "isoformat") else str(value) for value in (low, high))


def _edges(transactions: SourceTable, schema: FeatureSchema, customers: EncodedCustomers) -> _Edges:
    ids = pa.array(customers.ids, pa.string())
    source, target = _endpoints(transactions, schema, ids)
    amount_range = _amount_range(transactions, schema.transactions.amount_column)
    time_range = _time_range(transactions, schema.transactions.time_column)
    known = (source >= 0) & (target >= 0)
    edge_index = canonical_edge_index(source[known], target[known], customers.num_customers)
    kept_transfers = int(known.sum())
    return _Edges(
        edge_index=edge_index,
        read=transactions.num_rows,
        dropped=transactions.num_rows - kept_transfers,
        merged=kept_transfers - edge_index.shape[1] // 2,
        amount_range=amount_range,
        time_range=time_range,
    )


def load_bank_data(source: DataSource, schema: FeatureSchema, *, name: str, seed: int = 0) -> BankData:
    """Read, validate and encode a bank's customers and transactions (see the module docstring).

    ``seed`` keys the hash that splits labelled customers when there is no split column; every bank
    of a consortium must use the same one (the experiment's seed).

    Raises:
        DataSourceError: a table is missing or unreadable, or a value does not match the schema
            (the message names the file/table, the row and the column).
    """
    log = get_logger(bank=name, kind=source.kind)
    started = time.perf_counter()
    customers_table = read_customers(source, schema)
    log.debug("bank_data.customers_read", rows=customers_table.num_rows, source=customers_table.origin)
    customers_origin = customers_table.origin
    customers = encode_customers(customers_table.table, schema, origin=customers_origin, seed=seed)
    del customers_table  # the Arrow columns are no longer needed; free them before reading transfers
    transactions = read_transactions(source, schema)
    log.debug("bank_data.transactions_read", rows=transactions.num_rows, source=transactions.origin)
    edges = _edges(transactions, schema, customers)
    graph = GraphDataset(
        name=name,
        features=sp.csr_matrix(customers.features),
        labels=customers.labels,
        edge_index=edges.edge_index,
        train_mask=customers.train_mask,
        val_mask=customers.val_mask,
        test_mask=customers.test_mask,
        num_classes=schema.num_classes,
        node_ids=customers.keys,
    )
    counts = np.bincount(customers.labels[customers.labels >= 0], minlength=schema.num_classes)
    summary = SourceSummary(
        bank=name,
        customers_source=customers_origin,
        transactions_source=transactions.origin,
        customers=customers.num_customers,
        feature_width=schema.num_features,
        labelled={label: int(count) for label, count in zip(schema.label_classes, counts, strict=True)},
        unlabelled=int((customers.labels < 0).sum()),
        split={
            split: int(mask.sum())
            for split, mask in zip(
                SPLIT_VALUES, (customers.train_mask, customers.val_mask, customers.test_mask), strict=True
            )
        },
        transactions_read=edges.read,
        edges_kept=int(edges.edge_index.shape[1] // 2),
        dropped_unknown_customer=edges.dropped,
        repeats_merged=edges.merged,
        degree=DegreeSummary.of(edges.edge_index, customers.num_customers),
        amount_range=edges.amount_range,
        time_range=edges.time_range,
        seconds=round(time.perf_counter() - started, 3),
    )
    log.info(
        "bank_data.loaded",
        customers=summary.customers,
        edges=summary.edges_kept,
        dropped=summary.dropped_unknown_customer,
        seconds=summary.seconds,
    )
    return BankData(graph=graph, customer_ids=customers.ids, summary=summary)
