"""CLI commands of the services: ``node start`` and ``consortium up`` (registered by ``fedgl_secure.cli``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fedgl_secure.errors import FedGLError

node_app = typer.Typer(help="Run one node of a consortium.", no_args_is_help=True, rich_markup_mode=None)
consortium_app = typer.Typer(help="Run a whole consortium locally.", no_args_is_help=True, rich_markup_mode=None)


def fail(error: Exception) -> NoReturn:
    """Report a package error as one ``error: ...`` line on stderr and exit with code 2."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=2)


@node_app.command("start")
def node_start(
    config: Annotated[Path, typer.Option(help="the node's TOML file, e.g. services/bank-a.toml")],
) -> None:
    """Start the key authority, the aggregator or a bank, as the config's role says (blocks until stopped)."""
    from fedgl_secure.services.node import start_node  # the services (FastAPI, uvicorn): not for every command

    try:
        start_node(config)
    except FedGLError as error:
        fail(error)


@consortium_app.command("up")
def consortium_up_command(
    consortium: Annotated[Path, typer.Argument(help="services/consortium.toml (node configs sit next to it)")],
    progress: Annotated[bool, typer.Option(help="show a progress bar over rounds")] = True,
    timeout: Annotated[float | None, typer.Option(help="give up after this many seconds")] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="write the finished run's directory here, for `fedgl-secure audit`")
    ] = None,
) -> None:
    """Start every node as its own process, show round progress, stop them all at the end or on Ctrl-C."""
    from fedgl_secure.services.orchestrate import consortium_up  # the node processes' wiring: this command only

    try:
        summary = consortium_up(consortium, progress=progress, echo=typer.echo, timeout=timeout, run_dir=run_dir)
    except FedGLError as error:
        fail(error)
    typer.echo(json.dumps(summary))
    if summary.get("interrupted"):
        raise typer.Exit(code=130)


def predict_command(
    config: Annotated[Path, typer.Option(help="the bank's node file, e.g. services/bank-a.toml")],
    output: Annotated[
        Path | None, typer.Option(help="write the scores to this .parquet or .csv file (default: [bank.predict])")
    ] = None,
    table: Annotated[
        str | None, typer.Option(help="write the scores into this table of the bank's [bank.data] database")
    ] = None,
    refresh: Annotated[
        bool, typer.Option(help="fetch the final model from the aggregator even when one is saved")
    ] = False,
) -> None:
    """Score every customer of a bank with the federation's final global model (on the bank's own graph)."""
    from fedgl_secure.services.predict import predict  # torch and TenSEAL: only when scoring

    try:
        summary = predict(config, output=output, table=table, refresh=refresh)
    except FedGLError as error:
        fail(error)
    typer.echo(json.dumps(summary))
