"""The consortium-wide feature schema every bank's customer data must match (issue 9, DESIGN §5.6).

It lives in the shared consortium file (``[schema]``), never in a bank's own file: all banks must
turn their customers into the *same* feature vector, or the federated model means nothing. It
fixes

* which columns hold the bank's own customer id, the shared customer key (the value that is the
  same for one customer at every bank, pseudonymised before it leaves the bank), the label and
  the split;
* every feature: its column, its type, and how it is encoded — numeric columns are standardised
  with a centre and scale **fixed in the schema** (never computed from one bank's data, so no
  per-bank statistic is released), optionally after ``log1p`` and clipped; categorical columns are
  one-hot over the listed categories;
* the label classes (their order is the class index) and which class the ranking metrics score;
* the transactions table's columns.

Example (``services/consortium.toml``)::

    data = "bank-sources"

    [schema]
    id_column = "customer_id"
    key_column = "customer_key"
    label_column = "label"
    split_column = "split"
    label_classes = ["good", "fraud"]
    positive_class = "fraud"

    [[schema.features]]
    name = "balance"
    type = "numeric"
    log1p = true
    center = 8.0
    scale = 2.0
    clip = 5.0

    [[schema.features]]
    name = "segment"
    type = "categorical"
    categories = ["retail", "sme", "corporate"]

    [schema.transactions]
    source_column = "source_id"
    target_column = "target_id"
    amount_column = "amount"
    time_column = "timestamp"
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedgl_secure.tomlio import field_error

COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"  # safe as a SQL identifier and a Parquet column
SPLIT_VALUES = ("train", "val", "test")


class _Model(BaseModel):
    # validate_default: a default is checked like a given value (issue 13's default-skipping trap)
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class NumericFeature(_Model):
    """A numeric column, encoded as ``clip((t(x) - center) / scale, ±clip)`` with ``t = log1p`` or identity."""

    name: str = Field(pattern=COLUMN_PATTERN)
    type: Literal["numeric"]
    center: float = Field(0.0, allow_inf_nan=False)
    scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    clip: float | None = Field(None, gt=0, allow_inf_nan=False)
    log1p: bool = Field(False, description="apply log(1 + x) first (amounts, counts); needs x >= 0")
    missing: Literal["error", "center"] = Field(
        "error", description="a missing value is an error, or is replaced by the centre (encodes as 0)"
    )

    @property
    def width(self) -> int:
        return 1


class CategoricalFeature(_Model):
    """A categorical column, one-hot over ``categories`` (in that order)."""

    name: str = Field(pattern=COLUMN_PATTERN)
    type: Literal["categorical"]
    categories: tuple[str, ...] = Field(min_length=1)
    unknown: Literal["error", "ignore"] = Field(
        "error", description="a value outside the categories is an error, or encodes as all zeros"
    )
    missing: Literal["error", "ignore"] = "error"

    @model_validator(mode="after")
    def _categories_unique(self) -> CategoricalFeature:
        if len(set(self.categories)) != len(self.categories):
            raise field_error("categories", f"listed twice in {list(self.categories)}")
        return self

    @property
    def width(self) -> int:
        return len(self.categories)


Feature = Annotated[NumericFeature | CategoricalFeature, Field(discriminator="type")]


class TransactionColumns(_Model):
    """The transactions table: one row per transfer between two customers of the bank (by the bank's own id)."""

    source_column: str = Field("source_id", pattern=COLUMN_PATTERN)
    target_column: str = Field("target_id", pattern=COLUMN_PATTERN)
    amount_column: str | None = Field(None, pattern=COLUMN_PATTERN)
    time_column: str | None = Field(None, pattern=COLUMN_PATTERN)

    @model_validator(mode="after")
    def _distinct(self) -> TransactionColumns:
        columns = [c for c in (self.source_column, self.target_column, self.amount_column, self.time_column) if c]
        if len(set(columns)) != len(columns):
            raise field_error("target_column", f"the transaction columns must be distinct, got {columns}")
        return self


class SplitFractions(_Model):
    """How labelled customers are split when the data has no split column (by a keyed hash of the shared key,
    so a customer shared by two banks lands in the same split at both)."""

    train: float = Field(0.6, gt=0, lt=1)
    val: float = Field(0.2, gt=0, lt=1)
    test: float = Field(0.2, gt=0, lt=1)

    @model_validator(mode="after")
    def _sum_to_one(self) -> SplitFractions:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-9:
            raise field_error("test", f"train + val + test must be 1, got {total:g}")
        return self


class FeatureSchema(_Model):
    """What every bank's customers and transactions tables must look like (``[schema]`` of the consortium file)."""

    id_column: str = Field("customer_id", pattern=COLUMN_PATTERN)
    key_column: str | None = Field(
        None,
        pattern=COLUMN_PATTERN,
        description="the shared customer key (same customer, same key at every bank); default: id_column",
    )
    label_column: str = Field("label", pattern=COLUMN_PATTERN)
    split_column: str | None = Field(None, pattern=COLUMN_PATTERN)
    split_fractions: SplitFractions = SplitFractions()
    label_classes: tuple[str, ...] = Field(min_length=2)
    positive_class: str | None = None
    features: tuple[Feature, ...] = Field(min_length=1)
    transactions: TransactionColumns = TransactionColumns()

    @model_validator(mode="after")
    def _consistent(self) -> FeatureSchema:
        if len(set(self.label_classes)) != len(self.label_classes):
            raise field_error("label_classes", f"listed twice in {list(self.label_classes)}")
        if self.positive_class is not None and self.positive_class not in self.label_classes:
            raise field_error(
                "positive_class", f"{self.positive_class!r} is not one of label_classes {list(self.label_classes)}"
            )
        names = [feature.name for feature in self.features]
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise field_error("features", f"feature columns listed twice: {duplicates}")
        special = {self.id_column, self.customer_key_column, self.label_column, self.split_column} - {None}
        if clash := sorted(special & set(names)):
            raise field_error("features", f"{clash} are id/key/label/split columns, not features")
        if self.split_column is not None and self.split_column in {self.id_column, self.label_column}:
            raise field_error("split_column", "must differ from id_column and label_column")
        if self.label_column == self.id_column:
            raise field_error("label_column", "must differ from id_column")
        return self

    @property
    def customer_key_column(self) -> str:
        """The column whose value identifies a customer across banks (``key_column``, else ``id_column``)."""
        return self.key_column or self.id_column

    @property
    def num_classes(self) -> int:
        return len(self.label_classes)

    @property
    def positive_index(self) -> int | None:
        """Class index scored by the ranking metrics (ROC-AUC, PR-AUC, recall at top 1 %), if the schema names one."""
        return None if self.positive_class is None else self.label_classes.index(self.positive_class)

    @property
    def num_features(self) -> int:
        """Width of the encoded feature vector."""
        return sum(feature.width for feature in self.features)

    def feature_names(self) -> list[str]:
        """Name of every encoded column (``segment=retail`` for a one-hot column)."""
        names: list[str] = []
        for feature in self.features:
            if isinstance(feature, CategoricalFeature):
                names.extend(f"{feature.name}={category}" for category in feature.categories)
            else:
                names.append(feature.name)
        return names

    def customer_columns(self) -> list[str]:
        """Every column the customers table must have, in schema order."""
        columns = [self.id_column]
        if self.key_column is not None:
            columns.append(self.key_column)
        columns.append(self.label_column)
        if self.split_column is not None:
            columns.append(self.split_column)
        columns.extend(feature.name for feature in self.features)
        return columns

    def transaction_columns(self) -> list[str]:
        t = self.transactions
        return [c for c in (t.source_column, t.target_column, t.amount_column, t.time_column) if c is not None]
