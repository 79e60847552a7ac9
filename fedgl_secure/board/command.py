"""``fedgl-secure board RUN_DIR``: serve the board of a finished or live run on 127.0.0.1 (registered by the CLI).

Exit codes: 0 — stopped with Ctrl-C; 2 — a bad option (named): RUN_DIR is a file, or does not exist while no live
source is given; ``--audit`` names no file; ``--aggregator`` without ``--node-config``; a bad node file.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedgl_secure.errors import ConfigError, FedGLError

if TYPE_CHECKING:
    from fedgl_secure.board.view import BoardSources

DEFAULT_PORT = 8750
LOOPBACK = "127.0.0.1"
CONSORTIUM_LOGS = Path("..") / "state" / "logs"  # `consortium up`'s logs beside runs/<federation>/run


def default_logs(run_dir: Path) -> Path | None:
    """``consortium up``'s logs when RUN_DIR sits where the README puts it (``runs/<federation>/run``, logs in
    ``runs/<federation>/state/logs``); None elsewhere."""
    candidate = (run_dir / CONSORTIUM_LOGS).resolve()
    return candidate if candidate.is_dir() else None


def board_sources(
    run_dir: Path,
    *,
    logs: Path | None = None,
    audit_report: Path | None = None,
    node_config: Path | None = None,
    aggregator: str | None = None,
) -> BoardSources:
    """The board's sources from the command's options, checked; raises :class:`ConfigError` naming the option."""
    from fedgl_secure.board.sources import LiveAggregator
    from fedgl_secure.board.view import BoardSources

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"RUN_DIR {run_dir}: not a directory")
    if aggregator is not None and node_config is None:
        raise ConfigError("--aggregator needs --node-config: the node whose TLS certificate the board presents")
    if audit_report is not None and not audit_report.is_file():
        raise ConfigError(f"--audit {audit_report}: no such file")
    live = None
    if node_config is not None:
        from fedgl_secure.consortium.config import load_node_config

        load_node_config(node_config)  # a bad node file fails now, not on every page
        live = LiveAggregator(node_config, aggregator)
    logs = logs if logs is not None else default_logs(run_dir)
    if not run_dir.is_dir() and logs is None and live is None:
        raise ConfigError(
            f"RUN_DIR {run_dir} does not exist (yet) and no live source is given: --logs DIR (the nodes' logs) or "
            "--node-config NODE.toml (the aggregator's status)"
        )
    return BoardSources(run_dir, logs, audit_report, live)


def board(
    run_dir: Annotated[Path, typer.Argument(help="the run directory (`consortium up --run-dir` writes it at the end)")],
    host: Annotated[str, typer.Option(help="address to listen on; the board has no login: keep it local")] = LOOPBACK,
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = DEFAULT_PORT,
    logs: Annotated[
        Path | None,
        typer.Option(help="the nodes' JSON logs, for time by phase (default: RUN_DIR/../state/logs if it exists)"),
    ] = None,
    audit_report: Annotated[
        Path | None,
        typer.Option("--audit", help="the audit's JSON report (default: RUN_DIR/audit.json if it exists)"),
    ] = None,
    node_config: Annotated[
        Path | None,
        typer.Option(help="follow the live aggregator of this node's consortium, presenting this node's certificate"),
    ] = None,
    aggregator: Annotated[
        str | None, typer.Option(help="the aggregator's URL (default: the one of --node-config's consortium)")
    ] = None,
    refresh: Annotated[int, typer.Option(min=1, help="seconds between reloads while the run is live")] = 5,
) -> None:
    """A read-only web page over a run: progress, validation accuracy per round, participation, time by phase,
    ε per bank and channel, the decryption ledger in summary, and the audit's verdict."""
    import uvicorn

    from fedgl_secure.board.app import create_app

    try:
        sources = board_sources(
            run_dir, logs=logs, audit_report=audit_report, node_config=node_config, aggregator=aggregator
        )
    except FedGLError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    if not _is_loopback(host):
        typer.echo(f"warning: the board has no login; on {host} anyone who can reach port {port} sees it", err=True)
    typer.echo(f"board of {run_dir}: http://{host}:{port}/ (Ctrl-C to stop)", err=True)
    uvicorn.run(create_app(sources, refresh), host=host, port=port, log_level="warning")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
