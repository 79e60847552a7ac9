"""A seeded, bank-like consortium on disk: every bank's own customers and transactions tables (issue 9, item 5).

Banks want to try the framework on data shaped like theirs before they point it at the real thing. This
module writes, for ``N`` banks, the two tables a bank declares in its node file (DESIGN §5.6), in
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
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass
from math import comb
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import tomli_w

from fedgl_secure.data.sources.schema import CategoricalFeature, FeatureSchema, NumericFeature, TransactionColumns
from fedgl_secure.errors import ConfigError
from fedgl_secure.fileio import write_atomically
from fedgl_secure.log import get_logger

Format = Literal["parquet", "csv", "sqlite"]
FORMATS: tuple[str, ...] = get_args(Format)

GENERATOR = "fedgl-secure bank_synth"
GENERATOR_VERSION = 1
SCHEMA_FILE = "schema.toml"
MANIFEST_FILE = "manifest.json"
MARKER_FILE = ".synth-in-progress.json"
SQLITE_FILE = "bank.sqlite"
MAX_BANKS = 702  # bank-a ... bank-zz
MIN_CUSTOMERS = 10
MAX_PERSONS = 100_000_000  # banks × customers: int32 indices and string offsets stay far from overflow

LABELS = ("good", "fraud")
SPLITS = ("train", "val", "test")
SPLIT_SHARES = (0.6, 0.2, 0.2)
SEGMENTS = ("retail", "sme", "corporate")
REGIONS = ("north", "south", "east", "west", "capital", "abroad")
# category probabilities (legitimate, fraud), in the order of SEGMENTS / REGIONS
SEGMENT_PROBABILITIES = ((0.80, 0.15, 0.05), (0.90, 0.09, 0.01))
REGION_PROBABILITIES = ((0.20, 0.20, 0.20, 0.20, 0.18, 0.02), (0.17, 0.17, 0.17, 0.17, 0.20, 0.12))

PAIR_SHARE = 0.8  # of a bank's shared customers, the share held by exactly one other bank
BACKGROUND_PER_CUSTOMER = 2.6  # background relationships drawn per customer at each bank
LOCAL_SHARE = 0.5  # of the background relationships, the share seen at the drawing bank only
RING_SIZES = (3, 9)  # fraud ring sizes, [low, high)
RING_OUT_DEGREE = 2  # relationships each fraudster sends inside its ring
VICTIMS_PER_FRAUDSTER = 1.5  # mean legitimate customers paying each fraudster
REPEAT_P = 0.7  # transfers per relationship ~ Geometric(REPEAT_P), mean 1/0.7 ≈ 1.43
WINDOW_START = 1_704_067_200  # 2024-01-01T00:00:00Z
WINDOW_SECONDS = 90 * 86_400
RING_BURST_SECONDS = 14 * 86_400
REPEAT_SPREAD_SECONDS = 7 * 86_400  # a relationship's repeated transfers fall within a week of its first
INCOME_MISSING = 0.02
TIMESTAMP_TYPE = pa.timestamp("s", tz="UTC")
SQLITE_BATCH_ROWS = 100_000


@dataclass(frozen=True)
class SynthParameters:
    """What ``synthesize_banks`` was asked for; two runs with equal parameters write the same rows."""

    seed: int
    banks: int
    customers: int
    format: str
    shared_fraction: float
    fraud_rate: float
    labelled_fraction: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, stored: dict[str, Any]) -> list[str]:
        """``name: <stored> there, <ours> asked`` for every parameter (and the generator version) that differs.

        ``stored`` is a manifest or marker document; another generator version writes other rows
        for the same parameters, so it counts as a difference too.
        """
        theirs = stored.get("parameters")
        theirs = theirs if isinstance(theirs, dict) else {}
        found = [
            f"{key}: {theirs.get(key)!r} there, {value!r} asked"
            for key, value in self.to_dict().items()
            if theirs.get(key) != value
        ]
        if stored.get("version") != GENERATOR_VERSION:
            found.append(f"generator version: {stored.get('version')!r} there, {GENERATOR_VERSION} here")
        return found


@dataclass(frozen=True)
class BankSummary:
    """One bank's files and realised counts (``fraud_rate`` is fraud among its labelled customers)."""

    name: str
    customers: int
    transactions: int
    shared_customers: int
    labelled: int
    fraud: int
    fraud_rate: float
    mean_degree: float
    fraud_edge_homophily: float
    files: dict[str, int]


@dataclass(frozen=True)
class SynthSummary:
    """What is in ``out_dir`` (read back from its manifest when it was ``already_there``)."""

    out_dir: Path
    parameters: SynthParameters
    persons: int
    shared_persons: int
    fraud_rate: float
    banks: tuple[BankSummary, ...]
    already_there: bool = False
    schema_file: str = SCHEMA_FILE

    def manifest(self) -> dict[str, Any]:
        """The manifest document (no wall-clock values, so it is as deterministic as the tables)."""
        return {
            "generator": GENERATOR,
            "version": GENERATOR_VERSION,
            "parameters": self.parameters.to_dict(),
            "schema": self.schema_file,
            "persons": self.persons,
            "shared_persons": self.shared_persons,
            "fraud_rate": self.fraud_rate,
            "banks": [asdict(bank) for bank in self.banks],
        }

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "already_there": self.already_there, **self.manifest()}

    @classmethod
    def from_manifest(cls, out_dir: Path, document: dict[str, Any], already_there: bool) -> SynthSummary:
        return cls(
            out_dir=out_dir,
            parameters=SynthParameters(**document["parameters"]),
            persons=int(document["persons"]),
            shared_persons=int(document["shared_persons"]),
            fraud_rate=float(document["fraud_rate"]),
            banks=tuple(BankSummary(**bank) for bank in document["banks"]),
            already_there=already_there,
            schema_file=document.get("schema", SCHEMA_FILE),
        )


# --------------------------------------------------------------------------------------------- schema


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


# ----------------------------------------------------------------------------------------- validation


def bank_name(index: int) -> str:
    """``bank-a`` ... ``bank-z``, ``bank-aa`` ... (spreadsheet-style letters, so names sort by length then letter)."""
    letters = ""
    index += 1
    while index > 0:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"bank-{letters}"


def _validated(
    *, seed: int, banks: int, customers: int, fmt: str, shared_fraction: float, fraud_rate: float, labelled: float
) -> SynthParameters:
    def integer(name: str, value: Any, low: int, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"{name}: must be an integer, got {value!r}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{name}: must be {bound}, got {value}")
        return int(value)

    def fraction(name: str, value: Any, low: float, high: float, open_low: bool, open_high: bool) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: must be a number, got {value!r}") from None
        too_low = number <= low if open_low else number < low
        too_high = number >= high if open_high else number > high
        if not np.isfinite(number) or too_low or too_high:
            interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
            raise ConfigError(f"{name}: must be in {interval}, got {value!r}")
        return number

    banks = integer("banks", banks, 2, MAX_BANKS)
    customers = integer("customers", customers, MIN_CUSTOMERS)
    if banks * customers > MAX_PERSONS:
        raise ConfigError(f"customers: banks × customers must be at most {MAX_PERSONS}, got {banks * customers}")
    if fmt not in FORMATS:
        raise ConfigError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return SynthParameters(
        seed=integer("seed", seed, 0, 2**63 - 1),
        banks=banks,
        customers=customers,
        format=fmt,
        shared_fraction=fraction("shared_fraction", shared_fraction, 0.0, 1.0, False, False),
        fraud_rate=fraction("fraud_rate", fraud_rate, 0.0, 0.5, True, False),
        labelled_fraction=fraction("labelled_fraction", labelled, 0.0, 1.0, True, False),
    )


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


# ----------------------------------------------------------------------------------------- population


@dataclass(frozen=True)
class _Population:
    """Person-level truth: who banks where, labels, splits and the features a person has everywhere."""

    members: tuple[np.ndarray, ...]  # per bank: person index of each row (row i is customer number i)
    bank_count: np.ndarray  # banks holding each person
    fraud: np.ndarray  # bool, truth
    labelled: np.ndarray  # bool
    split: np.ndarray  # int8 index into SPLITS, -1 when unlabelled
    keys: pa.StringArray
    age: np.ndarray
    income: np.ndarray  # NaN when unknown
    segment: np.ndarray  # int8 index into SEGMENTS
    region: np.ndarray  # int8 index into REGIONS


def _population(parameters: SynthParameters, rng: np.random.Generator) -> _Population:
    banks, n = parameters.banks, parameters.customers
    k = round(parameters.shared_fraction * n)
    m = int(PAIR_SHARE * k) // (banks - 1)
    g = k - (banks - 1) * m
    pair_a, pair_b = np.triu_indices(banks, 1)
    pair_base = banks * (n - k)
    all_base = pair_base + comb(banks, 2) * m
    persons = all_base + g
    members = []
    for b in range(banks):
        pairs = np.flatnonzero((pair_a == b) | (pair_b == b))
        held = np.concatenate(
            [
                np.arange(b * (n - k), (b + 1) * (n - k)),
                (pair_base + pairs[:, None] * m + np.arange(m)[None, :]).ravel(),
                np.arange(all_base, persons),
            ]
        )
        members.append(rng.permutation(held).astype(np.int32))
    bank_count = np.bincount(np.concatenate(members), minlength=persons).astype(np.int16)

    # Draws are stratified by the group of banks holding a person (and then by label), so every bank
    # gets its share of fraudsters, labels and splits up to rounding, even at a few thousand customers.
    group = np.concatenate(
        [
            np.repeat(np.arange(banks), n - k),
            banks + np.repeat(np.arange(len(pair_a)), m),
            np.full(g, banks + len(pair_a)),
        ]
    )
    fraud = _systematic(group, parameters.fraud_rate, rng) < 1
    by_label = 2 * group + fraud
    labelled = _systematic(by_label, parameters.labelled_fraction, rng) < 1
    position = _systematic(np.where(labelled, by_label, -1), 1.0, rng)
    split = np.searchsorted(np.cumsum(SPLIT_SHARES)[:-1], position, side="right").astype(np.int8)
    split[~labelled] = -1

    salt = rng.integers(0, 2**63, dtype=np.uint64)
    f = fraud
    age = np.clip(np.where(f, rng.normal(36.0, 13.0, persons), rng.normal(46.0, 15.0, persons)), 18, 95)
    income = np.round(np.where(f, rng.lognormal(7.7, 0.75, persons), rng.lognormal(8.0, 0.6, persons)), 2)
    income[rng.random(persons) < INCOME_MISSING] = np.nan
    return _Population(
        members=tuple(members),
        bank_count=bank_count,
        fraud=fraud,
        labelled=labelled,
        split=split,
        keys=_hex_keys(np.arange(persons, dtype=np.uint64), salt),
        age=age.astype(np.int64),
        income=income,
        segment=_categorical(rng, f, SEGMENT_PROBABILITIES),
        region=_categorical(rng, f, REGION_PROBABILITIES),
    )


def _systematic(strata: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Systematic sampling within each stratum, as a position: ``position < 1`` selects a ``fraction``.

    Persons are put in random order inside their stratum; person ``r`` of ``s`` gets
    ``(r + u) / s`` (one uniform ``u`` per stratum), and is selected when
    ``⌊(r + 1) f + u⌋ > ⌊r f + u⌋``. So every stratum gets ``s·f`` selected persons up to one (and
    exactly that in expectation). The position returned is ``(r + u) / s`` for a selected person and
    ``1 + (r + u) / s`` for the others; with ``fraction = 1`` it is a stratified uniform in ``[0, 1)``
    (cut at 0.6 and 0.8 for the train/val/test split).
    """
    count = len(strata)
    order = np.lexsort((rng.random(count), strata))
    sorted_strata = strata[order]
    starts = np.flatnonzero(np.r_[True, sorted_strata[1:] != sorted_strata[:-1]])
    sizes = np.diff(np.r_[starts, count])
    which = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(count) - starts[which]
    u = rng.random(len(starts))[which]
    chosen = np.floor((rank + 1) * fraction + u) > np.floor(rank * fraction + u)
    position = np.empty(count)
    position[order] = np.where(chosen, (rank + u) / sizes[which], 1.0 + (rank + u) / sizes[which])
    return position


def _categorical(rng: np.random.Generator, fraud: np.ndarray, probabilities: tuple[tuple[float, ...], ...]):
    """Category index per person, from the legitimate or the fraud distribution."""
    u = rng.random(len(fraud))
    legit, shifted = (np.cumsum(p)[:-1] for p in probabilities)
    return np.where(fraud, np.searchsorted(shifted, u, side="right"), np.searchsorted(legit, u, side="right")).astype(
        np.int8
    )


def _hex_keys(index: np.ndarray, salt: np.uint64) -> pa.StringArray:
    """16 hex digits per person: the splitmix64 finaliser (a bijection) of ``index · φ + salt``.

    A bijection, so two persons never share a key; the salt (drawn from the seed) makes two seeds' keys
    unrelated.
    """
    with np.errstate(over="ignore"):
        z = index * np.uint64(0x9E3779B97F4A7C15) + salt
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    octets = z.astype(">u8").view(np.uint8).reshape(-1, 8)
    text = np.stack([digits[octets >> 4], digits[octets & 15]], axis=2).reshape(-1, 16)
    return _fixed_width_strings(text)


def _customer_ids(prefix: str, count: int) -> pa.StringArray:
    """``<PREFIX>-<number>`` for 0 ... count - 1, zero-padded to one width (at least 7 digits)."""
    width = max(7, len(str(count - 1)))
    head = f"{prefix}-".encode()
    text = np.empty((count, len(head) + width), dtype=np.uint8)
    text[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    number = np.arange(count, dtype=np.int64)
    for position in range(width - 1, -1, -1):
        number, digit = np.divmod(number, 10)
        text[:, len(head) + position] = digit + ord("0")
    return _fixed_width_strings(text)


def _fixed_width_strings(text: np.ndarray) -> pa.StringArray:
    """A string array from an ``(n, width)`` uint8 matrix of ASCII, without a Python object per string."""
    count, width = text.shape
    offsets = np.arange(0, (count + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text)))


def _coded_strings(codes: np.ndarray, values: tuple[str, ...]) -> pa.Array:
    """Strings ``values[codes]``, null where ``codes < 0``."""
    indices = pa.array(codes.astype(np.int8), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array(values)).dictionary_decode()


# ------------------------------------------------------------------------------------------- per bank


def _customers_table(
    schema: FeatureSchema, population: _Population, bank: int, ids: pa.StringArray, rng: np.random.Generator
) -> pa.Table:
    """The bank's customers table: person-level columns gathered, bank-level features drawn here."""
    rows = population.members[bank]
    n = len(rows)
    f = population.fraud[rows]
    label = np.where(population.labelled[rows], f.astype(np.int8), np.int8(-1))
    balance = np.round(np.where(f, rng.lognormal(7.2, 1.9, n), rng.lognormal(7.8, 1.6, n)), 2)
    balance[rng.random(n) < np.where(f, 0.10, 0.05)] = 0.0
    account_age = np.maximum(1, np.where(f, rng.lognormal(6.0, 1.1, n), rng.lognormal(7.0, 0.9, n))).astype(np.int64)
    card_tx = rng.poisson(np.where(f, rng.lognormal(3.0, 0.9, n), rng.lognormal(2.6, 0.7, n)))
    products = 1 + rng.poisson(np.where(f, 0.6, 1.2))
    income = population.income[rows]
    columns = {
        schema.id_column: ids,
        schema.customer_key_column: population.keys.take(pa.array(rows)),
        schema.label_column: _coded_strings(label, LABELS),
        "split": _coded_strings(population.split[rows], SPLITS),
        "age": pa.array(population.age[rows]),
        "monthly_income": pa.array(income, mask=np.isnan(income)),
        "balance": pa.array(balance),
        "account_age_days": pa.array(account_age),
        "card_tx_30d": pa.array(card_tx.astype(np.int64)),
        "num_products": pa.array(products.astype(np.int64)),
        "segment": _coded_strings(population.segment[rows], SEGMENTS),
        "region": _coded_strings(population.region[rows], REGIONS),
    }
    return pa.table(columns)


@dataclass(frozen=True)
class _Transfers:
    """Transfers between persons (person indices), one row per transfer."""

    source: np.ndarray
    target: np.ndarray
    amount: np.ndarray
    time: np.ndarray

    @staticmethod
    def concatenate(parts: list[_Transfers]) -> _Transfers:
        return _Transfers(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in ("source", "target", "amount", "time"))
        )

    def select(self, mask: np.ndarray) -> _Transfers:
        return _Transfers(self.source[mask], self.target[mask], self.amount[mask], self.time[mask])


def _bank_relationships(population: _Population, bank: int, rng: np.random.Generator) -> tuple[_Transfers, _Transfers]:
    """The transfers drawn at one bank: (person-level ones, seen wherever both persons bank; bank-local ones)."""
    rows = population.members[bank]
    n = len(rows)
    fraud = population.fraud[rows]

    activity = np.cumsum(rng.lognormal(0.0, 0.9, n))
    count = round(BACKGROUND_PER_CUSTOMER * n)
    source = np.searchsorted(activity, rng.random(count) * activity[-1], side="right")
    target = np.searchsorted(activity, rng.random(count) * activity[-1], side="right")
    local = rng.random(count) < LOCAL_SHARE
    latest = WINDOW_SECONDS - REPEAT_SPREAD_SECONDS  # a relationship starts early enough for its repeats
    background = (source, target, rng.lognormal(3.8, 1.1, count), rng.integers(0, latest, count))

    # rings: the bank's fraudsters in groups of 3-8; each member pays RING_OUT_DEGREE others of its ring
    members = rng.permutation(np.flatnonzero(fraud))
    sizes = rng.integers(*RING_SIZES, size=len(members) // RING_SIZES[0] + 1)
    ends = np.cumsum(sizes)
    position = np.arange(len(members))
    ring = np.searchsorted(ends, position, side="right")
    start = ends[ring] - sizes[ring]
    size = np.minimum(ends[ring], len(members)) - start
    sender = np.repeat(np.flatnonzero(size >= 2), RING_OUT_DEGREE)
    offset = rng.integers(1, np.maximum(size[sender], 2))
    receiver = start[sender] + (position[sender] - start[sender] + offset) % size[sender]
    burst = rng.integers(0, latest - RING_BURST_SECONDS, size=len(sizes))[ring[sender]]
    rings = (
        members[sender],
        members[receiver],
        rng.lognormal(6.0, 0.9, len(sender)),
        burst + rng.integers(0, RING_BURST_SECONDS, len(sender)),
    )

    # victims: legitimate customers paying fraudsters (scams, mule deposits)
    victims_per = rng.poisson(VICTIMS_PER_FRAUDSTER, len(members))
    payee = np.repeat(members, victims_per)
    legit = np.flatnonzero(~fraud)
    payer = legit[rng.integers(0, len(legit), len(payee))] if len(legit) else payee
    victims = (payer, payee, rng.lognormal(5.5, 1.0, len(payee)), rng.integers(0, latest, len(payee)))

    def transfers(parts: list[tuple[np.ndarray, ...]]) -> _Transfers:
        source, target, amount, time = (np.concatenate(columns) for columns in zip(*parts, strict=True))
        keep = source != target
        repeats = rng.geometric(REPEAT_P, int(keep.sum()))
        # each transfer of a relationship has its own amount and time, near the relationship's
        amount = np.repeat(amount[keep], repeats) * rng.lognormal(0.0, 0.3, int(repeats.sum()))
        time = np.repeat(time[keep], repeats) + rng.integers(0, REPEAT_SPREAD_SECONDS, int(repeats.sum()))
        return _Transfers(
            rows[np.repeat(source[keep], repeats)],
            rows[np.repeat(target[keep], repeats)],
            np.maximum(0.01, np.round(amount, 2)),
            WINDOW_START + time,
        )

    population_level = [tuple(c[~local] for c in background), rings, victims]
    bank_local = [tuple(c[local] for c in background)]
    return transfers(population_level), transfers(bank_local)


def _transactions_table(
    schema: FeatureSchema, transfers: _Transfers, local_row: np.ndarray, ids: pa.StringArray
) -> pa.Table:
    """The bank's transactions table (by the bank's own ids), ordered by time as a ledger is."""
    order = np.argsort(transfers.time, kind="stable")
    t = schema.transactions
    return pa.table(
        {
            t.source_column: ids.take(pa.array(local_row[transfers.source[order]])),
            t.target_column: ids.take(pa.array(local_row[transfers.target[order]])),
            t.amount_column: pa.array(transfers.amount[order]),
            t.time_column: pa.array(transfers.time[order]).cast(TIMESTAMP_TYPE),
        }
    )


# ------------------------------------------------------------------------------------------- writing


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


# ------------------------------------------------------------------------------------------- the entry


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
