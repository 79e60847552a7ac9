"""A bank's own tables (Parquet, CSV, SQLite) read against the consortium's schema: encoding, graph,
clear errors naming file/row/column, the keyed split, ``data check`` and writing scores back."""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.data.graph import canonical_edge_index
from fedgl_secure.data.sources import scores as scores_module
from fedgl_secure.data.sources.bank_data import BankData
from fedgl_secure.data.sources.bank_graph import load_bank_data
from fedgl_secure.data.sources.declaration import FileSource, SqlSource
from fedgl_secure.data.sources.encode import keyed_unit_interval
from fedgl_secure.data.sources.schema import FeatureSchema
from fedgl_secure.data.sources.scores import write_scores
from fedgl_secure.data.sources.tables import read_customers
from fedgl_secure.errors import ConfigError, DataSourceError

SCHEMA_VALUES = {
    "id_column": "customer_id",
    "key_column": "customer_key",
    "label_column": "label",
    "label_classes": ["good", "fraud"],
    "features": [
        {"name": "age", "type": "numeric", "center": 40.0, "scale": 10.0, "clip": 2.0},
        {"name": "balance", "type": "numeric", "log1p": True, "center": 1.0, "scale": 2.0},
        {"name": "segment", "type": "categorical", "categories": ["retail", "sme"]},
    ],
    "transactions": {
        "source_column": "source_id",
        "target_column": "target_id",
        "amount_column": "amount",
        "time_column": "timestamp",
    },
}


def make_schema(**changes) -> FeatureSchema:
    return FeatureSchema.model_validate({**SCHEMA_VALUES, **changes})


SCHEMA = make_schema()


def three_customers(**columns) -> pa.Table:
    values = {
        "customer_id": ["c1", "c2", "c3"],
        "customer_key": ["k1", "k2", "k3"],
        "label": ["good", None, "fraud"],
        "age": [40.0, 65.0, 20.0],
        "balance": [0.0, math.e - 1.0, math.e**3 - 1.0],
        "segment": ["retail", "sme", "retail"],
        "notes": ["x", "y", "z"],  # a column the schema does not name: never read
    }
    values.update(columns)
    return pa.table(values)


def transactions_of(rows: list[tuple]) -> pa.Table:
    source, target, amount = (list(column) for column in zip(*rows, strict=True)) if rows else ([], [], [])
    return pa.table(
        {
            "source_id": pa.array(source, pa.string()),
            "target_id": pa.array(target, pa.string()),
            "amount": pa.array(amount, pa.float64()),
            "timestamp": pa.array([f"2024-01-0{1 + i % 9}" for i in range(len(rows))], pa.string()),
        }
    )


def write_files(directory: Path, customers: pa.Table, transactions: pa.Table, fmt: str = "parquet") -> FileSource:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, table in (("customers", customers), ("transactions", transactions)):
        path = directory / f"{name}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            pacsv.write_csv(table, path)
        paths[name] = path
    return FileSource(kind="files", **paths)


def write_sqlite(path: Path, customers: pa.Table, transactions: pa.Table) -> SqlSource:
    with sqlite3.connect(path) as db:
        for name, table in (("customers", customers), ("transactions", transactions)):
            columns = ", ".join(f'"{c}"' for c in table.column_names)
            db.execute(f'CREATE TABLE "{name}" ({columns})')
            marks = ", ".join("?" for _ in table.column_names)
            rows = [tuple(row.values()) for row in table.to_pylist()]
            db.executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)
    db.close()
    return SqlSource(kind="sql", url=f"sqlite:///{path}", customers="customers", transactions="transactions")


def load(source, schema: FeatureSchema = SCHEMA, seed: int = 0) -> BankData:
    return load_bank_data(source, schema, name="bank-a", seed=seed)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------- encoding


def test_a_three_row_table_is_encoded_as_computed_by_hand(tmp_path):
    source = write_files(tmp_path, three_customers(), transactions_of([("c1", "c2", 5.0)]))
    data = load(source)
    graph = data.graph
    expected = np.array(
        [
            # age: (x - 40) / 10 clipped to ±2; balance: (log1p(x) - 1) / 2; segment one-hot (retail, sme)
            [0.0, -0.5, 1.0, 0.0],
            [2.0, 0.0, 0.0, 1.0],  # (65 - 40) / 10 = 2.5, clipped to 2
            [-2.0, 1.0, 1.0, 0.0],
        ],
        dtype=np.float32,
    )
    np.testing.assert_allclose(graph.features.toarray(), expected, atol=1e-6)
    assert graph.features.dtype == np.float32 and graph.features.shape == (3, SCHEMA.num_features)
    assert graph.labels.tolist() == [0, -1, 1] and graph.labels.dtype == np.int64
    assert graph.node_ids.tolist() == ["k1", "k2", "k3"] and graph.node_ids.dtype.kind == "U"
    assert data.customer_ids.tolist() == ["c1", "c2", "c3"]
    assert graph.edge_index.tolist() == [[0, 1], [1, 0]]
    assert graph.name == "bank-a" and graph.num_classes == 2
    assert not (graph.train_mask | graph.val_mask | graph.test_mask)[1]  # unlabelled: in no split


def test_only_the_schema_columns_are_read(tmp_path):
    source = write_files(tmp_path, three_customers(), transactions_of([]))
    table = read_customers(source, SCHEMA).table
    assert table.column_names == SCHEMA.customer_columns()  # "notes" never loaded


def test_missing_center_and_ignored_categories_encode_as_zeros(tmp_path):
    schema = make_schema(
        features=[
            {"name": "age", "type": "numeric", "center": 40.0, "scale": 10.0, "missing": "center"},
            {"name": "segment", "type": "categorical", "categories": ["retail", "sme"], "unknown": "ignore"},
            {"name": "region", "type": "categorical", "categories": ["north"], "missing": "ignore"},
        ]
    )
    customers = three_customers(
        age=[None, float("nan"), 50.0], segment=["retail", "corporate", "sme"], region=["north", None, "north"]
    )
    data = load(write_files(tmp_path, customers, transactions_of([])), schema)
    assert data.graph.features.toarray().tolist() == [[0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]]


def test_integer_labels_match_text_classes_and_float_labels_with_gaps_are_unlabelled(tmp_path):
    schema = make_schema(label_classes=["0", "1"])
    ints = load(
        write_files(tmp_path / "i", three_customers(label=pa.array([1, 0, None], pa.int64())), transactions_of([])),
        schema,
    )
    floats = load(
        write_files(tmp_path / "f", three_customers(label=[1.0, float("nan"), 0.0]), transactions_of([])), schema
    )
    assert ints.graph.labels.tolist() == [1, 0, -1]
    assert floats.graph.labels.tolist() == [1, -1, 0]


def test_integer_ids_in_parquet_and_text_ids_in_csv_are_the_same_customers(tmp_path):
    customers = three_customers(customer_id=pa.array([7, 8, 9]), customer_key=pa.array([70, 80, 90]))
    transactions = pa.table({"source_id": [7, 9], "target_id": [8, 8], "amount": [1.0, 2.0], "timestamp": ["a", "b"]})
    from_parquet = load(write_files(tmp_path / "p", customers, transactions))
    from_csv = load(write_files(tmp_path / "c", customers, transactions, "csv"))
    for data in (from_parquet, from_csv):
        assert data.customer_ids.tolist() == ["7", "8", "9"] and data.graph.node_ids.tolist() == ["70", "80", "90"]
        assert data.graph.edge_index.tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]


# --------------------------------------------------------------------------------- formats agree


def generated_bank(rng: np.random.Generator, n: int = 60, extra_ids: int = 5) -> tuple[pa.Table, pa.Table]:
    ids = [f"A-{i:04d}" for i in range(n)]
    labels = rng.choice(np.array(["good", "fraud", None], dtype=object), size=n, p=[0.5, 0.2, 0.3])
    customers = pa.table(
        {
            "customer_id": ids,
            "customer_key": [f"key-{i * 7919 % 10007}" for i in range(n)],
            "label": pa.array(labels.tolist(), pa.string()),
            "age": rng.uniform(18, 90, n).round(3),
            "balance": rng.lognormal(2, 1.5, n).round(2),
            "segment": rng.choice(["retail", "sme"], n).tolist(),
        }
    )
    outsiders = [f"X-{i}" for i in range(extra_ids)]  # customers of another bank: dropped
    pool = np.array(ids + outsiders)
    source, target = rng.choice(pool, 400), rng.choice(pool, 400)
    keep = source != target
    rows = list(
        zip(
            source[keep].tolist(), target[keep].tolist(), rng.uniform(0, 500, keep.sum()).round(2).tolist(), strict=True
        )
    )
    return customers, transactions_of(rows)


def test_parquet_csv_and_sqlite_give_identical_bank_data(tmp_path):
    customers, transactions = generated_bank(np.random.default_rng(3))
    loaded = {
        "parquet": load(write_files(tmp_path / "parquet", customers, transactions)),
        "csv": load(write_files(tmp_path / "csv", customers, transactions, "csv")),
        "sqlite": load(write_sqlite(tmp_path / "bank.sqlite", customers, transactions)),
    }
    reference = loaded["parquet"]
    assert reference.summary.dropped_unknown_customer > 0 and reference.summary.repeats_merged > 0
    for name, data in loaded.items():
        graph = data.graph
        assert np.array_equal(graph.features.toarray(), reference.graph.features.toarray()), name
        for attribute in ("labels", "edge_index", "train_mask", "val_mask", "test_mask", "node_ids"):
            assert np.array_equal(getattr(graph, attribute), getattr(reference.graph, attribute)), (name, attribute)
        assert np.array_equal(data.customer_ids, reference.customer_ids), name
        ours, theirs = data.summary.to_dict(), reference.summary.to_dict()
        for volatile in ("customers_source", "transactions_source", "seconds"):
            ours.pop(volatile), theirs.pop(volatile)
        assert ours == theirs, name


def test_a_sql_query_is_read_like_a_table(tmp_path):
    customers, transactions = generated_bank(np.random.default_rng(4))
    table_source = write_sqlite(tmp_path / "bank.sqlite", customers, transactions)
    query_source = SqlSource(
        kind="sql",
        url=table_source.url,
        customers_query="SELECT c.*, 'extra' AS unused FROM customers AS c ORDER BY c.rowid;",
        transactions_query="SELECT * FROM transactions",
    )
    by_table, by_query = load(table_source), load(query_source)
    assert np.array_equal(by_table.graph.features.toarray(), by_query.graph.features.toarray())
    assert np.array_equal(by_table.graph.edge_index, by_query.graph.edge_index)
    assert by_query.summary.customers_source == "customers_query"


def test_transfers_to_unknown_customers_are_dropped_and_repeats_merged(tmp_path):
    rows = [
        ("c1", "c2", 1.0),
        ("c2", "c1", 2.0),  # the same undirected edge
        ("c1", "c2", 3.0),  # a repeat
        ("c1", "other-bank-1", 4.0),
        ("nobody", "c3", 5.0),
        ("c3", "c1", 6.0),
    ]
    data = load(write_files(tmp_path, three_customers(), transactions_of(rows)))
    summary = data.summary
    assert (summary.transactions_read, summary.dropped_unknown_customer) == (6, 2)
    assert (summary.edges_kept, summary.repeats_merged) == (2, 2)
    assert data.graph.edge_index.tolist() == [[0, 0, 1, 2], [1, 2, 0, 0]]
    assert (summary.degree.min, summary.degree.max, summary.degree.isolated) == (1, 2, 0)
    assert summary.amount_range == (1.0, 6.0) and summary.time_range == ("2024-01-01", "2024-01-06")


def test_canonical_edge_index_holds_each_undirected_pair_once_in_both_directions():
    rng = np.random.default_rng(0)
    for n, m in [(1, 0), (4, 3), (30, 300), (500, 5000)]:
        rows, cols = rng.integers(0, n, m), rng.integers(0, n, m)
        expected = sorted(
            {(int(a), int(b)) for a, b in zip(rows, cols, strict=True) if a != b}
            | {(int(b), int(a)) for a, b in zip(rows, cols, strict=True) if a != b}
        )
        edge_index = canonical_edge_index(rows, cols, n)
        assert edge_index.dtype == np.int64 and edge_index.shape == (2, len(expected))
        assert list(zip(*edge_index.tolist(), strict=True)) == expected


# ------------------------------------------------------------------------------------------- split


def test_the_keyed_split_is_deterministic_and_the_same_for_a_key_at_two_banks(tmp_path):
    n = 3000
    keys = [f"person-{i}" for i in range(n)]
    bank_a = pa.table(
        {
            "customer_id": [f"A{i}" for i in range(n)],
            "customer_key": keys,
            "label": ["good"] * n,
            "age": [40.0] * n,
            "balance": [1.0] * n,
            "segment": ["retail"] * n,
        }
    )
    # bank b holds every other person, in another order, under its own ids
    order = np.arange(0, n, 2)[::-1]
    bank_b = bank_a.take(pa.array(order)).set_column(0, "customer_id", pa.array([f"B{i}" for i in order]))
    a = load(write_files(tmp_path / "a", bank_a, transactions_of([])), seed=5).graph
    again = load(write_files(tmp_path / "a", bank_a, transactions_of([])), seed=5).graph
    b = load(write_files(tmp_path / "b", bank_b, transactions_of([])), seed=5).graph
    other_seed = load(write_files(tmp_path / "a", bank_a, transactions_of([])), seed=6).graph

    def split_of(graph):
        return np.select([graph.train_mask, graph.val_mask, graph.test_mask], [0, 1, 2], -1)

    assert np.array_equal(split_of(a), split_of(again))
    assert np.array_equal(split_of(a)[order], split_of(b))  # the same person, the same split, at both banks
    assert (split_of(a) != split_of(other_seed)).mean() > 0.3  # the seed keys the hash
    fractions = np.bincount(split_of(a), minlength=3) / n
    np.testing.assert_allclose(fractions, [0.6, 0.2, 0.2], atol=0.03)
    assert not (a.train_mask & a.val_mask).any() and not (a.val_mask & a.test_mask).any()


def test_keyed_unit_interval_is_sha256_of_seed_and_key():
    import hashlib

    value = keyed_unit_interval(np.array(["k-1"]), seed=9)[0]
    expected = int.from_bytes(hashlib.sha256(b"9:k-1").digest()[:8], "big") / 2**64
    assert value == expected and 0 <= value < 1


def test_a_split_column_is_read_case_insensitively(tmp_path):
    schema = make_schema(split_column="split")
    customers = three_customers(split=["TRAIN", None, " test "])
    graph = load(write_files(tmp_path, customers, transactions_of([])), schema).graph
    assert graph.train_mask.tolist() == [True, False, False]
    assert graph.test_mask.tolist() == [False, False, True] and not graph.val_mask.any()


# ------------------------------------------------------------------------------------------ errors


def _not_parquet(directory: Path) -> FileSource:
    source = write_files(directory, three_customers(), transactions_of([]))
    source.customers.write_bytes(b"this is not a parquet file at all")
    return source


def _csv_text(directory: Path, text: str) -> FileSource:
    source = write_files(directory, three_customers(), transactions_of([]), "csv")
    source.customers.write_text(text)
    return source


BAD_INPUTS = {
    "empty customers table (CSV header only)": (
        lambda d: write_files(d, three_customers().slice(0, 0), transactions_of([]), "csv"),
        SCHEMA,
        r"customers\.csv: no customers \(the table is empty\)",
    ),
    "a CSV header naming a column twice": (
        lambda d: _csv_text(d, "customer_id,customer_key,label,age,balance,segment,age\nc1,k1,good,1,1,sme,2\n"),
        SCHEMA,
        r"customers\.csv: column 'age' appears more than once",
    ),
    "missing file": (
        lambda d: FileSource(kind="files", customers=d / "nope.parquet", transactions=d / "t.parquet"),
        SCHEMA,
        r"nope\.parquet: file not found",
    ),
    "not a parquet file": (_not_parquet, SCHEMA, r"customers\.parquet: cannot read as Parquet"),
    "missing column": (
        lambda d: write_files(d, three_customers().drop_columns(["balance"]), transactions_of([])),
        SCHEMA,
        r"customers\.parquet: column 'balance' is missing",
    ),
    "wrong column type": (
        lambda d: write_files(d, three_customers(age=["40", "65", "20"]), transactions_of([])),
        SCHEMA,
        r"customers\.parquet: column 'age' has type string; a numeric column needs",
    ),
    "text in a numeric CSV column": (
        lambda d: write_files(d, three_customers(age=["40", "sixty", "20"]), transactions_of([]), "csv"),
        SCHEMA,
        r"customers\.csv: row 2, column 'age': 'sixty' is not a number",
    ),
    "duplicate ids": (
        lambda d: write_files(d, three_customers(customer_id=["c1", "c2", "c1"]), transactions_of([])),
        SCHEMA,
        r"column 'customer_id': customer id 'c1' appears twice, in rows 1 and 3",
    ),
    "duplicate keys": (
        lambda d: write_files(d, three_customers(customer_key=["k1", "k2", "k2"]), transactions_of([])),
        SCHEMA,
        r"column 'customer_key': customer key 'k2' appears twice, in rows 2 and 3",
    ),
    "missing id": (
        lambda d: write_files(d, three_customers(customer_id=["c1", None, "c3"]), transactions_of([])),
        SCHEMA,
        r"row 2, column 'customer_id': missing customer id",
    ),
    "NaN feature": (
        lambda d: write_files(d, three_customers(age=[40.0, 50.0, float("nan")]), transactions_of([])),
        SCHEMA,
        r"customers\.parquet: row 3, column 'age': missing \(null or NaN\) \(missing = 'error'\)",
    ),
    "infinite feature": (
        lambda d: write_files(d, three_customers(age=[float("inf"), 50.0, 1.0]), transactions_of([])),
        SCHEMA,
        r"row 1, column 'age': inf is not finite",
    ),
    "negative value under log1p": (
        lambda d: write_files(d, three_customers(balance=[1.0, -3.0, 1.0]), transactions_of([])),
        SCHEMA,
        r"row 2, column 'balance': -3\.0 is negative; log1p needs x >= 0",
    ),
    "label outside the schema": (
        lambda d: write_files(d, three_customers(label=["good", "bad", None]), transactions_of([])),
        SCHEMA,
        r"row 2, column 'label': label 'bad' is not one of the consortium's classes \['good', 'fraud'\]",
    ),
    "unknown category": (
        lambda d: write_files(d, three_customers(segment=["retail", "corporate", "sme"]), transactions_of([])),
        SCHEMA,
        r"row 2, column 'segment': 'corporate' is not one of the categories",
    ),
    "missing category": (
        lambda d: write_files(d, three_customers(segment=["retail", "sme", None]), transactions_of([])),
        SCHEMA,
        r"row 3, column 'segment': missing value \(missing = 'error'\)",
    ),
    "split on an unlabelled customer": (
        lambda d: write_files(d, three_customers(split=["train", "val", None]), transactions_of([])),
        make_schema(split_column="split"),
        r"row 2, column 'split': split 'val' on an unlabelled customer",
    ),
    "unknown split value": (
        lambda d: write_files(d, three_customers(split=["training", None, None]), transactions_of([])),
        make_schema(split_column="split"),
        r"row 1, column 'split': split 'training' is not one of \['train', 'val', 'test'\]",
    ),
    "a transfer to oneself": (
        lambda d: write_files(d, three_customers(), transactions_of([("c1", "c2", 1.0), ("c3", "c3", 2.0)])),
        SCHEMA,
        r"transactions\.parquet: row 2, column 'target_id': a transfer from customer 'c3' to itself",
    ),
    "negative amount": (
        lambda d: write_files(d, three_customers(), transactions_of([("c1", "c2", 1.0), ("c2", "c3", -2.5)])),
        SCHEMA,
        r"transactions\.parquet: row 2, column 'amount': amount -2\.5; an amount must be a finite number >= 0",
    ),
    "missing endpoint": (
        lambda d: write_files(d, three_customers(), transactions_of([("c1", "c2", 1.0), (None, "c3", 2.0)])),
        SCHEMA,
        r"transactions\.parquet: row 2, column 'source_id': missing source id",
    ),
    "missing SQLite table": (
        lambda d: SqlSource(
            kind="sql",
            url=write_sqlite(d / "bank.sqlite", three_customers(), transactions_of([])).url,
            customers="clients",
            transactions="transactions",
        ),
        SCHEMA,
        r"table clients: no such table in database sqlite:///",
    ),
    "missing SQLite column": (
        lambda d: write_sqlite(d / "bank.sqlite", three_customers().drop_columns(["segment"]), transactions_of([])),
        SCHEMA,
        r"table customers: column 'segment' is missing",
    ),
    "missing SQLite file": (
        lambda d: SqlSource(kind="sql", url=f"sqlite:///{d}/none.sqlite", customers="c", transactions="t"),
        SCHEMA,
        r"none\.sqlite not found",
    ),
    "SQL query with an error": (
        lambda d: SqlSource(
            kind="sql",
            url=write_sqlite(d / "bank.sqlite", three_customers(), transactions_of([])).url,
            customers_query="SELECT * FROM customerz",
            transactions="transactions",
        ),
        SCHEMA,
        r"customers_query in database sqlite:///.*no such table: customerz",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_clear_error_naming_row_and_column_and_nothing_is_written(tmp_path, case):
    make_source, schema, message = BAD_INPUTS[case]
    source = make_source(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(DataSourceError, match=message) as raised:
        load(source, schema)
    assert "\n" not in str(raised.value)  # one line
    assert snapshot(tmp_path) == before  # nothing written, not even an empty SQLite file


def test_an_unreachable_database_is_a_data_source_error_without_the_password():
    source = SqlSource(
        kind="sql",
        url="postgresql+psycopg://bank:s3cret@127.0.0.1:1/bank?connect_timeout=2",
        customers="customers",
        transactions="transactions",
    )
    with pytest.raises(
        DataSourceError, match=r"table customers in database postgresql\+psycopg://bank:\*\*\*@"
    ) as raised:
        load(source)
    assert "s3cret" not in str(raised.value)


# ---------------------------------------------------------------------------------------- data check


def write_bank_consortium(root: Path, bank_data: dict[str, str]) -> Path:
    """A consortium with data = 'bank-sources' and a [schema]; bank-a's node file declares ``bank_data``."""
    features = "\n".join(
        "[[schema.features]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in feature.items())
        for feature in SCHEMA_VALUES["features"]
    )
    (root / "consortium.toml").write_text(
        'federation = "check-test"\npolicy = "policy.toml"\npki_dir = "pki"\nstate_root = "state"\n'
        'data = "bank-sources"\n'
        + "".join(
            f'[[nodes]]\nname = "{name}"\nrole = "{role}"\nport = {port}\n'
            for name, role, port in (
                ("key-authority", "key-authority", 9801),
                ("aggregator", "aggregator", 9802),
                ("bank-a", "bank", 9811),
                ("bank-b", "bank", 9812),
            )
        )
        + '[schema]\nid_column = "customer_id"\nkey_column = "customer_key"\nlabel_column = "label"\n'
        'label_classes = ["good", "fraud"]\n'
        + features
        + '\n[schema.transactions]\nsource_column = "source_id"\ntarget_column = "target_id"\n'
        'amount_column = "amount"\ntime_column = "timestamp"\n'
    )
    data = "\n".join(f"{key} = {json.dumps(value)}" for key, value in bank_data.items())
    (root / "bank-a.toml").write_text(
        f'name = "bank-a"\nrole = "bank"\nconsortium = "consortium.toml"\n\n[bank.data]\n{data}\n'
    )
    (root / "aggregator.toml").write_text('name = "aggregator"\nrole = "aggregator"\nconsortium = "consortium.toml"\n')
    return root / "bank-a.toml"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_data_check_prints_what_the_bank_would_contribute_and_writes_nothing(tmp_path):
    rows = [("c1", "c2", 10.0), ("c2", "c1", 20.0), ("c3", "elsewhere", 5.0)]
    write_files(tmp_path / "data", three_customers(), transactions_of(rows))
    config = write_bank_consortium(
        tmp_path,
        {"kind": "files", "customers": "data/customers.parquet", "transactions": "data/transactions.parquet"},
    )
    before = snapshot(tmp_path)
    text = invoke("data", "check", "--config", str(config))
    assert text.exit_code == 0, text.output
    assert "customers      3" in text.stdout and "features       4 columns" in text.stdout
    assert "labelled       good 1, fraud 1; unlabelled 1" in text.stdout
    assert "1 kept (undirected); 1 repeated transfers merged; 1 dropped" in text.stdout
    as_json = invoke("data", "check", "--config", str(config), "--format", "json")
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.stdout)
    assert summary["bank"] == "bank-a" and summary["customers"] == 3 and summary["feature_width"] == 4
    assert summary["labelled"] == {"good": 1, "fraud": 1} and sum(summary["split"].values()) == 2
    assert (summary["transactions_read"], summary["edges_kept"], summary["dropped_unknown_customer"]) == (3, 1, 1)
    assert summary["degree"] == {"min": 0, "median": 1.0, "mean": 0.6667, "max": 1, "isolated": 1}
    assert snapshot(tmp_path) == before  # no state directory, no keys, nothing


def test_data_check_reads_a_sqlite_bank_read_only(tmp_path):
    write_sqlite(tmp_path / "bank.sqlite", three_customers(), transactions_of([("c1", "c3", 1.0)]))
    config = write_bank_consortium(
        tmp_path,
        {"kind": "sql", "url": "sqlite:///bank.sqlite", "customers": "customers", "transactions": "transactions"},
    )
    before = snapshot(tmp_path)
    result = invoke("data", "check", "--config", str(config), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["edges_kept"] == 1
    assert snapshot(tmp_path) == before


def test_data_check_exits_2_with_one_line_naming_row_and_column(tmp_path):
    write_files(tmp_path / "data", three_customers(age=[40.0, None, 20.0]), transactions_of([]))
    config = write_bank_consortium(
        tmp_path,
        {"kind": "files", "customers": "data/customers.parquet", "transactions": "data/transactions.parquet"},
    )
    result = invoke("data", "check", "--config", str(config))
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: ") and "customers.parquet: row 2, column 'age'" in result.stderr
    assert result.stdout == ""


def test_data_check_refuses_a_node_that_is_not_a_bank(tmp_path):
    write_files(tmp_path / "data", three_customers(), transactions_of([]))
    write_bank_consortium(
        tmp_path,
        {"kind": "files", "customers": "data/customers.parquet", "transactions": "data/transactions.parquet"},
    )
    result = invoke("data", "check", "--config", str(tmp_path / "aggregator.toml"))
    assert result.exit_code == 2 and "only a bank has customer data to check" in result.stderr


# ------------------------------------------------------------------------------------------- scores

IDS = np.array(["c1", "c2", "c3"])
PROBABILITIES = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])


@pytest.mark.parametrize("name", ["scores.parquet", "scores.csv"])
def test_scores_are_written_to_a_file_with_one_row_per_customer(tmp_path, name):
    path = tmp_path / "out" / name
    write_scores(IDS, PROBABILITIES, ["good", "fraud"], output=path)
    table = pq.read_table(path) if name.endswith(".parquet") else pacsv.read_csv(path)
    assert table.column_names == ["customer_id", "p_good", "p_fraud", "predicted_class"]
    assert table.column("customer_id").to_pylist() == ["c1", "c2", "c3"]
    assert table.column("p_fraud").to_pylist() == [0.1, 0.8, 0.5]
    assert table.column("predicted_class").to_pylist() == ["good", "fraud", "good"]  # a tie goes to the first
    explicit = tmp_path / f"explicit-{name}"
    write_scores(IDS, PROBABILITIES, ["good", "fraud"], np.array([1, 1, 0]), output=explicit)
    reread = pq.read_table(explicit) if name.endswith(".parquet") else pacsv.read_csv(explicit)
    assert reread.column("predicted_class").to_pylist() == ["fraud", "fraud", "good"]
    assert sorted(os.listdir(tmp_path / "out")) == [name]  # no temporary file left behind


def test_a_failed_file_write_leaves_the_previous_scores_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "scores.parquet"
    write_scores(IDS, PROBABILITIES, ["good", "fraud"], output=path)
    before = path.read_bytes()

    def half_written(table, stream, **_kwargs):
        stream.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scores_module.pq, "write_table", half_written)
    with pytest.raises(DataSourceError, match=r"scores\.parquet: cannot write the scores: .*No space left"):
        write_scores(IDS, PROBABILITIES[:, ::-1], ["good", "fraud"], output=path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["scores.parquet"]


def test_scores_refuse_bad_shapes_and_unknown_extensions(tmp_path):
    with pytest.raises(ValueError, match=r"shape \(3, 2\); expected \(3, 3\)"):
        write_scores(IDS, PROBABILITIES, ["a", "b", "c"], output=tmp_path / "s.parquet")
    with pytest.raises(ConfigError, match=r"\.parquet or \.csv"):
        write_scores(IDS, PROBABILITIES, ["good", "fraud"], output=tmp_path / "s.json")
    assert os.listdir(tmp_path) == []


def sqlite_bank(tmp_path: Path) -> SqlSource:
    return write_sqlite(tmp_path / "bank.sqlite", three_customers(), transactions_of([]))


def read_sqlite(source: SqlSource, query: str) -> list[tuple]:
    with sqlite3.connect(source.url.removeprefix("sqlite:///")) as db:
        rows = db.execute(query).fetchall()
    db.close()
    return rows


def test_scores_replace_a_sqlite_table_in_one_transaction(tmp_path, monkeypatch):
    source = sqlite_bank(tmp_path)
    write_scores(IDS, PROBABILITIES, ["good", "fraud"], table="scores", source=source)
    assert read_sqlite(source, "SELECT * FROM scores") == [
        ("c1", 0.9, 0.1, "good"),
        ("c2", 0.2, 0.8, "fraud"),
        ("c3", 0.5, 0.5, "good"),
    ]
    write_scores(IDS[:2], PROBABILITIES[:2, ::-1], ["good", "fraud"], table="scores", source=source)
    assert read_sqlite(source, "SELECT customer_id, predicted_class FROM scores") == [("c1", "fraud"), ("c2", "good")]

    original_drop = scores_module._drop_previous

    def drop_then_fail(connection, *args):
        original_drop(connection, *args)  # the old table is dropped inside the transaction ...
        connection.exec_driver_sql("SELECT * FROM no_such_table")  # ... then the write fails

    monkeypatch.setattr(scores_module, "_drop_previous", drop_then_fail)
    with pytest.raises(DataSourceError, match=r"table scores .*cannot write the scores.*previous scores.*unchanged"):
        write_scores(IDS, PROBABILITIES, ["good", "fraud"], table="scores", source=source)
    assert read_sqlite(source, "SELECT customer_id, predicted_class FROM scores") == [("c1", "fraud"), ("c2", "good")]
    tables = {name for (name,) in read_sqlite(source, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"customers", "transactions", "scores"}  # the staging table was rolled back too


@pytest.mark.parametrize(
    ("table", "error", "message"),
    [
        ("customers", ConfigError, "one of the bank's own source tables"),
        ("scores; DROP TABLE customers", ConfigError, "letters, digits and _"),
        ("notes", DataSourceError, "exists and is not a scores table"),
    ],
)
def test_scores_never_replace_a_table_that_is_not_a_scores_table(tmp_path, table, error, message):
    source = sqlite_bank(tmp_path)
    with sqlite3.connect(tmp_path / "bank.sqlite") as db:
        db.execute("CREATE TABLE notes (id INTEGER, text TEXT)")
        db.execute("INSERT INTO notes VALUES (1, 'keep me')")
    db.close()
    with pytest.raises(error, match=message):
        write_scores(IDS, PROBABILITIES, ["good", "fraud"], table=table, source=source)
    assert read_sqlite(source, "SELECT * FROM notes") == [(1, "keep me")]
    assert len(read_sqlite(source, "SELECT * FROM customers")) == 3
    tables = {name for (name,) in read_sqlite(source, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"customers", "transactions", "notes"}


def test_decimal_columns_become_the_nearest_double_as_a_float_column_would():
    from decimal import Decimal

    from fedgl_secure.data.sources.tables import as_float64

    values = ["25.49", "0.10", "7.11", "1234567.89"]
    decimals = pa.array([Decimal(v) for v in values])
    assert as_float64(decimals).to_pylist() == [float(v) for v in values]  # Arrow's own cast gives 25.490000000000002
