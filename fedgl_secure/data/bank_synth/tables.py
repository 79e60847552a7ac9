"""A bank's customers and transactions as Arrow tables, built from the population and the transfers it sees.

Column names come from the consortium schema (:mod:`.schema`); bank-level features are drawn here,
person-level ones gathered from :class:`~.population._Population`. Nothing here touches the disk:
:mod:`.writers` does.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from fedgl_secure.data.bank_synth.population import _Population, _Transfers
from fedgl_secure.data.bank_synth.schema import LABELS, REGIONS, SEGMENTS, SPLITS
from fedgl_secure.data.bank_synth.strings import _coded_strings
from fedgl_secure.data.sources.schema import FeatureSchema

TIMESTAMP_TYPE = pa.timestamp("s", tz="UTC")


def _customers_table(
    schema: FeatureSchema, population: _Population, bank: int, ids: pa.StringArray, rng: np.random.Generator
) -> pa.Table:
    """The bank's customers table: person-level columns gathered, bank-level features drawn here."""
    rows = population.members[bank]
    n = len(rows)
    f = population.fraud[rows]
    label = np.where(population.labelled[rows], f.astype(np.int8), np.int8(-1))
    balance = np.round(np.where(f, rng.lognormal(7.2, 1.9, n), rng.lognormal(7.8, 1.6, n)), 2)
    balance[rng.random(n) < np.where(f, 0.10, 0.05)] = 0.0
    account_age = np.maximum(1, np.where(f, rng.lognormal(6.0, 1.1, n), rng.lognormal(7.0, 0.9, n))).astype(np.int64)
    card_tx = rng.poisson(np.where(f, rng.lognormal(3.0, 0.9, n), rng.lognormal(2.6, 0.7, n)))
    products = 1 + rng.poisson(np.where(f, 0.6, 1.2))
    income = population.income[rows]
    columns = {
        schema.id_column: ids,
        schema.customer_key_column: population.keys.take(pa.array(rows)),
        schema.label_column: _coded_strings(label, LABELS),
        "split": _coded_strings(population.split[rows], SPLITS),
        "age": pa.array(population.age[rows]),
        "monthly_income": pa.array(income, mask=np.isnan(income)),
        "balance": pa.array(balance),
        "account_age_days": pa.array(account_age),
        "card_tx_30d": pa.array(card_tx.astype(np.int64)),
        "num_products": pa.array(products.astype(np.int64)),
        "segment": _coded_strings(population.segment[rows], SEGMENTS),
        "region": _coded_strings(population.region[rows], REGIONS),
    }
    return pa.table(columns)


def _transactions_table(
    schema: FeatureSchema, transfers: _Transfers, local_row: np.ndarray, ids: pa.StringArray
) -> pa.Table:
    """The bank's transactions table (by the bank's own ids), ordered by time as a ledger is."""
    order = np.argsort(transfers.time, kind="stable")
    t = schema.transactions
    return pa.table(
        {
            t.source_column: ids.take(pa.array(local_row[transfers.source[order]])),
            t.target_column: ids.take(pa.array(local_row[transfers.target[order]])),
            t.amount_column: pa.array(transfers.amount[order]),
            t.time_column: pa.array(transfers.time[order]).cast(TIMESTAMP_TYPE),
        }
    )
