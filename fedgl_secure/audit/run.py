"""The whole audit: :func:`audit_run` reads a run directory and returns the report of every section."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgl_secure.audit.attack_section import attack_section
from fedgl_secure.audit.conformance import check_policy, check_privacy
from fedgl_secure.audit.ledger import check_audit_chain, check_decryptions, check_receipts, leakage_section
from fedgl_secure.audit.report_model import AMBER, AuditReport, Section
from fedgl_secure.audit.run_files import RunFiles, read_run_dir
from fedgl_secure.errors import ConfigError

if TYPE_CHECKING:
    from fedgl_secure.audit.reference import ReferencePlan

# --- the whole audit -----------------------------------------------------------------------------


def audit_run(
    run_dir: str | Path,
    policy_path: str | Path | None = None,
    *,
    data_root: str | Path | None = None,
    attacks: bool = True,
    seed: int = 0,
    reference_dir: str | Path | None = None,
    reference: bool = True,
    progress: bool = False,
    bank_config: str | Path | None = None,
) -> AuditReport:
    """Audit a run directory against its policy (or ``policy_path``).

    Raises :class:`~fedgl_secure.wire.run_record.RunDirectoryError` for a bad RUN_DIR.

    For a DP run the membership attack also runs on a non-DP reference of the same experiment:
    ``reference_dir`` (checked to be one, else :class:`~fedgl_secure.audit.reference.ReferenceRunError`),
    else retrained in-process (``progress``: a bar over its rounds); ``reference=False`` skips it.
    ``bank_config`` (a bank's node file) runs the attacks on that bank's own customers and their pairs.
    """
    if reference_dir is not None and not reference:
        raise ConfigError("--reference and --no-reference contradict each other: give one of them")
    files = read_run_dir(run_dir, policy_path)
    plan = _reference_plan(files, reference_dir, reference, progress)
    sections = [check_policy(files)]
    # a privacy ledger is expected of every bank that took part; a roster bank that only holds a key share has none
    senders: set[str] = set(files.banks) | {receipt.sender for receipt in files.directory.receipts}
    later: list[Section] = []
    if files.directory.secure:
        audit_log, audit = check_audit_chain(files)
        receipts, valid = check_receipts(files)
        decryptions, rows = check_decryptions(files, audit, valid)
        senders |= {s for d in rows for s in d.senders}
        later = [decryptions, audit_log, receipts]
    sections.append(check_privacy(files, senders))
    sections.extend(later)
    sections.append(leakage_section(files))
    if attacks:
        sections.append(attack_section(files, data_root, seed, plan, bank_config))
    else:
        skipped = Section("attacks", "Empirical attacks")
        skipped.add("not-run", AMBER, "attacks skipped (--no-attacks)")
        sections.append(skipped)
    keys = ("dataset", "method", "seed", "rounds_run", "best_round", "global_test_accuracy")
    run = {key: files.run.get(key) for key in keys} | recorded_ranking_metrics(files.run)
    return AuditReport(str(files.directory.path), files.policy_source, run, sections)


NOT_RECORDED = "not recorded"


def recorded_ranking_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The run's global test ROC-AUC, PR-AUC and recall at the top (and its top fraction), beside its accuracy.

    From run.json's ``global_test_metrics``; ``"not recorded"`` where it has none (a record written before
    runs kept them): the audit never fails for their absence.
    """
    metrics = result.get("global_test_metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    names = ("roc_auc", "pr_auc", "recall_at_top", "top_fraction")
    return {f"global_test_{name}": metrics.get(name, NOT_RECORDED) for name in names}


def _reference_plan(files: RunFiles, reference_dir: str | Path | None, retrain: bool, progress: bool) -> ReferencePlan:
    """Where the without-DP model comes from; a ``reference_dir`` is read and checked now, before any work,
    so that a wrong one fails the command (exit 2) instead of becoming a line in the report."""
    from fedgl_secure.audit.reference import ReferencePlan, load_reference

    if reference_dir is not None:
        return ReferencePlan(model=load_reference(reference_dir, files.run))
    return ReferencePlan(retrain=retrain, progress=progress)
