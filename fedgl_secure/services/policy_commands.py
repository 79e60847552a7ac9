"""CLI commands for privacy policies: ``fedgl-secure policy check FILE`` (registered by ``fedgl_secure.cli``)."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedgl_secure.errors import FedGLError

if TYPE_CHECKING:
    from fedgl_secure.policy.schema import Policy
    from fedgl_secure.privacy.guarantees import Guarantees

policy_app = typer.Typer(help="Validate privacy policies.", no_args_is_help=True, rich_markup_mode=None)

_STATUS = {
    "no-protection": "NO PROTECTION — uploads leave banks in clear (research only; the audit marks it red)",
    "he-only": "HE only, no DP — uploads encrypted, decrypted sums exact (ε unbounded)",
    "dp": "HE + differential privacy",
}


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def wire_layout(policy: Policy) -> list[dict]:
    """Per allowed kind: how it is packed, its wire bytes per value (a full ciphertext chunk under these
    parameters, measured by encrypting one) and the worst-case error of a decoded sum over ``max_banks``
    banks (packed: ``K·δ/2``; unpacked: the CKKS noise bound at the global scale)."""
    from fedgl_secure.crypto import ckks, packing  # TenSEAL: only to size the contexts

    he = policy.he
    public = ckks.load_public_context(ckks.public_context_bytes(ckks.create_secret_context(he)))
    bytes_per_slot = ckks.bytes_per_value(public)
    rows = []
    for kind in policy.allowed_kinds:
        layout = policy.upload_layout(kind)
        row = {
            "kind": kind,
            "packed": layout is not None,
            "bytes_per_value": packing.bytes_per_value(layout, bytes_per_slot),
        }
        if layout is None:
            row |= {"worst_case_error": he.unpacked_error(), "values_per_slot": 1}
        else:
            row |= {
                "lower": layout.lower,
                "upper": layout.upper,
                "step": layout.step,
                "digit_bits": layout.digit_bits,
                "values_per_slot": layout.values_per_slot,
                "worst_case_error": layout.error_bound,
            }
        rows.append(row)
    return rows


def flooding_summary(policy: Policy) -> dict:
    """The noise flooding every decryption reply carries, and what it holds for (``policy check``)."""
    he = policy.he
    sigma = he.flooding_std()
    return {
        "statistical_security_bits": he.statistical_security,
        "max_decryptions": he.max_decryptions,
        "flooding_std": sigma,
        "flooding_std_log2": math.log2(sigma),
        "source": "Li, Micciancio, Schultz, Sorrell (CRYPTO 2022); OpenFHE NOISE_FLOODING_DECRYPT",
    }


def _render_flooding(flooding: dict) -> str:
    return (
        f"decryption: every reply carries noise flooding σ = 2^{flooding['flooding_std_log2']:.1f} per coefficient, "
        f"{flooding['statistical_security_bits']}-bit statistical security for up to {flooding['max_decryptions']:,} "
        "decrypted ciphertexts over the key's lifetime (every decryptor refuses past them)"
    )


def _render_wire(policy: Policy, rows: list[dict]) -> list[str]:
    he = policy.he
    lines = [f"packing: {he.packing}; sums over at most {he.max_banks} banks decode (more are refused)"]
    header = (
        f"{'kind':<12} {'range':<16} {'step':>8} {'bits':>5} {'per slot':>8} {'bytes/value':>11} {'worst error':>11}"
    )
    lines += [header, "-" * len(header)]
    for row in rows:
        packed = row["packed"]
        span = f"[{row['lower']:g}, {row['upper']:g}]" if packed else "float"
        step = f"2^{round(math.log2(row['step']))}" if packed else "-"
        bits = str(row["digit_bits"]) if packed else "-"
        lines.append(
            f"{row['kind']:<12} {span:<16} {step:>8} {bits:>5} {row['values_per_slot']:>8} "
            f"{row['bytes_per_value']:>11.2f} {row['worst_case_error']:>11.3g}"
        )
    lines.append(f"(worst error: |decoded sum - exact sum| per value over {he.max_banks} banks)")
    return lines


def render_text(path: Path, policy: Policy, guarantees: Guarantees, wire: list[dict] | None = None) -> str:
    """The guarantees as plain text for a risk officer: status, HE, channels, budget, assumptions."""
    lines = [f"policy: {path}"]
    if policy.description:
        lines.append(f"description: {policy.description}")
    lines.append(f"status: {_STATUS[guarantees.status]}")
    lines.append(f"unit of privacy: {guarantees.unit}")
    if guarantees.status == "dp":
        lines.append(f"epsilon: {guarantees.epsilon:.4g}, delta: {guarantees.delta:g} (per bank, whole run)")
    lines.append(f"protected: {guarantees.protects}")
    lines.append(f"not protected: {guarantees.does_not_protect}")
    if policy.protection == "he":
        he = policy.he
        lines.append(
            f"encryption: CKKS N={he.poly_modulus_degree}, moduli {list(he.coeff_mod_bit_sizes)} "
            f"({sum(he.coeff_mod_bit_sizes)} bits, 128-bit security), scale 2^{he.global_scale_bits}; "
            f"threshold decryption: the key authority and t = {he.threshold} banks decrypt together (no party holds "
            f"the key), only sums of at least {policy.quorum} banks, each checked by every decryptor"
        )
        lines.append(_render_flooding(flooding_summary(policy)))
        if wire is not None:
            lines += _render_wire(policy, wire)
    lines.append(f"allowed kinds: {', '.join(policy.allowed_kinds)}")
    if guarantees.status == "dp":
        lines.append(f"released without DP: {', '.join(guarantees.released_without_dp) or 'none'}")
        lines.append("")
        header = (
            f"{'channel':<12} {'noise':<12} {'clip':>6} {'sensitivity':>11} {'z':>7} {'sigma':>9} "
            f"{'z accounted':>11} {'steps/rnd':>9} {'eps/round':>9} {'eps total':>9}"
        )
        lines += [header, "-" * len(header)]
        for c in guarantees.channels:
            lines.append(
                f"{c.channel:<12} {c.noise:<12} {_number(c.clip):>6} {_number(c.sensitivity):>11} "
                f"{_number(c.noise_multiplier):>7} {_number(c.noise_std):>9} "
                f"{_number(c.accounted_noise_multiplier):>11} {c.steps_per_round or 'once':>9} "
                f"{_number(c.epsilon_per_round):>9} {_number(c.epsilon_total):>9}"
            )
        lines.append("(eps per channel are each channel alone; composed together they are sub-additive)")
        lines.append("")
        verdict = (
            "within budget"
            if guarantees.budget_met
            else f"OVER BUDGET: a bank stops contributing after round {guarantees.rounds_within_budget}"
        )
        lines.append(
            f"total per bank: epsilon = {guarantees.epsilon:.4f} at delta = {guarantees.delta:g} over "
            f"{guarantees.rounds} rounds ({guarantees.accountant.upper()}); budget epsilon = "
            f"{guarantees.budget_epsilon:g}: {verdict}"
        )
        lines.append(f"when the budget is spent: {guarantees.on_exhausted} (fail closed)")
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in guarantees.assumptions]
    if guarantees.notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in guarantees.notes]
    return "\n".join(lines)


@policy_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="the policy file, e.g. policies/strict-dp.toml")],
    format: Annotated[OutputFormat, typer.Option("--format", help="text or json")] = OutputFormat.text,
) -> None:
    """Validate a policy and print its effective guarantees per bank.

    Exit 0: valid. Exit 1: valid, but the budget does not cover the policy's rounds (banks would stop
    contributing early). Exit 2: invalid; the message names the file and the field.
    """
    # the policy's schema and its guarantees (scipy): loaded by policy check, not by every command
    from fedgl_secure.policy.schema import load_policy
    from fedgl_secure.privacy.guarantees import effective_guarantees

    try:
        policy = load_policy(file)
        guarantees = effective_guarantees(policy)
        wire = wire_layout(policy) if policy.protection == "he" else None
    except FedGLError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    if format is OutputFormat.json:
        document = {
            "policy": str(file),
            "description": policy.description,
            "he": policy.he.model_dump(mode="json") if policy.protection == "he" else None,
            "wire": wire,
            "flooding": flooding_summary(policy) if policy.protection == "he" else None,
            **guarantees.to_dict(),
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        typer.echo(render_text(file, policy, guarantees, wire))
    if guarantees.budget_met is False:
        raise typer.Exit(code=1)
