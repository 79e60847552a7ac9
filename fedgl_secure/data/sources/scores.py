"""Write a bank's scores (class probabilities and predicted class per customer) to a file or its database.

The scores table has one row per customer, by the bank's **own** customer id::

    customer_id | p_<class 0> | p_<class 1> | ... | predicted_class

Scores replace an earlier run's scores only once the new ones are complete, so a crash or a failed
write never leaves a bank with half a table:

* a ``.parquet``/``.csv`` file is written to a temporary file in the same directory, flushed to disk,
  and renamed over the old one (``os.replace`` is atomic on one file system);
* a database table is written into a fresh staging table, and the old table is dropped and the
  staging table renamed in **one transaction** — a failure rolls back and leaves the previous scores
  intact. Table names are checked against a strict pattern and quoted by SQLAlchemy; an existing table
  that does not look like a scores table (no ``customer_id`` and ``predicted_class`` columns), or one
  of the bank's own source tables, is never replaced.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.sql import quoted_name

from fedgl_secure.data.sources.declaration import SqlSource
from fedgl_secure.data.sources.tables import create_source_engine, describe_url, split_table_name
from fedgl_secure.errors import ConfigError, DataSourceError
from fedgl_secure.log import get_logger

ID_COLUMN = "customer_id"
PREDICTED_COLUMN = "predicted_class"
SCORES_TABLE_PATTERN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$")
INSERT_ROWS = 10_000


def scores_table(
    customer_ids: np.ndarray,
    probabilities: np.ndarray,
    class_names: Sequence[str],
    predicted: np.ndarray | None = None,
) -> pa.Table:
    """The scores as an Arrow table (columns ``customer_id``, ``p_<class>``..., ``predicted_class``).

    ``predicted`` holds class indices; by default the most probable class.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    customer_ids = np.asarray(customer_ids)
    n = customer_ids.shape[0]
    names = [str(name) for name in class_names]
    if probabilities.shape != (n, len(names)):
        raise ValueError(f"probabilities have shape {probabilities.shape}; expected ({n}, {len(names)})")
    if len(set(names)) != len(names):
        raise ValueError(f"class names listed twice: {names}")
    if not np.isfinite(probabilities).all():
        raise ValueError("probabilities must be finite")
    predicted = probabilities.argmax(axis=1) if predicted is None else np.asarray(predicted)
    if predicted.shape != (n,) or not np.issubdtype(predicted.dtype, np.integer):
        raise ValueError(f"predicted must be {n} class indices, got {predicted.dtype} {predicted.shape}")
    if n and (predicted.min() < 0 or predicted.max() >= len(names)):
        raise ValueError(f"predicted class indices must lie in [0, {len(names)})")
    # through Python strings: pyarrow's conversion of a numpy unicode array would cut a value at a NUL
    columns: dict[str, pa.Array] = {ID_COLUMN: pa.array(customer_ids.astype(str).tolist(), pa.string())}
    for index, name in enumerate(names):
        columns[f"p_{name}"] = pa.array(probabilities[:, index], pa.float64())
    columns[PREDICTED_COLUMN] = pa.array(np.asarray(names, dtype=object)[predicted], pa.string())
    return pa.table(columns)


def write_scores(
    customer_ids: np.ndarray,
    probabilities: np.ndarray,
    class_names: Sequence[str],
    predicted: np.ndarray | None = None,
    *,
    output: str | Path | None = None,
    table: str | None = None,
    source: SqlSource | None = None,
) -> str:
    """Write the scores to ``output`` (``.parquet``/``.pq``/``.csv``) or to ``table`` of ``source``'s database.

    Returns where they went (for messages). See the module docstring for the atomic replacement.

    Raises:
        ConfigError: neither or both targets, an unknown file extension, a bad table name.
        DataSourceError: the file or table could not be written (the previous scores are intact).
    """
    if (output is None) == (table is None):
        raise ConfigError("scores go to exactly one of an output file and a database table")
    scores = scores_table(customer_ids, probabilities, class_names, predicted)
    log = get_logger(target=str(output) if output is not None else f"table {table}")
    if output is not None:
        _write_file(scores, Path(output))
        where = str(output)
    else:
        if source is None:
            raise ConfigError(f"table {table}: scores go into a table of the bank's database; [bank.data] is not SQL")
        _write_sql(scores, source, table or "")
        where = f"table {table} in {describe_url(source.resolved_url())}"
    log.info("scores.written", rows=scores.num_rows, columns=scores.num_columns)
    return where


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise ConfigError(f"{path}: scores are written as .parquet or .csv (by the extension), not {suffix or 'none'!r}")


def _write_file(scores: pa.Table, path: Path) -> None:
    """Temporary file in the same directory, fsync, ``os.replace``: the old file until the new one is complete."""
    kind = _file_format(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise DataSourceError(f"{path}: cannot write the scores: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            if kind == "parquet":
                pq.write_table(scores, stream)
            else:
                pacsv.write_csv(scores, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError | pa.ArrowException):
            raise DataSourceError(f"{path}: cannot write the scores: {error}") from None
        raise


def _check_table_name(name: str, source: SqlSource) -> tuple[str | None, str]:
    if not SCORES_TABLE_PATTERN.match(name):
        raise ConfigError(
            f"table {name!r}: a scores table name is letters, digits and _ (optionally schema.table, "
            "63 characters each)"
        )
    if name in {source.customers, source.transactions}:
        raise ConfigError(f"table {name}: that is one of the bank's own source tables; write the scores elsewhere")
    return split_table_name(name)


def _write_sql(scores: pa.Table, source: SqlSource, name: str) -> None:
    """Staging table, then drop the old and rename in one transaction (module docstring)."""
    schema, table_name = _check_table_name(name, source)
    url = source.resolved_url()
    described = describe_url(url)
    staging_name = f"{table_name[:40]}_staging_{secrets.token_hex(4)}"
    quoted_schema = quoted_name(schema, True) if schema else None
    metadata = sa.MetaData()
    staging = sa.Table(
        quoted_name(staging_name, True),
        metadata,
        *(
            sa.Column(quoted_name(field.name, True), sa.Float(53) if pa.types.is_floating(field.type) else sa.Text())
            for field in scores.schema
        ),
        schema=quoted_schema,
    )
    engine = create_source_engine(url, read_only=False)
    _transactional_ddl(engine)
    try:
        with engine.begin() as connection:
            staging.create(connection)
            for batch in scores.to_batches(max_chunksize=INSERT_ROWS):
                connection.execute(staging.insert(), batch.to_pylist())
            _drop_previous(connection, schema, table_name, described)
            preparer = connection.dialect.identifier_preparer
            new_name = preparer.quote(quoted_name(table_name, True))
            connection.exec_driver_sql(f"ALTER TABLE {preparer.format_table(staging)} RENAME TO {new_name}")
    except sa.exc.SQLAlchemyError as error:
        original = getattr(error, "orig", None) or error
        message = str(original).strip().splitlines()[0] if str(original).strip() else type(original).__name__
        raise DataSourceError(
            f"table {name} in database {described}: cannot write the scores ({message}); the previous scores, "
            "if any, are unchanged"
        ) from None
    finally:
        engine.dispose()


def _drop_previous(connection: sa.Connection, schema: str | None, table_name: str, described: str) -> None:
    """Drop an earlier scores table (inside the caller's transaction); refuse to drop anything else."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(table_name, schema=schema):
        return
    columns = {column["name"] for column in inspector.get_columns(table_name, schema=schema)}
    if not {ID_COLUMN, PREDICTED_COLUMN} <= columns:
        raise DataSourceError(
            f"table {table_name} in database {described} exists and is not a scores table (no {ID_COLUMN} and "
            f"{PREDICTED_COLUMN} columns); it is left alone: choose another table name or drop it yourself"
        )
    old = sa.Table(quoted_name(table_name, True), sa.MetaData(), schema=quoted_name(schema, True) if schema else None)
    old.drop(connection)


def _transactional_ddl(engine: sa.Engine) -> None:
    """SQLite through Python's sqlite3 runs DDL outside transactions unless told otherwise; make CREATE,
    DROP and ALTER part of the one transaction (SQLAlchemy's documented pysqlite recipe)."""
    if engine.dialect.name != "sqlite":
        return

    @sa.event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        connection.exec_driver_sql("BEGIN")
