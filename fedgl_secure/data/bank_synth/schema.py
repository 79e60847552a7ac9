"""The consortium ``[schema]`` the synthetic banks' tables match, and the values of their coded columns.

Fixed here from the generator's known distributions (never from generated rows), written as
``schema.toml`` by the entry point; the tables encode label, split, segment and region as indices
into the value tuples below.
"""

from __future__ import annotations

from typing import Any

import tomli_w

from fedgl_secure.data.sources.schema import CategoricalFeature, FeatureSchema, NumericFeature, TransactionColumns

LABELS = ("good", "fraud")
SPLITS = ("train", "val", "test")
SEGMENTS = ("retail", "sme", "corporate")
REGIONS = ("north", "south", "east", "west", "capital", "abroad")


def synthetic_bank_schema() -> FeatureSchema:
    """The consortium ``[schema]`` of the generated tables.

    Centres and scales are those of the generator's legitimate-customer distributions (the
    log-normal ``μ, σ`` after ``log1p``; mean and spread otherwise), fixed here once: computing them
    from generated rows would make the shared schema carry one bank's statistics.
    """
    numeric = (
        NumericFeature(name="age", type="numeric", center=45.0, scale=15.0, clip=4.0),
        NumericFeature(
            name="monthly_income", type="numeric", log1p=True, center=8.0, scale=0.65, clip=5.0, missing="center"
        ),
        NumericFeature(name="balance", type="numeric", log1p=True, center=7.5, scale=2.0, clip=5.0),
        NumericFeature(name="account_age_days", type="numeric", log1p=True, center=6.9, scale=1.0, clip=5.0),
        NumericFeature(name="card_tx_30d", type="numeric", log1p=True, center=2.6, scale=0.9, clip=5.0),
        NumericFeature(name="num_products", type="numeric", center=2.2, scale=1.1, clip=5.0),
    )
    categorical = (
        CategoricalFeature(name="segment", type="categorical", categories=SEGMENTS),
        CategoricalFeature(name="region", type="categorical", categories=REGIONS),
    )
    return FeatureSchema(
        id_column="customer_id",
        key_column="customer_key",
        label_column="label",
        split_column="split",
        label_classes=LABELS,
        positive_class="fraud",
        features=numeric + categorical,
        transactions=TransactionColumns(
            source_column="source_id", target_column="target_id", amount_column="amount", time_column="timestamp"
        ),
    )


def schema_document(schema: FeatureSchema) -> dict[str, Any]:
    """``schema`` as the plain ``[schema]`` table of a consortium file (it validates back to an equal schema).

    A numeric feature always spells out its centre and scale (the encoding a risk officer reviews);
    otherwise a feature lists only what differs from the defaults, and ``split_fractions`` is left
    out when it is the default (the tables carry a split column anyway).
    """
    document = schema.model_dump(
        mode="json", exclude_none=True, exclude={"features", "transactions", "split_fractions"}
    )
    if schema.split_fractions != type(schema.split_fractions)():
        document["split_fractions"] = schema.split_fractions.model_dump(mode="json")
    features = []
    for feature in schema.features:
        entry: dict[str, Any] = {"name": feature.name, "type": feature.type}
        if isinstance(feature, NumericFeature):
            entry |= {"center": feature.center, "scale": feature.scale}
        features.append(entry | feature.model_dump(mode="json", exclude_defaults=True, exclude_none=True))
    document["features"] = features
    document["transactions"] = schema.transactions.model_dump(mode="json", exclude_none=True)
    return document


def schema_toml(schema: FeatureSchema) -> str:
    """The ``schema.toml`` file: a comment, then ``[schema]`` exactly as a consortium file carries it."""
    return (
        "# The consortium feature schema of fedgl-secure's synthetic banks: copy it into the consortium file.\n"
        + tomli_w.dumps({"schema": schema_document(schema)})
    )
