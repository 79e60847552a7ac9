"""What a synthetic-consortium run is asked and what it reports: parameters, their validation, bank names, summaries.

The bottom of :mod:`fedgl_secure.data.bank_synth`: the population, the tables, the writers and the
entry point all read these types and limits, and this module reads none of them. The
manifest document is :meth:`SynthSummary.manifest` (written by the entry point, read back by
:mod:`.writers` when an ``out_dir`` is resumed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from fedgl_secure.errors import ConfigError

Format = Literal["parquet", "csv", "sqlite"]
FORMATS: tuple[str, ...] = get_args(Format)

GENERATOR = "fedgl-secure bank_synth"
GENERATOR_VERSION = 1
SCHEMA_FILE = "schema.toml"
MAX_BANKS = 702  # bank-a ... bank-zz
MIN_CUSTOMERS = 10
MAX_PERSONS = 100_000_000  # banks × customers: int32 indices and string offsets stay far from overflow


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

    def files_declarations(self) -> dict[str, dict[str, str]]:
        """Each bank's ``[bank.data]`` for its generated tables (``kind = "files"``), by bank name."""
        if self.parameters.format == "sqlite":
            raise ConfigError("files_declarations: these banks' tables are SQLite databases, not Parquet or CSV files")
        suffix = self.parameters.format
        return {
            bank.name: {
                "kind": "files",
                "customers": str(self.out_dir / bank.name / f"customers.{suffix}"),
                "transactions": str(self.out_dir / bank.name / f"transactions.{suffix}"),
            }
            for bank in self.banks
        }

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
