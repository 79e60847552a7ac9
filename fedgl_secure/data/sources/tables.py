"""Read a bank's customers and transactions tables into Arrow, projected onto the schema's columns.

Only the columns the consortium's :class:`~fedgl_secure.data.sources.schema.FeatureSchema` names are
ever read (a bank's tables usually hold much more: names, addresses, notes), and every source is
streamed batch by batch, so a table of millions of rows is never held twice:

* **Parquet** through ``ParquetFile.iter_batches(columns=...)``;
* **CSV** through ``pyarrow.csv.open_csv`` (every column read as text — a CSV file has no types —
  and the numeric columns converted batch by batch, so a bad cell is reported with its row);
* **SQL** through SQLAlchemy: a table becomes ``SELECT <quoted columns> FROM <quoted table>``, a
  query is wrapped as a subquery the columns are selected from; rows are streamed with
  ``stream_results``/``yield_per`` into Arrow record batches. SQLite files are opened read-only.

Every failure — a missing file, a file that is not Parquet/CSV, a missing table or column, a
database that cannot be reached — is a :class:`~fedgl_secure.errors.DataSourceError` naming the
file or table (and the column, and for a bad cell the 1-based data row), never a traceback.

Identifier columns keep the type they come with (string or integer); the encoder turns them into
text, so downstream every id and key is a string.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.sql import quoted_name

from fedgl_secure.data.sources.declaration import DataSource, FileSource, SqlSource
from fedgl_secure.data.sources.schema import FeatureSchema, NumericFeature
from fedgl_secure.errors import DataSourceError

Which = Literal["customers", "transactions"]

BATCH_ROWS = 65_536
CSV_BLOCK_BYTES = 8 << 20  # one CSV batch: large enough that per-batch work does not dominate
# CSV cells read as missing (null): an empty cell and the usual spellings of "not available".
CSV_NULL_VALUES = ["", "NA", "N/A", "NULL", "null", "NaN", "nan"]
# What a CSV number may look like (used only to find the row of a cell that failed to convert).
_NUMBER = r"^\s*[+-]?((\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|nan|inf|infinity)\s*$"


@dataclass(frozen=True)
class SourceTable:
    """One table read from a bank's source: exactly the requested columns, and where it came from.

    ``origin`` is what every error message starts with: the file path, ``table customers`` or
    ``customers_query``.
    """

    table: pa.Table
    origin: str

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


def read_customers(source: DataSource, schema: FeatureSchema) -> SourceTable:
    """The customers table with exactly ``schema.customer_columns()`` (numeric features as numbers)."""
    numeric = [f.name for f in schema.features if isinstance(f, NumericFeature)]
    return read_table(source, "customers", schema.customer_columns(), numeric_columns=numeric)


def read_transactions(source: DataSource, schema: FeatureSchema) -> SourceTable:
    """The transactions table with exactly ``schema.transaction_columns()`` (the amount as a number)."""
    amount = schema.transactions.amount_column
    return read_table(source, "transactions", schema.transaction_columns(), numeric_columns=[amount] if amount else [])


def read_table(
    source: DataSource, which: Which, columns: Sequence[str], *, numeric_columns: Sequence[str] = ()
) -> SourceTable:
    """Read ``columns`` of the bank's ``which`` table (in that order).

    ``numeric_columns`` matter for CSV only (text is converted to float64, a bad cell naming its row);
    typed sources (Parquet, SQL) keep their column types and the encoder checks them.
    """
    columns = list(dict.fromkeys(columns))
    if isinstance(source, FileSource):
        path = Path(getattr(source, which))
        if source.file_format(path) == "parquet":
            return _read_parquet(path, columns)
        return _read_csv(path, columns, [c for c in columns if c in set(numeric_columns)])
    if isinstance(source, SqlSource):
        return _read_sql(source, which, columns)
    raise TypeError(f"unknown data source {type(source).__name__}")


# ----------------------------------------------------------------------------------------------- files


def _missing_columns(origin: str, wanted: Sequence[str], available: Sequence[str]) -> None:
    """Every wanted column present exactly once (an error names the first that is not)."""
    if twice := [c for c in wanted if list(available).count(c) > 1]:
        raise DataSourceError(f"{origin}: column {twice[0]!r} appears more than once; which one is meant is unclear")
    missing = [c for c in wanted if c not in set(available)]
    if not missing:
        return
    hints = []
    lowered = {name.lower(): name for name in available}
    for column in missing:
        if column.lower() in lowered:
            hints.append(f"{column!r} differs only in case from {lowered[column.lower()]!r}")
    shown = list(available)[:30]
    more = f" ... ({len(available)} in all)" if len(available) > len(shown) else ""
    hint = f"; {'; '.join(hints)}" if hints else ""
    raise DataSourceError(
        f"{origin}: column {missing[0]!r} is missing"
        + (f" (also missing: {missing[1:]})" if len(missing) > 1 else "")
        + f"; the consortium's schema needs it. Columns present: {shown}{more}{hint}"
    )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DataSourceError(f"{path}: file not found")
    if not path.is_file():
        raise DataSourceError(f"{path}: not a file")


def _read_parquet(path: Path, columns: list[str]) -> SourceTable:
    origin = str(path)
    _check_file(path)
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise DataSourceError(f"{origin}: cannot read as Parquet: {_first_line(error)}") from None
    with parquet:
        available = parquet.schema_arrow.names
        _missing_columns(origin, columns, available)
        schema = pa.schema([parquet.schema_arrow.field(c) for c in columns])
        try:
            batches = list(parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=True))
            return SourceTable(pa.Table.from_batches(batches, schema=schema), origin)
        except (pa.ArrowException, OSError) as error:
            raise DataSourceError(f"{origin}: cannot read: {_first_line(error)}") from None


def _csv_header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataSourceError(f"{path}: cannot read the CSV header: {_first_line(error)}") from None


def _read_csv(path: Path, columns: list[str], numeric: list[str]) -> SourceTable:
    origin = str(path)
    _check_file(path)
    header = _csv_header(path)
    if not header:
        raise DataSourceError(f"{origin}: empty file (a CSV file needs a header line naming its columns)")
    _missing_columns(origin, columns, header)
    convert = pacsv.ConvertOptions(
        include_columns=columns,
        column_types={c: pa.string() for c in columns},
        null_values=CSV_NULL_VALUES,
        strings_can_be_null=True,
    )
    schema = pa.schema([pa.field(c, pa.float64() if c in numeric else pa.string()) for c in columns])
    batches: list[pa.RecordBatch] = []
    offset = 0
    try:
        read = pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES)
        with pacsv.open_csv(path, read_options=read, convert_options=convert) as reader:
            for batch in reader:
                arrays = [
                    _csv_number(batch.column(i), origin, offset, name) if name in numeric else batch.column(i)
                    for i, name in enumerate(batch.schema.names)
                ]
                batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
                offset += batch.num_rows
    except pa.ArrowException as error:
        raise DataSourceError(f"{origin}: cannot read as CSV (after row {offset}): {_first_line(error)}") from None
    return SourceTable(pa.Table.from_batches(batches, schema=schema), origin)


def _csv_number(text: pa.Array, origin: str, offset: int, column: str) -> pa.Array:
    """A CSV text column as float64; a cell that is not a number is an error naming its row."""
    trimmed = pc.utf8_trim_whitespace(text)
    try:
        return pc.cast(trimmed, pa.float64())
    except pa.ArrowException:
        bad = pc.invert(pc.match_substring_regex(trimmed, _NUMBER, ignore_case=True)).fill_null(False)
        rows = bad.to_numpy(zero_copy_only=False).nonzero()[0]
        row = int(rows[0]) if rows.size else 0
        value = text[row].as_py()
        raise DataSourceError(
            f"{origin}: row {offset + row + 1}, column {column!r}: {value!r} is not a number"
        ) from None


# ----------------------------------------------------------------------------------------------- SQL


def describe_url(url: str) -> str:
    """A database URL safe to print (password hidden)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"


def split_table_name(name: str) -> tuple[str | None, str]:
    """``schema.table`` → (schema, table); ``table`` → (None, table)."""
    schema, _, table = name.rpartition(".")
    return (schema or None), table


def create_source_engine(url: str, *, read_only: bool) -> sa.Engine:
    """A SQLAlchemy engine for the bank's database.

    SQLite: a file that does not exist is an error (SQLite would silently create an empty one), and
    ``read_only`` opens it read-only, so checking a bank's data never writes to its database.
    """
    described = describe_url(url)
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as error:
        raise DataSourceError(f"database URL {described}: {_first_line(error)}") from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            path = Path(database)
            if not path.is_file():
                raise DataSourceError(f"database {described}: SQLite file {path} not found")
            if read_only:  # SQLAlchemy passes a file: URI with mode=ro to sqlite3
                parsed = parsed.set(database=f"file:{path.resolve()}", query={"mode": "ro", "uri": "true"})
    try:
        engine = sa.create_engine(parsed)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as error:
        raise DataSourceError(f"database {described}: {_first_line(error)}") from None
    return engine


def _read_sql(source: SqlSource, which: Which, columns: list[str]) -> SourceTable:
    url = source.resolved_url()
    table_name: str | None = getattr(source, which)
    query: str | None = getattr(source, f"{which}_query")
    origin = f"table {table_name}" if table_name is not None else f"{which}_query"
    described = describe_url(url)
    engine = create_source_engine(url, read_only=True)
    try:
        with engine.connect() as connection:
            if table_name is not None:
                statement = _table_select(connection, table_name, columns, origin, described)
            else:
                statement = _query_select(connection, query or "", columns, origin)
            streamed = connection.execution_options(stream_results=True, yield_per=BATCH_ROWS)
            result = streamed.execute(statement)
            table = _rows_to_table(result.partitions(), columns, origin)
    except sa.exc.SQLAlchemyError as error:
        raise DataSourceError(f"{origin} in database {described}: {_sql_message(error)}") from None
    finally:
        engine.dispose()
    return SourceTable(table, origin)


def _table_select(connection: sa.Connection, name: str, columns: list[str], origin: str, described: str) -> sa.Select:
    schema, table = split_table_name(name)
    inspector = sa.inspect(connection)
    if not inspector.has_table(table, schema=schema):
        raise DataSourceError(f"{origin}: no such table in database {described}")
    available = [column["name"] for column in inspector.get_columns(table, schema=schema)]
    _missing_columns(origin, columns, available)
    quoted = sa.table(
        quoted_name(table, True),
        *(sa.column(quoted_name(c, True)) for c in columns),
        schema=quoted_name(schema, True) if schema else None,
    )
    return sa.select(*quoted.c)


def _query_select(connection: sa.Connection, query: str, columns: list[str], origin: str) -> sa.Select:
    text = query.strip().rstrip(";").strip()
    if not text:
        raise DataSourceError(f"{origin}: empty query")
    probe = sa.select(sa.literal_column("*")).select_from(sa.text(text).columns().subquery("source_query")).limit(0)
    available = list(connection.execute(probe).keys())
    _missing_columns(origin, columns, available)
    subquery = sa.text(text).columns(*(sa.column(quoted_name(c, True)) for c in columns)).subquery("source_query")
    return sa.select(*subquery.c)


def _rows_to_table(partitions: Iterator[Sequence[sa.Row]], columns: list[str], origin: str) -> pa.Table:
    """Streamed rows → one Arrow table: each partition becomes one record batch (column types inferred,
    then unified across batches: a batch of only NULLs takes the others' type, integers next to
    floats or decimals become float64)."""
    chunks: dict[str, list[pa.Array]] = {c: [] for c in columns}
    offset = 0
    for rows in partitions:
        values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
        for column, cells in zip(columns, values, strict=True):
            chunks[column].append(_cells_to_array(list(cells), origin, offset, column))
        offset += len(rows)
    arrays = [_unify(chunks[c], origin, c) for c in columns]
    return pa.Table.from_arrays(arrays, names=columns)


def _cells_to_array(cells: list[object], origin: str, offset: int, column: str) -> pa.Array:
    try:
        return pa.array(cells)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        first = next((type(v) for v in cells if v is not None), None)
        row = next((i for i, v in enumerate(cells) if v is not None and type(v) is not first), 0)
        raise DataSourceError(
            f"{origin}: row {offset + row + 1}, column {column!r}: value {cells[row]!r} "
            f"({type(cells[row]).__name__}) does not fit the column's other values ({getattr(first, '__name__', '?')})"
        ) from None


def _unify(chunks: list[pa.Array], origin: str, column: str) -> pa.ChunkedArray:
    types = {chunk.type for chunk in chunks if not pa.types.is_null(chunk.type)}
    if not types:
        return pa.chunked_array(chunks, type=pa.null()) if chunks else pa.chunked_array([], type=pa.null())
    if len(types) == 1:
        target = types.pop()
    elif all(pa.types.is_decimal(t) for t in types):  # numeric(p, s) arrives with each batch's own precision
        scale = max(t.scale for t in types)
        precision = max(t.precision - t.scale for t in types) + scale
        target = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(min(precision, 76), scale)
    elif all(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in types):
        return pa.chunked_array([as_float64(chunk) for chunk in chunks], type=pa.float64())
    elif all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in types):
        target = pa.large_string()
    else:
        raise DataSourceError(f"{origin}: column {column!r} holds values of different types: {sorted(map(str, types))}")
    return pa.chunked_array([chunk.cast(target) for chunk in chunks], type=target)


def as_float64(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Numbers as float64; decimals through their text, so 25.49 becomes the double nearest 25.49 (Arrow's
    direct decimal cast can be one unit in the last place off, and banks must encode identically)."""
    if pa.types.is_decimal(values.type):
        return pc.cast(pc.cast(values, pa.string()), pa.float64())
    return pc.cast(values, pa.float64())


def _sql_message(error: sa.exc.SQLAlchemyError) -> str:
    original = getattr(error, "orig", None)
    return _first_line(original if original is not None else error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
