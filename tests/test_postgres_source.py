"""A bank whose tables live in PostgreSQL (the production database of DESIGN §5.6), on a real server.

The server is a throw-away cluster started by :mod:`postgres_server` (as an unprivileged account when
the tests run as root); the tests are skipped, with the reason, only when no PostgreSQL binaries
exist or none starts.
"""

from __future__ import annotations

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from postgres_server import postgres_server  # noqa: F401  (the fixture)
from test_bank_sources import SCHEMA, generated_bank, load, write_files

from fedgl_secure.data.sources.declaration import SqlSource
from fedgl_secure.data.sources.scores import write_scores
from fedgl_secure.errors import DataSourceError

CUSTOMERS_DDL = """
    CREATE TABLE bank.customers (
        customer_id text PRIMARY KEY, customer_key text NOT NULL, label text,
        age double precision, balance numeric(14, 2), segment text, branch text
    )"""
TRANSACTIONS_DDL = """
    CREATE TABLE bank.transactions (
        id bigserial PRIMARY KEY, source_id text, target_id text, amount numeric(12, 2), "timestamp" timestamptz
    )"""


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture(scope="module")
def bank_database(postgres_server):  # noqa: F811
    """A database with schema ``bank`` holding generated customers and transactions; and the same rows."""
    customers, transactions = generated_bank(np.random.default_rng(11), n=80)
    url = postgres_server.create_database("bank_a")
    with psycopg.connect(_dsn(url)) as db:
        db.execute("CREATE SCHEMA bank")
        db.execute(CUSTOMERS_DDL)
        db.execute(TRANSACTIONS_DDL)
        with db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO bank.customers VALUES (%s, %s, %s, %s, %s, %s, 'main street')",
                [tuple(row.values()) for row in customers.to_pylist()],
            )
            cursor.executemany(
                "INSERT INTO bank.transactions (source_id, target_id, amount, timestamp) VALUES (%s, %s, %s, %s)",
                [tuple(row.values()) for row in transactions.to_pylist()],
            )
    return url, customers, transactions


def _assert_same_bank(ours, reference) -> None:
    assert np.array_equal(ours.graph.features.toarray(), reference.graph.features.toarray())
    for attribute in ("labels", "edge_index", "train_mask", "val_mask", "test_mask", "node_ids"):
        assert np.array_equal(getattr(ours.graph, attribute), getattr(reference.graph, attribute)), attribute
    assert np.array_equal(ours.customer_ids, reference.customer_ids)
    for count in ("customers", "labelled", "split", "transactions_read", "edges_kept", "dropped_unknown_customer"):
        assert getattr(ours.summary, count) == getattr(reference.summary, count), count


def test_postgres_tables_load_exactly_like_the_same_rows_in_parquet(bank_database, tmp_path):
    url, customers, transactions = bank_database
    from_parquet = load(write_files(tmp_path, customers, transactions))
    from_postgres = load(SqlSource(kind="sql", url=url, customers="bank.customers", transactions="bank.transactions"))
    assert from_postgres.summary.customers == 80 and from_postgres.summary.dropped_unknown_customer > 0
    _assert_same_bank(from_postgres, from_parquet)
    assert from_postgres.summary.time_range[0].startswith("2024-01-01")  # timestamptz read and reported


def test_postgres_queries_load_like_tables(bank_database, tmp_path, monkeypatch):
    url, customers, transactions = bank_database
    monkeypatch.setenv("BANK_A_DATABASE_URL", url)
    by_query = load(
        SqlSource(
            kind="sql",
            url_env="BANK_A_DATABASE_URL",
            customers_query="SELECT c.*, length(c.branch) AS unused FROM bank.customers AS c ORDER BY c.customer_id",
            transactions_query="SELECT * FROM bank.transactions WHERE amount >= 0 ORDER BY id;",
        )
    )
    _assert_same_bank(by_query, load(write_files(tmp_path, customers, transactions)))


def test_a_missing_postgres_table_or_column_is_named(bank_database):
    url, _, _ = bank_database
    with pytest.raises(DataSourceError, match=r"table bank\.clients: no such table in database postgresql"):
        load(SqlSource(kind="sql", url=url, customers="bank.clients", transactions="bank.transactions"))
    with pytest.raises(DataSourceError, match=r"customers_query: column 'segment' is missing"):
        load(
            SqlSource(
                kind="sql",
                url=url,
                customers_query="SELECT customer_id, customer_key, label, age, balance FROM bank.customers",
                transactions="bank.transactions",
            )
        )


def _scores(url: str) -> list[tuple]:
    with psycopg.connect(_dsn(url)) as db:
        return db.execute("SELECT customer_id, p_good, p_fraud, predicted_class FROM bank.scores ORDER BY 1").fetchall()


def _tables(url: str) -> set[str]:
    with psycopg.connect(_dsn(url)) as db:
        rows = db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'bank'").fetchall()
    return {name for (name,) in rows}


def test_scores_go_back_into_postgres_and_a_failed_write_keeps_the_previous_ones(bank_database):
    url, _, _ = bank_database
    source = SqlSource(kind="sql", url=url, customers="bank.customers", transactions="bank.transactions")
    ids = np.array(["A-0001", "A-0002"])
    write_scores(ids, np.array([[0.75, 0.25], [0.125, 0.875]]), ["good", "fraud"], table="bank.scores", source=source)
    first = [("A-0001", 0.75, 0.25, "good"), ("A-0002", 0.125, 0.875, "fraud")]
    assert _scores(url) == first
    write_scores(ids[::-1], np.array([[0.5, 0.5], [1.0, 0.0]]), ["good", "fraud"], table="bank.scores", source=source)
    second = [("A-0001", 1.0, 0.0, "good"), ("A-0002", 0.5, 0.5, "good")]
    assert _scores(url) == second
    # PostgreSQL refuses text with a NUL byte: the insert fails half-way through the new scores
    broken = np.array(["A-0001", "A-\x00-0002"])
    with pytest.raises(DataSourceError, match=r"table bank\.scores .*cannot write the scores.*unchanged"):
        write_scores(broken, np.array([[0.0, 1.0], [0.0, 1.0]]), ["good", "fraud"], table="bank.scores", source=source)
    assert _scores(url) == second
    # a view on the old scores makes PostgreSQL refuse to drop them, after the new ones are staged
    with psycopg.connect(_dsn(url)) as db:
        db.execute("CREATE VIEW bank.risky AS SELECT customer_id FROM bank.scores WHERE p_fraud > 0.5")
    with pytest.raises(DataSourceError, match=r"table bank\.scores .*cannot write the scores \(cannot drop table"):
        write_scores(ids, np.array([[0.0, 1.0], [0.0, 1.0]]), ["good", "fraud"], table="bank.scores", source=source)
    assert _scores(url) == second
    assert _tables(url) == {"customers", "transactions", "scores"}  # no staging table left behind


def test_reading_from_postgres_streams_in_batches(bank_database, monkeypatch):
    """Rows arrive in several record batches (``yield_per``), and the batches agree on their types."""
    from fedgl_secure.data.sources import tables

    monkeypatch.setattr(tables, "BATCH_ROWS", 7)
    url, _, _ = bank_database
    table = tables.read_table(
        SqlSource(kind="sql", url=url, customers="bank.customers", transactions="bank.transactions"),
        "customers",
        SCHEMA.customer_columns(),
    ).table
    assert table.num_rows == 80 and table.column("age").num_chunks >= 80 // 7
    assert pa.types.is_decimal(table.column("balance").type)
