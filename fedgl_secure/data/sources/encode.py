"""Turn a bank's customers table into the consortium's feature vectors, labels and split (vectorised).

Every bank must produce the *same* encoding for the same customer, so nothing here depends on the
bank's own data beyond the value being encoded: numeric columns use the centre and scale fixed in
the schema,

.. math::  z = \\operatorname{clip}\\big((t(x) - \\text{center}) / \\text{scale},\\ \\pm\\text{clip}\\big),
           \\qquad t = \\log(1 + x) \\text{ or the identity},

categorical columns are one-hot over the schema's categories (in their order), labels are indices
into ``label_classes`` (compared as text, so an integer column 0/1 matches classes ``["0", "1"]``;
a missing label is ``-1``, unlabelled), and — without a split column — a labelled customer's split
comes from a *keyed hash of its shared customer key*, ``SHA-256("<seed>:<key>")`` read as a number
in ``[0, 1)``: a customer two banks share lands in the same split at both, and no bank-local
randomness is involved.

A value the schema does not allow is a :class:`~fedgl_secure.errors.DataSourceError` naming the
source, the 1-based data row and the column, e.g.
``data/bank-a/customers.parquet: row 17, column 'age': NaN (missing = 'error')``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedgl_secure.data.sources.schema import SPLIT_VALUES, CategoricalFeature, FeatureSchema, NumericFeature
from fedgl_secure.data.sources.tables import as_float64
from fedgl_secure.errors import DataSourceError

MAX_ID_LENGTH = 256  # ids and keys are held as fixed-width text: one absurd value must not blow up memory


@dataclass(frozen=True)
class EncodedCustomers:
    """A customers table, encoded; every array is in the table's row order.

    Attributes:
        ids: ``N`` the bank's own customer ids, as text.
        keys: ``N`` the shared customer keys, as text (what is pseudonymised across banks).
        features: ``N x F`` float32 in ``schema.feature_names()`` order.
        labels: ``N`` int64 class indices, ``-1`` unlabelled.
        train_mask, val_mask, test_mask: ``N`` bool, disjoint, labelled customers only.
    """

    ids: np.ndarray
    keys: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray

    @property
    def num_customers(self) -> int:
        return int(self.ids.shape[0])


def where(origin: str, row: int, column: str) -> str:
    """``<origin>: row <1-based>, column '<name>'`` — how every cell-level error starts."""
    return f"{origin}: row {row + 1}, column {column!r}"


def first_true(mask: np.ndarray | pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first True (nulls count as False), or None."""
    if isinstance(mask, pa.Array | pa.ChunkedArray):
        mask = mask.fill_null(False).to_numpy(zero_copy_only=False)
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column (pandas categoricals in Parquet) as its plain values."""
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def id_strings(column: pa.ChunkedArray, *, origin: str, name: str, what: str) -> pa.Array:
    """An id column (integers or text) as text; missing, empty or over-long ids are errors naming the row."""
    column = _plain(column)
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataSourceError(
            f"{origin}: column {name!r} has type {kind}; {what}s must be integers or text"
            + (" (floating-point ids lose digits)" if pa.types.is_floating(kind) else "")
        )
    text = pc.cast(column, pa.string()).combine_chunks() if column.num_chunks else pa.array([], pa.string())
    if (row := first_true(text.is_null())) is not None:
        raise DataSourceError(f"{where(origin, row, name)}: missing {what}")
    lengths = pc.utf8_length(text)
    if (row := first_true(pc.equal(lengths, 0))) is not None:
        raise DataSourceError(f"{where(origin, row, name)}: empty {what}")
    if (row := first_true(pc.greater(lengths, MAX_ID_LENGTH))) is not None:
        raise DataSourceError(f"{where(origin, row, name)}: {what} longer than {MAX_ID_LENGTH} characters")
    if (row := first_true(pc.match_substring(text, "\x00"))) is not None:  # numpy text would cut it off there
        raise DataSourceError(f"{where(origin, row, name)}: {what} contains a NUL character")
    return text


def numeric_values(column: pa.ChunkedArray, *, origin: str, name: str) -> np.ndarray:
    """A numeric column as float64, missing values as NaN; any other column type is an error naming it."""
    column = _plain(column)
    kind = column.type
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
    if not (numeric or pa.types.is_boolean(kind) or pa.types.is_null(kind)):
        raise DataSourceError(
            f"{origin}: column {name!r} has type {kind}; a numeric column needs integers, decimals or floats"
        )
    values = as_float64(column).fill_null(np.nan)
    return values.to_numpy() if isinstance(values, pa.ChunkedArray) else np.asarray(values)


def _describe(value: float) -> str:
    if np.isnan(value):
        return "missing (null or NaN)"
    return f"{value} is not finite"


def _encode_numeric(feature: NumericFeature, column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """Eq. in the module docstring; returns ``N`` float64."""
    x = numeric_values(column, origin=origin, name=feature.name)
    missing = ~np.isfinite(x)
    if feature.missing == "error" and (row := first_true(missing)) is not None:
        raise DataSourceError(f"{where(origin, row, feature.name)}: {_describe(x[row])} (missing = 'error')")
    x = np.where(missing, 0.0, x)
    if feature.log1p:
        if (row := first_true(x < 0)) is not None:
            raise DataSourceError(f"{where(origin, row, feature.name)}: {x[row]} is negative; log1p needs x >= 0")
        x = np.log1p(x)
    with np.errstate(over="ignore", invalid="ignore"):
        z = (x - feature.center) / feature.scale
    if feature.clip is not None:
        z = np.clip(z, -feature.clip, feature.clip)
    z[missing] = 0.0  # missing = 'center': the centre, which encodes as 0
    if (row := first_true(~np.isfinite(z) | (np.abs(z) > np.finfo(np.float32).max))) is not None:
        raise DataSourceError(
            f"{where(origin, row, feature.name)}: {x[row]} is too large to encode (set clip in the schema)"
        )
    return z


def _text(column: pa.ChunkedArray, *, origin: str, name: str, what: str) -> pa.Array:
    """A label/category/split column as text (strings, integers, booleans; floats without NaN and ``.0``)."""
    column = _plain(column)
    kind = column.type
    if pa.types.is_floating(kind):  # pandas writes an integer column with gaps as float: 1.0, NaN
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, kind), column)
    elif not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_null(kind)
    ):
        raise DataSourceError(f"{origin}: column {name!r} has type {kind}; a {what} column needs text or integers")
    text = pc.cast(column, pa.string())
    return text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text


def _encode_categorical(feature: CategoricalFeature, column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """One-hot over ``feature.categories``; returns ``N`` category indices, ``-1`` for all zeros."""
    text = _text(column, origin=origin, name=feature.name, what="categorical")
    index = pc.index_in(text, value_set=pa.array(feature.categories, pa.string()))
    missing = text.is_null()
    unknown = pc.and_(pc.invert(missing), index.is_null())
    if feature.missing == "error" and (row := first_true(missing)) is not None:
        raise DataSourceError(f"{where(origin, row, feature.name)}: missing value (missing = 'error')")
    if feature.unknown == "error" and (row := first_true(unknown)) is not None:
        raise DataSourceError(
            f"{where(origin, row, feature.name)}: {text[row].as_py()!r} is not one of the categories "
            f"{list(feature.categories)} (unknown = 'error')"
        )
    return index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def encode_features(table: pa.Table, schema: FeatureSchema, *, origin: str) -> np.ndarray:
    """``N x F`` float32 in ``schema.feature_names()`` order."""
    n = table.num_rows
    features = np.zeros((n, schema.num_features), dtype=np.float32)
    offset = 0
    for feature in schema.features:
        column = table.column(feature.name)
        if isinstance(feature, NumericFeature):
            features[:, offset] = _encode_numeric(feature, column, origin)
        else:
            index = _encode_categorical(feature, column, origin)
            rows = np.flatnonzero(index >= 0)
            features[rows, offset + index[rows]] = 1.0
        offset += feature.width
    return features


def encode_labels(table: pa.Table, schema: FeatureSchema, *, origin: str) -> np.ndarray:
    """``N`` int64 class indices into ``schema.label_classes``; a missing label is ``-1``."""
    name = schema.label_column
    text = _text(table.column(name), origin=origin, name=name, what="label")
    index = pc.index_in(text, value_set=pa.array(schema.label_classes, pa.string()))
    outside = pc.and_(pc.invert(text.is_null()), index.is_null())
    if (row := first_true(outside)) is not None:
        raise DataSourceError(
            f"{where(origin, row, name)}: label {text[row].as_py()!r} is not one of the consortium's classes "
            f"{list(schema.label_classes)} (leave it empty for an unlabelled customer)"
        )
    return index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def keyed_unit_interval(keys: np.ndarray, seed: int) -> np.ndarray:
    """``SHA-256("<seed>:<key>")`` of every key, its first 8 bytes read as a number in ``[0, 1)``.

    The same key gives the same number at every bank (the split must agree for shared customers);
    a new seed gives a new, independent split.
    """
    prefix = f"{seed}:".encode()
    digests = b"".join(hashlib.sha256(prefix + key.encode()).digest()[:8] for key in keys.tolist())
    return np.frombuffer(digests, dtype=">u8").astype(np.float64) / 2.0**64


def encode_split(
    table: pa.Table, schema: FeatureSchema, labels: np.ndarray, keys: np.ndarray, *, origin: str, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train/val/test masks over labelled customers: from the split column, else by keyed hash of the key."""
    labelled = labels >= 0
    n = labels.shape[0]
    if schema.split_column is None:
        split = np.full(n, -1, dtype=np.int64)
        u = keyed_unit_interval(keys[labelled], seed)
        fractions = schema.split_fractions
        split[labelled] = np.where(u < fractions.train, 0, np.where(u < fractions.train + fractions.val, 1, 2))
    else:
        name = schema.split_column
        text = pc.utf8_lower(pc.utf8_trim_whitespace(_text(table.column(name), origin=origin, name=name, what="split")))
        index = pc.index_in(text, value_set=pa.array(SPLIT_VALUES, pa.string()))
        raw = table.column(name)
        if (row := first_true(pc.and_(pc.invert(text.is_null()), index.is_null()))) is not None:
            value = raw[row].as_py()
            raise DataSourceError(
                f"{where(origin, row, name)}: split {value!r} is not one of {list(SPLIT_VALUES)} (or empty)"
            )
        split = index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        if (row := first_true((split >= 0) & ~labelled)) is not None:
            raise DataSourceError(
                f"{where(origin, row, name)}: split {SPLIT_VALUES[split[row]]!r} on an unlabelled customer "
                f"(column {schema.label_column!r} is empty); only labelled customers are split"
            )
    return split == 0, split == 1, split == 2


def _unique(values: pa.Array, *, origin: str, name: str, what: str) -> None:
    """Every value once; a repeat is an error naming the value and both rows."""
    counts = pc.value_counts(values)
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(repeated) == 0:
        return
    rows = np.flatnonzero(pc.is_in(values, value_set=repeated).to_numpy(zero_copy_only=False))
    first = int(rows[0])
    value = values[first].as_py()
    same = rows[1:][pc.equal(values.take(pa.array(rows[1:])), value).to_numpy(zero_copy_only=False)]
    raise DataSourceError(
        f"{origin}: column {name!r}: {what} {value!r} appears twice, in rows {first + 1} and {int(same[0]) + 1}"
    )


def _as_numpy_text(values: pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.str_)


def encode_customers(table: pa.Table, schema: FeatureSchema, *, origin: str, seed: int = 0) -> EncodedCustomers:
    """Encode a customers table (columns: ``schema.customer_columns()``) as the consortium's schema says."""
    if table.num_rows == 0:
        raise DataSourceError(f"{origin}: no customers (the table is empty); a bank brings at least one")
    ids = id_strings(table.column(schema.id_column), origin=origin, name=schema.id_column, what="customer id")
    _unique(ids, origin=origin, name=schema.id_column, what="customer id")
    if schema.key_column is None:
        keys = ids
    else:
        keys = id_strings(table.column(schema.key_column), origin=origin, name=schema.key_column, what="customer key")
        _unique(keys, origin=origin, name=schema.key_column, what="customer key")
    labels = encode_labels(table, schema, origin=origin)
    features = encode_features(table, schema, origin=origin)
    key_text = _as_numpy_text(keys)
    train, val, test = encode_split(table, schema, labels, key_text, origin=origin, seed=seed)
    return EncodedCustomers(
        ids=key_text if keys is ids else _as_numpy_text(ids),
        keys=key_text,
        features=features,
        labels=labels,
        train_mask=train,
        val_mask=val,
        test_mask=test,
    )
