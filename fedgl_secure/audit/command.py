"""``fedgl-secure audit RUN_DIR``: the privacy audit of a finished run (registered by ``fedgl_secure.cli``).

Exit codes: 0 — no check is red (amber checks are printed to stderr as warnings; ``--strict`` makes
them fail too); 1 — at least one check is red (each is named on stderr); 2 — RUN_DIR is not a run
directory or lacks a file the audit needs (the message names it), or a bad flag or policy — a
``--reference`` run with DP or of another experiment included (the mismatched fields are named).
"""

from __future__ import annotations

import sys
import warnings
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from fedgl_secure.errors import FedGLError


class ReportFormat(str, Enum):
    md = "md"
    html = "html"
    json = "json"


def audit(
    run_dir: Annotated[Path, typer.Argument(help="the run directory (run.json, policy.toml, model.npz, ...)")],
    policy: Annotated[
        Path | None, typer.Option(help="audit against this policy instead of the run's own policy.toml")
    ] = None,
    format: Annotated[ReportFormat, typer.Option("--format", help="md, html or json")] = ReportFormat.md,
    output: Annotated[
        Path | None, typer.Option(help="write the report here (md: plots as SVG files beside it); default stdout")
    ] = None,
    data_root: Annotated[
        Path | None, typer.Option(help="datasets for the attacks (default: $FEDGL_DATA); missing data: amber")
    ] = None,
    attacks: Annotated[bool, typer.Option(help="run the membership and link inference attacks")] = True,
    strict: Annotated[bool, typer.Option(help="fail (exit 1) on amber checks too")] = False,
    seed: Annotated[int, typer.Option(min=0, help="seed of the attacks' sampling")] = 0,
    reference: Annotated[
        Path | None,
        typer.Option(
            "--reference",
            help="DP runs: a run directory of the same experiment without DP, whose membership AUC is reported "
            "beside the run's (default: retrain one in-process from run.json)",
        ),
    ] = None,
    no_reference: Annotated[
        bool, typer.Option("--no-reference", help="DP runs: skip the without-DP reference (no retraining)")
    ] = False,
    bank_config: Annotated[
        Path | None,
        typer.Option(
            "--bank-config",
            help="run the attacks on this bank's own customers (its node file: its tables and union index), e.g. "
            "for a consortium on banks' own data, whose merged graph nobody holds",
        ),
    ] = None,
) -> None:
    """Check a finished run against its privacy policy and write a report a risk officer can read.

    Exit 0: nothing red (amber warnings on stderr). Exit 1: red checks, named on stderr.
    Exit 2: RUN_DIR is missing a file (named) or a flag is invalid (a --reference that has DP or is
    another experiment included).
    """
    from fedgl_secure.audit.report import render_html, render_json, render_markdown, summary_text, write_plots
    from fedgl_secure.audit.run import audit_run

    try:
        with warnings.catch_warnings():
            # Opacus warns when its best Rényi order is at the end of its range: the ε it returns is then a valid
            # but loose upper bound (`policy check` says so); on an audit terminal the warning is only clutter.
            warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
            report = audit_run(
                run_dir,
                policy,
                data_root=data_root,
                attacks=attacks,
                seed=seed,
                reference_dir=reference,
                reference=not no_reference,
                progress=sys.stderr.isatty(),
                bank_config=bank_config,
            )
    except FedGLError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    if format is ReportFormat.json:
        text = render_json(report)
    elif format is ReportFormat.html:
        text = render_html(report)
    else:
        plots = None
        if output is not None:
            plots = write_plots(report, output.parent, output.stem)
        text = render_markdown(report, plots, output.parent if output is not None else None)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)
    typer.echo(f"audit: {summary_text(report)}", err=True)
    code = report.exit_code(strict)
    if code:
        failing = ("red", "amber") if strict else ("red",)
        names = ", ".join(f"{key}/{check.name}" for key, check in report.checks() if check.status in failing)
        typer.echo(f"audit FAILED: {names}", err=True)
        raise typer.Exit(code=code)
