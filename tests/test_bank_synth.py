"""The synthetic bank consortium: files a bank would have, with the realism the framework is tested on (issue 9)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.data import bank_synth
from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.data.sources.schema import FeatureSchema, NumericFeature
from fedgl_secure.errors import ConfigError
from fedgl_secure.tomlio import tomllib  # tomli on Python 3.10

BANKS = 3
CUSTOMERS = 2000
SHARED = 0.3
SCHEMA = synthetic_bank_schema()


def _tables(out: Path, fmt: str = "parquet") -> dict[str, tuple[pa.Table, pa.Table]]:
    """Every bank's (customers, transactions) as written, read back with the types the Parquet files carry."""
    banks = sorted(p.name for p in out.iterdir() if p.is_dir())
    if fmt == "parquet":
        return {
            b: (pq.read_table(out / b / "customers.parquet"), pq.read_table(out / b / "transactions.parquet"))
            for b in banks
        }
    return {b: (_read_csv(out / b / "customers.csv"), _read_csv(out / b / "transactions.csv")) for b in banks}


def _read_csv(path: Path) -> pa.Table:
    return pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(strings_can_be_null=True))


@pytest.fixture(scope="module")
def consortium(tmp_path_factory) -> tuple[Path, dict[str, tuple[pa.Table, pa.Table]]]:
    out = tmp_path_factory.mktemp("synth") / "parquet"
    synthesize_banks(out, banks=BANKS, customers=CUSTOMERS, seed=7, shared_fraction=SHARED)
    return out, _tables(out)


def _column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table[name].to_pylist(), dtype=object)


def _encode(customers: pa.Table) -> np.ndarray:
    """The schema's encoding (standardise, clip, one-hot), written here independently of the readers."""
    columns = []
    for feature in SCHEMA.features:
        if isinstance(feature, NumericFeature):
            x = customers[feature.name].to_numpy(zero_copy_only=False).astype(float)
            x = np.log1p(x) if feature.log1p else x
            z = np.nan_to_num((x - feature.center) / feature.scale, nan=0.0)
            columns.append(np.clip(z, -feature.clip, feature.clip) if feature.clip else z)
        else:
            values = _column(customers, feature.name)
            columns += [(values == category).astype(float) for category in feature.categories]
    return np.column_stack(columns)


def test_same_seed_writes_the_same_files_and_another_seed_does_not(tmp_path, consortium):
    out, tables = consortium
    again = tmp_path / "again"
    synthesize_banks(again, banks=BANKS, customers=CUSTOMERS, seed=7, shared_fraction=SHARED)
    for path in sorted(out.rglob("*")):
        if path.is_file():
            assert (again / path.relative_to(out)).read_bytes() == path.read_bytes(), path.name
    other = tmp_path / "other"
    synthesize_banks(other, banks=BANKS, customers=CUSTOMERS, seed=8, shared_fraction=SHARED)
    for bank, (customers, transactions) in _tables(other).items():
        assert not customers.equals(tables[bank][0])
        assert not transactions.equals(tables[bank][1])
        assert not set(customers["customer_key"].to_pylist()) & set(tables[bank][0]["customer_key"].to_pylist())


def test_schema_file_round_trips_and_the_tables_match_it(consortium):
    out, tables = consortium
    with (out / "schema.toml").open("rb") as handle:
        assert FeatureSchema.model_validate(tomllib.load(handle)["schema"]) == SCHEMA
    assert SCHEMA.positive_class == "fraud" and SCHEMA.split_column == "split"
    assert 6 <= len(SCHEMA.features) <= 10
    assert sum(not isinstance(f, NumericFeature) for f in SCHEMA.features) == 2
    for customers, transactions in tables.values():
        assert customers.column_names == SCHEMA.customer_columns()
        assert transactions.column_names == SCHEMA.transaction_columns()
        assert set(_column(customers, "label")) <= {*SCHEMA.label_classes, None}
        for feature in SCHEMA.features:
            if not isinstance(feature, NumericFeature):
                assert set(_column(customers, feature.name)) <= set(feature.categories)
        # the fixed centres and scales fit the data: encoded columns are roughly standardised
        numeric = _encode(customers)[:, : sum(isinstance(f, NumericFeature) for f in SCHEMA.features)]
        assert np.all(np.abs(numeric.mean(axis=0)) < 0.5)
        assert np.all((numeric.std(axis=0) > 0.5) & (numeric.std(axis=0) < 1.5))


def test_fraud_rate_is_realistic_and_the_manifest_reports_it(consortium):
    out, tables = consortium
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["seed"] == 7 and len(manifest["banks"]) == BANKS
    for record in manifest["banks"]:
        customers, transactions = tables[record["name"]]
        labels = _column(customers, "label")
        labelled = labels[labels != None]  # noqa: E711 - element-wise
        rate = float(np.mean(labelled == "fraud"))
        assert 0.02 <= rate <= 0.05
        assert record["fraud_rate"] == pytest.approx(rate, abs=1e-6)
        assert record["customers"] == customers.num_rows and record["transactions"] == transactions.num_rows
        assert 0 < len(labelled) < customers.num_rows  # some customers are unlabelled
    assert 0.02 <= manifest["fraud_rate"] <= 0.05


def test_shared_persons_have_their_own_ids_one_key_one_label_one_split(consortium):
    _, tables = consortium
    keys = {bank: _column(customers, "customer_key") for bank, (customers, _) in tables.items()}
    for bank, (customers, _) in tables.items():
        assert (
            len(set(keys[bank])) == customers.num_rows
            and len(set(_column(customers, "customer_id"))) == customers.num_rows
        )
        elsewhere = set().union(*(set(k) for other, k in keys.items() if other != bank))
        shared = np.mean([key in elsewhere for key in keys[bank]])
        assert abs(shared - SHARED) <= 0.01
    names = sorted(tables)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a = {row["customer_key"]: row for row in tables[first][0].to_pylist()}
            b = {row["customer_key"]: row for row in tables[second][0].to_pylist()}
            common = set(a) & set(b)
            assert common, (first, second)
            for key in common:
                assert a[key]["customer_id"] != b[key]["customer_id"]
                assert a[key]["label"] == b[key]["label"] and a[key]["split"] == b[key]["split"]
                assert a[key]["age"] == b[key]["age"] and a[key]["segment"] == b[key]["segment"]


def test_transactions_stay_inside_the_bank_and_shared_relationships_appear_at_both(consortium):
    _, tables = consortium
    key_of = {}
    for bank, (customers, transactions) in tables.items():
        ids = set(_column(customers, "customer_id"))
        source, target = _column(transactions, "source_id"), _column(transactions, "target_id")
        assert set(source) <= ids and set(target) <= ids
        assert not np.any(source == target)
        assert 5 <= 2 * transactions.num_rows / customers.num_rows <= 10
        assert len(set(zip(source, target, strict=True))) < transactions.num_rows  # repeated transfers exist
        assert np.all(transactions["amount"].to_numpy() > 0)
        key_of[bank] = dict(zip(_column(customers, "customer_id"), _column(customers, "customer_key"), strict=True))
    first, second = sorted(tables)[:2]
    at_both = set(key_of[first].values()) & set(key_of[second].values())

    def between_both(bank: str) -> set[tuple]:
        """Transfers at ``bank`` between two persons who bank at both, by their shared keys."""
        keyed = ((key_of[bank][r["source_id"]], key_of[bank][r["target_id"]], r) for r in tables[bank][1].to_pylist())
        return {(s, t, r["amount"], r["timestamp"]) for s, t, r in keyed if s in at_both and t in at_both}

    at_first, at_second = between_both(first), between_both(second)
    # a person-level relationship shows at both banks; bank-local ones only at one
    assert at_first & at_second
    assert 0.25 < len(at_first & at_second) / len(at_first) < 1.0


def test_fraudsters_transact_with_fraudsters_far_above_the_base_rate(consortium):
    _, tables = consortium
    for customers, transactions in tables.values():
        label = dict(zip(_column(customers, "customer_id"), _column(customers, "label"), strict=True))
        pairs = [
            (label[s], label[t])
            for s, t in zip(_column(transactions, "source_id"), _column(transactions, "target_id"), strict=True)
        ]
        known = [(s, t) for s, t in pairs if s is not None and t is not None]
        touching = [(s, t) for s, t in known if "fraud" in (s, t)]
        homophily = sum(s == t == "fraud" for s, t in touching) / len(touching)
        labels = _column(customers, "label")
        rate = float(np.mean(labels[labels != None] == "fraud"))  # noqa: E711
        assert homophily > 3 * rate


def test_features_alone_separate_fraud_clearly_but_not_perfectly(consortium):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    _, tables = consortium
    customers = pa.concat_tables([c for c, _ in tables.values()])
    x, label, split = _encode(customers), _column(customers, "label"), _column(customers, "split")
    y = (label == "fraud").astype(int)
    model = LogisticRegression(max_iter=2000).fit(x[split == "train"], y[split == "train"])
    test = split == "test"
    auc = roc_auc_score(y[test], model.predict_proba(x[test])[:, 1])
    assert 0.6 < auc < 0.99


def test_split_is_by_person_and_only_for_the_labelled(consortium):
    _, tables = consortium
    for customers, _ in tables.values():
        label, split = _column(customers, "label"), _column(customers, "split")
        assert np.array_equal(label == None, split == None)  # noqa: E711
        shares = [np.mean(split[split != None] == s) for s in ("train", "val", "test")]  # noqa: E711
        assert shares == pytest.approx([0.6, 0.2, 0.2], abs=0.03)
        fraud = label == "fraud"
        assert all(np.any(fraud & (split == s)) for s in ("train", "val", "test"))  # stratified


def test_csv_and_sqlite_hold_the_same_rows_as_parquet(tmp_path, consortium):
    out, tables = consortium
    csv_out, sql_out = tmp_path / "csv", tmp_path / "sqlite"
    synthesize_banks(csv_out, banks=BANKS, customers=CUSTOMERS, seed=7, shared_fraction=SHARED, fmt="csv")
    synthesize_banks(sql_out, banks=BANKS, customers=CUSTOMERS, seed=7, shared_fraction=SHARED, fmt="sqlite")
    for bank, (customers, transactions) in _tables(csv_out, "csv").items():
        assert customers.cast(tables[bank][0].schema).equals(tables[bank][0])
        assert transactions.cast(tables[bank][1].schema).equals(tables[bank][1])
    for bank, (customers, transactions) in tables.items():
        connection = sqlite3.connect(sql_out / bank / "bank.sqlite")
        try:
            assert connection.execute("SELECT * FROM customers").fetchall() == [
                tuple(r.values()) for r in customers.to_pylist()
            ]
            stored = connection.execute("SELECT * FROM transactions").fetchall()
        finally:
            connection.close()
        seconds = transactions["timestamp"].cast(pa.timestamp("s", tz="UTC"))  # Parquet stores milliseconds
        as_text = transactions.set_column(3, "timestamp", pc.strftime(seconds, format="%Y-%m-%d %H:%M:%S"))
        assert stored == [tuple(r.values()) for r in as_text.to_pylist()]
    assert not list(csv_out.rglob("*.tmp")) and not list(sql_out.rglob("*.tmp"))


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"banks": 1}, "banks"),
        ({"customers": 9}, "customers"),
        ({"shared_fraction": 1.5}, "shared_fraction"),
        ({"shared_fraction": float("nan")}, "shared_fraction"),
        ({"fraud_rate": 0.0}, "fraud_rate"),
        ({"labelled_fraction": -0.1}, "labelled_fraction"),
        ({"fmt": "xlsx"}, "format"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_are_refused_naming_the_parameter(tmp_path, change, name):
    arguments = {"banks": 2, "customers": 50, **change}
    with pytest.raises(ConfigError, match=name):
        synthesize_banks(tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists()


def test_a_directory_holding_other_files_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "customers.parquet").write_bytes(b"a bank's real file")
    with pytest.raises(ConfigError, match="out_dir"):
        synthesize_banks(out, banks=2, customers=50)
    assert [p.name for p in out.iterdir()] == ["customers.parquet"]
    assert (out / "customers.parquet").read_bytes() == b"a bank's real file"


def test_a_previous_output_is_kept_when_the_same_and_refused_when_different(tmp_path):
    out = tmp_path / "out"
    first = synthesize_banks(out, banks=2, customers=100, seed=3)
    assert not first.already_there
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    again = synthesize_banks(out, banks=2, customers=100, seed=3)
    assert again.already_there and again.to_dict()["banks"] == first.to_dict()["banks"]
    for change, name in (({"customers": 120}, "customers"), ({"seed": 4}, "seed"), ({"fmt": "csv"}, "format")):
        with pytest.raises(ConfigError, match=name):
            synthesize_banks(out, **{"banks": 2, "customers": 100, "seed": 3, **change})
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()} == before
    damaged = out / "bank-b" / "transactions.parquet"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="transactions.parquet"):
        synthesize_banks(out, banks=2, customers=100, seed=3)


def test_an_interrupted_run_looks_incomplete_and_the_same_command_finishes_it(tmp_path, monkeypatch):
    write_tables = bank_synth._write_tables
    calls = []

    def crash_on_second_bank(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return write_tables(*args, **kwargs)

    out = tmp_path / "out"
    monkeypatch.setattr(bank_synth, "_write_tables", crash_on_second_bank)
    with pytest.raises(KeyboardInterrupt):
        synthesize_banks(out, banks=3, customers=100, seed=5)
    monkeypatch.setattr(bank_synth, "_write_tables", write_tables)
    assert not (out / "manifest.json").exists()
    with pytest.raises(ConfigError, match="banks"):
        synthesize_banks(out, banks=2, customers=100, seed=5)
    finished = synthesize_banks(out, banks=3, customers=100, seed=5)
    assert not finished.already_there and (out / "manifest.json").is_file()
    clean = tmp_path / "clean"
    synthesize_banks(clean, banks=3, customers=100, seed=5)
    assert _tables(out).keys() == _tables(clean).keys()
    for bank, (customers, transactions) in _tables(out).items():
        assert customers.equals(_tables(clean)[bank][0]) and transactions.equals(_tables(clean)[bank][1])
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in clean.iterdir())


def test_bank_names_continue_past_z():
    names = [bank_synth.bank_name(i) for i in range(30)]
    assert names[:2] == ["bank-a", "bank-b"] and names[25] == "bank-z" and names[26:28] == ["bank-aa", "bank-ab"]
    assert len(set(bank_synth.bank_name(i) for i in range(bank_synth.MAX_BANKS))) == bank_synth.MAX_BANKS


def test_cli_data_synth_prints_a_json_summary_and_refuses_bad_flags(tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    arguments = [
        "data",
        "synth",
        "--banks",
        "2",
        "--customers",
        "60",
        "--out",
        str(out),
        "--format",
        "sqlite",
        "--seed",
        "2",
    ]
    result = runner.invoke(app, arguments)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["parameters"]["format"] == "sqlite" and not summary["already_there"]
    assert [b["name"] for b in summary["banks"]] == ["bank-a", "bank-b"]
    assert all((out / b["name"] / "bank.sqlite").is_file() for b in summary["banks"])
    assert json.loads(runner.invoke(app, arguments).stdout)["already_there"]
    bad = runner.invoke(
        app, ["data", "synth", "--banks", "2", "--customers", "60", "--out", str(tmp_path / "x"), "--fraud-rate", "0.9"]
    )
    assert bad.exit_code == 2 and "fraud_rate" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_the_summary_declares_each_banks_generated_files(consortium):
    out, tables = consortium
    summary = synthesize_banks(out, banks=BANKS, customers=CUSTOMERS, seed=7, shared_fraction=SHARED)
    declarations = summary.files_declarations()
    assert sorted(declarations) == sorted(tables)
    for bank, declaration in declarations.items():
        assert declaration["kind"] == "files"
        assert pq.read_table(declaration["customers"]).equals(tables[bank][0])
        assert pq.read_table(declaration["transactions"]).equals(tables[bank][1])
    as_sqlite = dataclasses.replace(summary, parameters=dataclasses.replace(summary.parameters, format="sqlite"))
    with pytest.raises(ConfigError, match="SQLite databases"):
        as_sqlite.files_declarations()
