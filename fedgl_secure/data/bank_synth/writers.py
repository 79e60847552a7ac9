"""The synthetic banks on disk: Parquet, CSV or SQLite files, the manifest and marker names, resuming a run.

Every file goes through ``<name>.tmp`` and a rename; :func:`_existing_output` decides, from the
manifest or the in-progress marker, whether ``out_dir`` is a finished output of the same
parameters, an interrupted one to finish, or something to refuse.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from fedgl_secure.data.bank_synth.parameters import GENERATOR, SynthParameters, SynthSummary
from fedgl_secure.errors import ConfigError

MANIFEST_FILE = "manifest.json"
MARKER_FILE = ".synth-in-progress.json"
SQLITE_FILE = "bank.sqlite"
SQLITE_BATCH_ROWS = 100_000


def _bank_files(fmt: str) -> tuple[str, ...]:
    return (SQLITE_FILE,) if fmt == "sqlite" else (f"customers.{fmt}", f"transactions.{fmt}")


def _existing_output(out_dir: Path, parameters: SynthParameters) -> SynthSummary | None:
    """The summary of a complete previous output of the same parameters; None when ``out_dir`` may be written.

    Refuses (ConfigError) a path that is not a directory, a directory holding anything that is not
    a previous synth output, and a previous output of other parameters (naming each difference).
    """
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise ConfigError(f"out_dir: {out_dir} exists and is not a directory")
    manifest_path, marker_path = out_dir / MANIFEST_FILE, out_dir / MARKER_FILE
    if manifest_path.is_file():
        document = _read_json(manifest_path, "out_dir")
        if document.get("generator") != GENERATOR:
            raise ConfigError(f"out_dir: {manifest_path} is not a manifest of {GENERATOR}; pick an empty directory")
        if differences := parameters.differences(document):
            raise ConfigError(
                f"out_dir: {out_dir} holds a previous synth output with other parameters ({'; '.join(differences)}); "
                "remove it or pick another out_dir (a bank's files are never overwritten)"
            )
        try:
            summary = SynthSummary.from_manifest(out_dir, document, already_there=True)
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"out_dir: {manifest_path} is damaged ({error!r}); remove {out_dir} and generate again"
            ) from None
        for bank in summary.banks:
            for name, size in bank.files.items():
                path = out_dir / bank.name / name
                # a SQLite file is the bank's own database: `fedgl-secure predict` writes its scores into it
                grown = path.suffix != ".sqlite" and path.is_file() and path.stat().st_size != size
                if not path.is_file() or grown:
                    raise ConfigError(
                        f"out_dir: {path} is missing or was changed since the manifest was written; remove {out_dir} "
                        "and generate again"
                    )
        return summary
    if marker_path.is_file():
        document = _read_json(marker_path, "out_dir")
        if differences := parameters.differences(document):
            raise ConfigError(
                f"out_dir: {out_dir} holds an interrupted synth output with other parameters "
                f"({'; '.join(differences)}); remove it or pick another out_dir"
            )
        return None  # the same command again: finish the interrupted run
    if foreign := sorted(p.name for p in out_dir.iterdir()):
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise ConfigError(
            f"out_dir: {out_dir} is not empty and holds no synth output ({shown}); pick a new or empty directory"
        )
    return None


def _read_json(path: Path, name: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{name}: cannot read {path} ({error}); remove it or pick another {name}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{name}: {path} is not a JSON object; remove it or pick another {name}")
    return document


def _write_via_temporary(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` into ``<path>.tmp``, fsync, rename: the same guarantee as :func:`write_atomically` for big files."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.unlink(missing_ok=True)
    write(temporary)
    with temporary.open("rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _write_tables(directory: Path, fmt: str, customers: pa.Table, transactions: pa.Table) -> dict[str, int]:
    """Both tables in ``fmt`` under ``directory``; returns each file's size in bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "sqlite":
        _write_via_temporary(directory / SQLITE_FILE, lambda p: _write_sqlite(p, customers, transactions))
    else:
        for name, table in (("customers", customers), ("transactions", transactions)):
            if fmt == "parquet":
                _write_via_temporary(directory / f"{name}.parquet", lambda p, t=table: pq.write_table(t, p))
            else:
                _write_via_temporary(directory / f"{name}.csv", lambda p, t=table: pa_csv.write_csv(t, p))
    return {name: (directory / name).stat().st_size for name in _bank_files(fmt)}


def _write_sqlite(path: Path, customers: pa.Table, transactions: pa.Table) -> None:
    """One SQLite database with tables ``customers`` (primary key: the id) and ``transactions``.

    Timestamps are ISO text ``YYYY-MM-DD HH:MM:SS`` in UTC (SQLite has no time type; this is the
    form its own date functions read).
    """
    sql_types = {pa.types.is_integer: "INTEGER", pa.types.is_floating: "REAL"}
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode = OFF")
        connection.execute("PRAGMA synchronous = OFF")
        for name, table, primary in (("customers", customers, 0), ("transactions", transactions, None)):
            if name == "transactions":
                time_column = table.schema.names[-1]
                text = pc.strftime(table[time_column], format="%Y-%m-%d %H:%M:%S")
                table = table.set_column(len(table.schema) - 1, time_column, text)
            definitions = []
            for index, column in enumerate(table.schema):
                kind = next((sql for test, sql in sql_types.items() if test(column.type)), "TEXT")
                key = " PRIMARY KEY" if index == primary else ""
                definitions.append(f'"{column.name}" {kind}{key}')
            connection.execute(f'CREATE TABLE "{name}" ({", ".join(definitions)})')
            placeholders = ", ".join("?" * table.num_columns)
            for batch in table.to_batches(SQLITE_BATCH_ROWS):
                rows = zip(*(column.to_pylist() for column in batch.columns), strict=True)
                connection.executemany(f'INSERT INTO "{name}" VALUES ({placeholders})', rows)
            connection.commit()
    finally:
        connection.close()
