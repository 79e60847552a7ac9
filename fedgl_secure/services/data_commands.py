"""CLI commands for a bank's own data: ``fedgl-secure data synth ...`` (registered by ``fedgl_secure.cli``)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from fedgl_secure.errors import FedGLError
from fedgl_secure.services.commands import fail

data_app = typer.Typer(help="A bank's own data: generate, check.", no_args_is_help=True, rich_markup_mode=None)


class SynthFormat(str, Enum):
    parquet = "parquet"
    csv = "csv"
    sqlite = "sqlite"


@data_app.command("synth")
def synth(
    banks: Annotated[int, typer.Option(help="number of banks (bank-a, bank-b, ...)")],
    customers: Annotated[int, typer.Option(help="customers per bank")],
    out: Annotated[Path, typer.Option(help="directory to write: new, empty, or holding this same output")],
    format: Annotated[SynthFormat, typer.Option("--format", help="parquet, csv or sqlite")] = SynthFormat.parquet,
    seed: Annotated[int, typer.Option(help="the same seed writes the same rows")] = 0,
    shared_fraction: Annotated[float, typer.Option(help="share of a bank's customers who bank elsewhere too")] = 0.3,
    fraud_rate: Annotated[float, typer.Option(help="share of persons who are fraudsters")] = 0.03,
    labelled_fraction: Annotated[float, typer.Option(help="share of persons whose label is known")] = 0.6,
) -> None:
    """Write a seeded, bank-like consortium: each bank's customers and transactions, schema.toml, manifest.json.

    Prints a JSON summary (``already_there`` when OUT already holds this very output). Exit 2 with
    one line naming the parameter on a bad flag, or when OUT holds anything else.
    """
    from fedgl_secure.data.bank_synth import synthesize_banks  # pyarrow and the generator: data synth only

    try:
        summary = synthesize_banks(
            out,
            banks=banks,
            customers=customers,
            seed=seed,
            fmt=format.value,
            shared_fraction=shared_fraction,
            fraud_rate=fraud_rate,
            labelled_fraction=labelled_fraction,
        )
    except FedGLError as error:
        fail(error)
    typer.echo(json.dumps(summary.to_dict()))


class CheckFormat(str, Enum):
    text = "text"
    json = "json"


@data_app.command("check")
def check(
    config: Annotated[Path, typer.Option(help="the bank's node file, e.g. services/bank-a.toml")],
    format: Annotated[CheckFormat, typer.Option("--format", help="text or json")] = CheckFormat.text,
) -> None:
    """Check a bank's own tables against the consortium's schema and print what the bank would contribute.

    Reads the tables of the node file's [bank.data] exactly as the bank node will; contacts nobody and
    writes nothing. Exit 0 when valid; exit 2 with one line naming the file, row and column otherwise.
    """
    from fedgl_secure.services.data_check import check_bank_data, render_text  # the table readers (SQLAlchemy)

    try:
        summary = check_bank_data(config).summary
    except FedGLError as error:
        fail(error)
    assert summary is not None  # a bank-sources bank always has one
    typer.echo(json.dumps(summary.to_dict()) if format is CheckFormat.json else render_text(summary))
