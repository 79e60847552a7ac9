"""A seeded, bank-like consortium on disk: every bank's own customers and transactions tables (issue 9, item 5).

Banks want to try the framework on data shaped like theirs before they point it at the real thing. This
package writes, for ``N`` banks, the two tables a bank declares in its node file (DESIGN §5.6), in
the bank's own format (Parquet, CSV or one SQLite database), plus the consortium ``[schema]`` those
tables match. It is a pure library: ``fedgl-secure data synth`` is the thin command over it.

Model (all draws from ``numpy.random.default_rng`` streams spawned from ``seed``, in a fixed order,
so one seed gives the same rows every time):

* **Persons.** Each bank holds ``customers`` persons. ``k = round(shared_fraction · customers)`` of
  them are shared: of those, ``m = ⌊0.8 k / (N − 1)⌋`` per other bank are held by exactly that pair
  of banks and the remaining ``g = k − (N − 1) m`` by every bank; the rest are the bank's alone. So
  a bank's shared count is exactly ``k`` and the population has
  ``P = N (customers − k) + C(N, 2) m + g`` persons. A person's **customer key** (think "hashed
  national id") is a keyed 64-bit bijection of the person's index (16 hex digits), identical at every
  bank; the **customer id** is each bank's own (``A-0000123`` at ``bank-a``, ``B-0004711`` at ``bank-b``).
* **Labels.** A share ``fraud_rate`` of the persons are fraudsters and a share ``labelled_fraction``
  carry their label (``good``/``fraud``; the others a null label), both drawn by systematic sampling
  within each group of banks (and label), so every bank's realised rates equal the asked ones up to
  rounding even at a few thousand customers. Label and split are properties of the *person*, so a
  shared person has the same label and the same split (60/20/20 of the labelled, stratified by
  class) at every bank, and no test label leaks through another bank.
* **Features.** Person-level (the same at every bank): age, monthly income (2 % unknown), segment,
  region. Bank-level (drawn per bank): balance, account age, card transactions in 30 days, number of
  products. Fraudsters' distributions are shifted (younger, newer accounts, lower balances, more
  often abroad ...) but overlap the others': features alone separate them clearly but not
  perfectly. The schema's centres and scales come from these known distributions, never from
  generated rows, so the schema carries no bank's statistics.
* **Transactions.** At every bank: background relationships between its customers with endpoints
  drawn by a heavy-tailed activity weight (``2.6 · customers`` of them), fraud **rings** (the bank's
  fraudsters in groups of 3-8, each sending to 2 ring members) and **victim** payments (legitimate
  customers paying fraudsters). Rings and half of the background relationships are person-level
  relationships: a relationship between two persons appears at *every* bank that holds both (the
  population graph projected onto each bank, which also links the banks' shared customers); the
  other half are bank-local. Every relationship is 1 or more transfers (geometric, mean 1.43) with
  their own amount and time in a 90-day window from 2024-01-01 UTC; ring transfers are larger and
  burst within two weeks. No self-transfers; repeated transfers between a pair are kept (readers
  merge them). Measured (3 banks): about 8 transfers per customer (5.6 distinct counterparties);
  of the transfers touching a fraudster, ~0.25 join two fraudsters (40 % of a fraudster's
  counterparties are fraudsters) at a 3 % fraud rate; logistic regression on the features alone
  reaches ROC-AUC ~0.85-0.9.

Layout of ``out_dir``::

    schema.toml                    [schema] of the consortium file, exactly
    manifest.json                  parameters and realised counts; written last
    bank-a/customers.parquet       (or .csv) one row per customer, columns in schema order
    bank-a/transactions.parquet    (or .csv) source_id, target_id, amount, timestamp, ordered by time
    bank-b/bank.sqlite             (sqlite) tables customers and transactions

Timestamps are UTC: a Parquet timestamp (stored in milliseconds), ``2024-01-01 06:44:10Z`` in CSV,
``2024-01-01 06:44:10`` text in SQLite. A missing value (label, split, income) is a null, an empty
CSV cell, an SQL NULL.

Every file is written to ``<name>.tmp`` and renamed, so an interrupted run never leaves a file that
looks complete; a marker holding the parameters is written first and removed after the manifest, so
the same command can finish an interrupted run. An ``out_dir`` holding anything else, or a previous
output of other parameters, is refused: a bank's files are never overwritten silently.

Cost: fully vectorised (numpy, pyarrow); a loop runs over banks, never over customers or edges.

Modules, each importing only those above it in this list: ``parameters`` (what a run is asked and
reports), ``schema`` (the consortium ``[schema]``), ``strings`` (Arrow string columns),
``population`` (persons, memberships, relationships, fraud rings), ``tables`` (a bank's Arrow
tables), ``writers`` (files, SQLite, resuming). This ``__init__`` is the entry point:
:func:`synthesize_banks` runs them in order, and the public names are imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedgl_secure.data.bank_synth.parameters import (
    FORMATS,
    GENERATOR,
    GENERATOR_VERSION,
    MAX_BANKS,
    SCHEMA_FILE,
    BankSummary,
    Format,
    SynthParameters,
    SynthSummary,
    _validated,
    bank_name,
)
from fedgl_secure.data.bank_synth.population import _bank_relationships, _Population, _population, _Transfers
from fedgl_secure.data.bank_synth.schema import schema_document, schema_toml, synthetic_bank_schema
from fedgl_secure.data.bank_synth.strings import _customer_ids
from fedgl_secure.data.bank_synth.tables import _customers_table, _transactions_table
from fedgl_secure.data.bank_synth.writers import MANIFEST_FILE, MARKER_FILE, _existing_output, _write_tables
from fedgl_secure.fileio import write_atomically
from fedgl_secure.log import get_logger

__all__ = [
    "FORMATS",
    "MAX_BANKS",
    "BankSummary",
    "Format",
    "SynthParameters",
    "SynthSummary",
    "bank_name",
    "schema_document",
    "schema_toml",
    "synthesize_banks",
    "synthetic_bank_schema",
]


def synthesize_banks(
    out_dir: Path,
    *,
    banks: int,
    customers: int,
    seed: int = 0,
    fmt: Format = "parquet",
    shared_fraction: float = 0.3,
    fraud_rate: float = 0.03,
    labelled_fraction: float = 0.6,
) -> SynthSummary:
    """Write ``banks`` banks' customers and transactions tables, ``schema.toml`` and ``manifest.json`` to ``out_dir``.

    ``customers`` is per bank. A complete previous output of the same parameters is left as it is
    (the summary says ``already_there``); anything else already in ``out_dir`` is refused with a
    :class:`ConfigError` naming the parameter or the difference.
    """
    out_dir = Path(out_dir)
    parameters = _validated(
        seed=seed,
        banks=banks,
        customers=customers,
        fmt=fmt,
        shared_fraction=shared_fraction,
        fraud_rate=fraud_rate,
        labelled=labelled_fraction,
    )
    log = get_logger(component="bank_synth", out_dir=str(out_dir))
    if (existing := _existing_output(out_dir, parameters)) is not None:
        log.info("synth output already there", **parameters.to_dict())
        return existing
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = {"generator": GENERATOR, "version": GENERATOR_VERSION, "parameters": parameters.to_dict()}
    write_atomically(out_dir / MARKER_FILE, json.dumps(marker).encode())

    schema = synthetic_bank_schema()
    streams = np.random.SeedSequence(parameters.seed).spawn(1 + 2 * parameters.banks)
    population = _population(parameters, np.random.default_rng(streams[0]))
    persons = len(population.fraud)
    log.info("population drawn", persons=persons, fraudsters=int(population.fraud.sum()))

    drawn = [_bank_relationships(population, b, np.random.default_rng(streams[1 + b])) for b in range(parameters.banks)]
    summaries = []
    for b in range(parameters.banks):
        name = bank_name(b)
        rows = population.members[b]
        holds = np.zeros(persons, dtype=bool)
        holds[rows] = True
        seen = [transfers.select(holds[transfers.source] & holds[transfers.target]) for transfers, _ in drawn]
        transfers = _Transfers.concatenate([*seen, drawn[b][1]])
        local_row = np.full(persons, -1, dtype=np.int32)
        local_row[rows] = np.arange(len(rows), dtype=np.int32)
        ids = _customer_ids(name.removeprefix("bank-").upper(), len(rows))
        customers_table = _customers_table(
            schema, population, b, ids, np.random.default_rng(streams[1 + parameters.banks + b])
        )
        transactions_table = _transactions_table(schema, transfers, local_row, ids)
        files = _write_tables(out_dir / name, parameters.format, customers_table, transactions_table)
        summaries.append(_bank_summary(name, population, rows, transfers, files))
        log.info(
            "bank written",
            bank=name,
            customers=len(rows),
            transactions=transactions_table.num_rows,
            bank_index=b + 1,
            of=parameters.banks,
        )
        del customers_table, transactions_table, transfers, seen

    write_atomically(out_dir / SCHEMA_FILE, schema_toml(schema).encode())
    summary = SynthSummary(
        out_dir=out_dir,
        parameters=parameters,
        persons=persons,
        shared_persons=int((population.bank_count >= 2).sum()),
        fraud_rate=round(float(population.fraud.mean()), 6),
        banks=tuple(summaries),
    )
    write_atomically(out_dir / MANIFEST_FILE, (json.dumps(summary.manifest(), indent=2) + "\n").encode())
    (out_dir / MARKER_FILE).unlink(missing_ok=True)
    return summary


def _bank_summary(
    name: str, population: _Population, rows: np.ndarray, transfers: _Transfers, files: dict[str, int]
) -> BankSummary:
    """Realised counts of one bank (homophily over all transfers, by the persons' true labels)."""
    labelled = population.labelled[rows]
    fraud = int((population.fraud[rows] & labelled).sum())
    source_fraud, target_fraud = population.fraud[transfers.source], population.fraud[transfers.target]
    touching = int((source_fraud | target_fraud).sum())
    return BankSummary(
        name=name,
        customers=len(rows),
        transactions=len(transfers.source),
        shared_customers=int((population.bank_count[rows] >= 2).sum()),
        labelled=int(labelled.sum()),
        fraud=fraud,
        fraud_rate=round(fraud / max(1, int(labelled.sum())), 6),
        mean_degree=round(2 * len(transfers.source) / len(rows), 4),
        fraud_edge_homophily=round(int((source_fraud & target_fraud).sum()) / max(1, touching), 6),
        files=files,
    )
