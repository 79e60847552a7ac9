"""``fedgl-secure audit``: a run directory built from the real pieces (key authority, receipts, ledgers).

One module-scoped run directory is made with a real :class:`KeyAuthority` (small CKKS parameters),
real signed uploads and real decryptions, real privacy ledgers, and a model whose attacks score
exactly 0.5 (all-zero weights: every node gets the same scores). Each test copies it and breaks one
thing the audit must catch.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from fedgl_secure.audit.report_model import Check
from fedgl_secure.audit.run import audit_run
from fedgl_secure.cli import app
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.key_authority import AGGREGATOR, AUDIT_HEAD, KeyAuthority
from fedgl_secure.crypto.packing import slot_length
from fedgl_secure.crypto.receipts import Receipt, public_key_bytes, sign_receipt
from fedgl_secure.crypto.secure_summation import local_key_ceremony
from fedgl_secure.crypto.upload import RoundTicket, make_upload, upload_c1
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.release_schedule import round_releases

REPO = Path(__file__).resolve().parents[1]
BANKS = ("bank-a", "bank-b", "bank-c")  # the quorum (3): the key authority opens no round with fewer
FEDERATION = "fed-audit"
KINDS = ("weights", "predictions")
LENGTH = 20
ROUNDS = 2
SMALL_HE = """[he]
poly_modulus_degree = 4096
coeff_mod_bit_sizes = [36, 36, 37]
global_scale_bits = 60
"""


def _policy_text(name: str) -> str:
    """A shipped policy with the small test CKKS parameters in place of its [he] table."""
    text = (REPO / "policies" / name).read_text(encoding="utf-8")
    return re.sub(r"\[he\]\n(?:[^\[\n].*\n)*", SMALL_HE, text, count=1)


def _run_record(rounds: int, *, secure: bool = True, banks=BANKS) -> dict:
    """run.json as fedgl_secure.wire.run_record writes it, around a synthetic-data RunResult."""
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.wire.run_record import RUN_FORMAT

    config = build_config({"dataset": "synthetic", "seed": 0, "device": "cpu"}).model_dump(mode="json")
    result = {
        "dataset": "synthetic",
        "method": "fedgl",
        "seed": 0,
        "rounds_run": rounds,
        "best_round": rounds,
        "global_test_accuracy": 0.5,
        "history": [],
        "config": config,
    }
    return {
        "format": RUN_FORMAT,
        "secure": secure,
        "policy": "policy.toml",
        "banks": list(banks),
        "stopped_banks": {},
        "result": result,
    }


def _zero_model(path: Path) -> None:
    """W̄ = 0 (hidden 16, 100 features, 4 classes) and an all-zero pseudo graph: attack AUCs are exactly 0.5."""
    nodes = _merged_synthetic().num_nodes
    neighbors = np.stack([(np.arange(nodes) + 1) % nodes, (np.arange(nodes) + 2) % nodes], axis=1)
    np.savez(
        path,
        weights=np.zeros(16 * (100 + 1 + 4) + 4, dtype=np.float32),
        pseudo_labels=np.full(nodes, -1, dtype=np.int64),
        pseudo_graph_neighbors=neighbors.astype(np.int64),
        pseudo_graph_weights=np.zeros(neighbors.shape, dtype=np.float32),
    )


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A strict-DP secure run directory: 3 banks, 2 rounds, weights and predictions decrypted each round."""
    root = tmp_path_factory.mktemp("audit") / "run"
    root.mkdir()
    (root / "policy.toml").write_text(_policy_text("strict-dp.toml"), encoding="utf-8")
    policy = load_policy(root / "policy.toml")
    (root / "run.json").write_text(json.dumps(_run_record(ROUNDS)), encoding="utf-8")
    _zero_model(root / "model.npz")

    keys = {bank: Ed25519PrivateKey.generate() for bank in BANKS}
    roster = Roster(FEDERATION, tuple(BANKS), policy.he.threshold, policy.digest)
    authority = KeyAuthority(root / "key-authority", policy, "correct horse battery staple", roster)
    receipts, decryptors = [], {}
    try:
        for bank, key in keys.items():
            authority.register_bank(bank, key.public_key())
        decryptors = local_key_ceremony(authority, keys, root.parent / "bank-state")
        public = ckks.load_public_context(authority.public_context)
        for round_number in range(1, ROUNDS + 1):
            nonce = secrets.token_hex(16)
            ticket = RoundTicket(FEDERATION, round_number, nonce, tuple(BANKS), authority.fingerprint, policy.digest)
            authority.open_round(FEDERATION, round_number, nonce, BANKS, policy.digest)
            for kind in KINDS:
                uploads = [
                    make_upload(  # packed or not as the policy says for the kind (banks do the same)
                        public,
                        policy.he,
                        ticket,
                        bank,
                        keys[bank],
                        kind,
                        np.full(LENGTH, 0.5),
                        policy.upload_layout(kind),
                    )
                    for bank in BANKS
                ]
                receipts += [u.receipt for u in uploads]
                slots = slot_length(policy.upload_layout(kind), LENGTH)
                authority.decrypt_sum(
                    AGGREGATOR,
                    FEDERATION,
                    round_number,
                    kind,
                    [u.receipt for u in uploads],
                    authority.fingerprint,
                    slots,
                    [upload_c1(public, u.chunks) for u in uploads],
                )
        head = authority.ledger.get_meta(AUDIT_HEAD)
    finally:
        for decryptor in decryptors.values():
            decryptor.close()
        authority.close()
    (root / "key-authority" / "audit_head").write_text(head + "\n", encoding="utf-8")
    (root / "receipts.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in receipts), encoding="utf-8")
    (root / "banks.json").write_text(
        json.dumps({bank: public_key_bytes(key.public_key()).hex() for bank, key in keys.items()}), encoding="utf-8"
    )
    (root / "privacy").mkdir()
    for bank in BANKS:
        ledger = PrivacyLedger(bank)
        for round_number in range(1, ROUNDS + 1):
            for release in round_releases(policy, round_number):
                ledger.record(round_number, release.channel, release.noise_multiplier, release.sample_rate)
        ledger.save(root / "privacy" / f"{bank}.ledger.json")
    return root


def _copy(run_dir: Path, target: Path) -> Path:
    """A test's own copy of a module-scoped run directory, to break."""
    shutil.copytree(run_dir, target)
    return target


@pytest.fixture
def run_dir(base_run, tmp_path) -> Path:
    return _copy(base_run, tmp_path / "run")


def _audit(*args: str):
    return CliRunner().invoke(app, ["audit", *map(str, args)])


def _statuses(run_dir: Path, **kwargs) -> dict[str, str]:
    report = audit_run(run_dir, **kwargs)
    return {f"{key}/{check.name}": check.status for key, check in report.checks()}


def test_clean_strict_dp_run_is_all_green_in_every_format(run_dir, tmp_path):
    statuses = _statuses(run_dir, reference=False)
    assert statuses.pop("attacks/membership-reference") == "info"  # skipped: information, never a pass
    assert statuses.pop("decryptions/central-noise") == "info"  # not applicable: strict-dp's noise is distributed
    assert statuses.pop("privacy/stop") == "info"  # not stopped early
    assert statuses.pop("attacks/membership-floor") == "info"  # calibration of the attack, never a verdict
    assert set(statuses.values()) == {"green"}, {k: v for k, v in statuses.items() if v != "green"}
    for key in ("decryptions/once-per-round-kind", "audit-log/chain", "receipts/signatures", "attacks/membership"):
        assert key in statuses

    result = _audit(run_dir, "--format", "json", "--no-reference")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "green"
    assert [s["key"] for s in document["sections"]] == [
        "policy",
        "privacy",
        "decryptions",
        "audit-log",
        "receipts",
        "leakage",
        "attacks",
    ]
    decryptions = next(s for s in document["sections"] if s["key"] == "decryptions")
    assert len(decryptions["tables"][0]["rows"]) == ROUNDS * len(KINDS)
    attacks = next(s for s in document["sections"] if s["key"] == "attacks")
    assert attacks["tables"][0]["rows"][0][2] == pytest.approx(0.5)

    html_out = tmp_path / "report.html"
    result = _audit(run_dir, "--format", "html", "--output", html_out, "--no-attacks")
    assert result.exit_code == 0, result.output  # amber (attacks skipped) is a warning, not a failure
    assert "AMBER" in result.stderr and "attacks skipped" in result.stderr
    page = html_out.read_text(encoding="utf-8")
    for title in ("Policy conformance", "Privacy spent", "decryption ledger", "hash chain", "receipt", "Leakage"):
        assert title in page
    assert page.count("<svg") == len(BANKS)  # one ε plot per bank, inline

    md_out = tmp_path / "md" / "report.md"
    result = _audit(run_dir, "--output", md_out, "--no-attacks")
    assert result.exit_code == 0, result.output
    text = md_out.read_text(encoding="utf-8")
    assert "## 1. Policy conformance" in text and "## 6. Leakage ledger" in text
    svgs = sorted(md_out.parent.glob("*.svg"))
    assert len(svgs) == len(BANKS) and f"]({svgs[0].name})" in text
    assert _audit(run_dir, "--no-attacks", "--strict").exit_code == 1  # --strict fails on amber


def test_edited_audit_log_fails_naming_the_broken_line(run_dir):
    log = run_dir / "key-authority" / "audit.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines, start=1) if '"event":"decrypt"' in line)
    lines[number - 1] = lines[number - 1].replace('"values":20', '"values":21')
    log.write_text("".join(lines), encoding="utf-8")

    result = _audit(run_dir, "--no-attacks", "--format", "json")
    assert result.exit_code == 1
    assert f"audit.jsonl at line {number}" in result.stderr
    assert "content does not match its hash" in result.stderr
    assert "audit-log/chain" in result.stderr.splitlines()[-1]  # the failing check is named
    document = json.loads(result.stdout)
    chain = next(s for s in document["sections"] if s["key"] == "audit-log")
    assert chain["status"] == "red"


def test_truncated_audit_log_is_caught_by_the_recorded_head(run_dir):
    log = run_dir / "key-authority" / "audit.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text("".join(lines[:-1]), encoding="utf-8")
    statuses = _statuses(run_dir, attacks=False)
    assert statuses["audit-log/chain"] == "red"


def test_forged_receipt_is_red_and_named(run_dir):
    path = run_dir / "receipts.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    original = json.loads(lines[2])
    forged = sign_receipt(Ed25519PrivateKey.generate(), Receipt.model_validate(original).fields())  # another key
    lines[2] = forged.model_dump_json()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    report = audit_run(run_dir, attacks=False)
    check = next(c for key, c in report.checks() if key == "receipts" and c.name == "signatures")
    assert check.status == "red"
    assert "receipts.jsonl line 3" in check.detail and repr(original["sender"]) in check.detail
    result = _audit(run_dir, "--no-attacks")
    assert result.exit_code == 1 and "receipts.jsonl line 3: FORGED" in result.stderr


def test_substituted_bank_key_is_red(run_dir):
    banks = json.loads((run_dir / "banks.json").read_text(encoding="utf-8"))
    banks["bank-a"] = public_key_bytes(Ed25519PrivateKey.generate().public_key()).hex()
    (run_dir / "banks.json").write_text(json.dumps(banks), encoding="utf-8")
    statuses = _statuses(run_dir, attacks=False)
    assert statuses["receipts/keys-match-key-authority"] == "red"
    assert statuses["receipts/signatures"] == "red"


def test_ledger_over_budget_is_red_and_near_budget_amber(run_dir):
    policy = load_policy(run_dir / "policy.toml")
    ledger = PrivacyLedger.load(run_dir / "privacy" / "bank-a.ledger.json")
    ledger.record(ROUNDS + 1, "weights", noise_multiplier=0.5, sample_rate=1.0, steps=50)
    ledger.save(run_dir / "privacy" / "bank-a.ledger.json")
    assert ledger.epsilon(policy.budget.delta) > policy.budget.epsilon
    result = _audit(run_dir, "--no-attacks")
    assert result.exit_code == 1
    assert "privacy/budget:bank-a" in result.stderr and "BUDGET EXCEEDED" in result.stderr

    near = PrivacyLedger("bank-b")
    near.record_pure("edges", 0.95 * policy.budget.epsilon)
    near.save(run_dir / "privacy" / "bank-b.ledger.json")
    assert _statuses(run_dir, attacks=False)["privacy/budget:bank-b"] == "amber"


def test_missing_ledger_of_a_sender_is_red(run_dir):
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run["banks"] = ["bank-a", "bank-c"]  # bank-b dropped from the record, but it signed receipts and was decrypted
    (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
    (run_dir / "privacy" / "bank-b.ledger.json").unlink()
    assert _statuses(run_dir, attacks=False)["privacy/ledger:bank-b"] == "red"


def test_he_policy_on_a_run_that_was_not_secure_is_red(run_dir):
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run["secure"] = False
    (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
    assert _statuses(run_dir, attacks=False)["policy/protection"] == "red"


def test_research_plaintext_policy_is_red(tmp_path):
    run_dir = tmp_path / "plain"
    run_dir.mkdir()
    shutil.copy(REPO / "policies" / "research-plaintext.toml", run_dir / "policy.toml")
    record = _run_record(1, secure=False, banks=())
    record["result"].pop("config")
    (run_dir / "run.json").write_text(json.dumps(record), encoding="utf-8")
    np.savez(run_dir / "model.npz", weights=np.zeros(8, dtype=np.float32))
    result = _audit(run_dir, "--format", "json")
    assert result.exit_code == 1
    assert "policy/protection" in result.stderr
    document = json.loads(result.stdout)
    attacks = next(s for s in document["sections"] if s["key"] == "attacks")
    assert attacks["checks"][0]["status"] == "amber" and "not run" in attacks["checks"][0]["detail"]


def test_baseline_he_only_run_passes_with_warnings(run_dir):
    (run_dir / "policy.toml").write_text(_policy_text("baseline.toml"), encoding="utf-8")
    # the key pair was made for the same small [he]; the strict ledgers remain but there is no budget
    statuses = _statuses(run_dir, attacks=False)
    assert statuses["policy/guarantees"] == "amber" and statuses["privacy/budget"] == "amber"
    assert "red" not in statuses.values()
    assert _audit(run_dir, "--no-attacks").exit_code == 0


def test_missing_files_exit_2_naming_them(run_dir, tmp_path):
    (run_dir / "model.npz").unlink()
    result = _audit(run_dir)
    assert result.exit_code == 2 and "model.npz" in result.stderr and "missing" in result.stderr
    result = _audit(tmp_path / "nowhere")
    assert result.exit_code == 2 and "not a directory" in result.stderr


def test_missing_key_authority_evidence_exits_2(run_dir):
    (run_dir / "key-authority" / "audit.jsonl").unlink()
    result = _audit(run_dir, "--no-attacks")
    assert result.exit_code == 2 and "audit.jsonl" in result.stderr


def test_attacks_without_data_are_amber_not_run(run_dir, tmp_path, monkeypatch):
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run["result"]["config"]["dataset"] = "cora"
    (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
    monkeypatch.delenv("FEDGL_DATA", raising=False)
    report = audit_run(run_dir, data_root=tmp_path / "no-data")
    check = next(c for key, c in report.checks() if key == "attacks")
    assert check.status == "amber" and "not run" in check.detail


def test_svg_plot_is_valid_xml_with_budget_line_and_axes_covering_it():
    import xml.etree.ElementTree as ET

    from fedgl_secure.audit.plots import line_plot_figure, svg
    from fedgl_secure.audit.report_model import Plot

    plot = Plot(
        "ε <bank & co>", "round", "ε", {"total": [(1, 0.5), (2, 0.9), (3, 1.2)], "weights": [(1, 0.3)]}, 8.0, "budget"
    )
    text = svg(plot)
    root = ET.fromstring(text)  # the title's < and & are escaped: the inline SVG parses
    assert root.tag.endswith("svg") and "stroke-dasharray" in text and "budget 8" in text
    assert "ε &lt;bank &amp; co&gt;" in text  # text stays text, a browser can find it
    axes = line_plot_figure(plot).axes[0]
    low, high = axes.get_ylim()
    assert low <= 0.0 and high >= 8.0  # the budget line is in view, far above the points
    assert svg(plot) == text  # the same figure gives the same bytes


def test_the_json_report_reads_back_into_the_same_report(run_dir):
    from fedgl_secure.audit.report import render_json
    from fedgl_secure.audit.report_model import AuditReport

    document = json.loads(render_json(audit_run(run_dir, attacks=False)))
    again = AuditReport.from_dict(document)
    assert json.loads(render_json(again)) == document
    with pytest.raises(ValueError, match="unknown status 'purple'"):
        AuditReport.from_dict(
            {
                **document,
                "sections": [{**document["sections"][0], "checks": [{"name": "x", "status": "purple", "detail": ""}]}],
            }
        )


# --- the without-DP reference of membership inference ----------------------------------------------------

PARAMETERS = 16 * (100 + 1 + 4) + 4  # the synthetic dataset's GCN (hidden 16, 100 features, 4 classes)


def _reference_dir(root: Path, weights: np.ndarray, **config: object) -> Path:
    """A plaintext run directory without a policy (hence no DP), of the fixture's experiment unless ``config``."""
    root.mkdir()
    record = _run_record(ROUNDS, secure=False, banks=())
    record["policy"] = None
    record["result"]["config"].update(config)
    record["result"].update(config)
    (root / "run.json").write_text(json.dumps(record), encoding="utf-8")
    np.savez(root / "model.npz", weights=weights.astype(np.float32))
    return root


def _merged_synthetic():
    from fedgl_secure.data.registry import load_dataset
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.simulation.experiment import Federation, resolve_device

    config = build_config({"dataset": "synthetic", "seed": 0, "device": "cpu"})
    return Federation.build(load_dataset("synthetic", None, 0), config, resolve_device("cpu")).merged


def _membership_figures(document: dict) -> dict:
    attacks = next(s for s in document["sections"] if s["key"] == "attacks")
    return attacks["data"]["membership"]


def _check(report, name: str):
    return next(c for key, c in report.checks() if key == "attacks" and c.name == name)


def _no_retraining(monkeypatch) -> None:
    """Make any retraining fail the test: the paths under test must not train anything."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("the reference was retrained")

    monkeypatch.setattr("fedgl_secure.audit.reference.retrain_reference", refuse)


def test_reference_of_another_experiment_or_with_dp_exits_2_naming_the_problem(run_dir, tmp_path):
    weights = np.zeros(PARAMETERS)
    other = _reference_dir(tmp_path / "cora-ref", weights, dataset="cora")
    result = _audit(run_dir, "--reference", other)
    assert result.exit_code == 2, result.output
    assert "is not the audited run's experiment" in result.stderr
    assert "dataset: run 'synthetic', reference 'cora'" in result.stderr

    proportions = _reference_dir(tmp_path / "split-ref", weights)
    record = json.loads((proportions / "run.json").read_text(encoding="utf-8"))
    record["result"]["config"]["federation"]["proportions"] = [0.5, 0.5]
    (proportions / "run.json").write_text(json.dumps(record), encoding="utf-8")
    result = _audit(run_dir, "--reference", proportions, "--no-attacks")
    assert result.exit_code == 2 and "federation.proportions: run [0.3" in result.stderr

    result = _audit(run_dir, "--reference", run_dir)  # the DP run itself is no reference
    assert result.exit_code == 2 and "the run has DP" in result.stderr
    result = _audit(run_dir, "--reference", tmp_path / "nowhere")
    assert result.exit_code == 2 and "not a directory" in result.stderr
    result = _audit(run_dir, "--reference", other, "--no-reference")
    assert result.exit_code == 2 and "contradict" in result.stderr


def test_dp_run_with_a_reference_reports_both_aucs_and_their_difference(run_dir, tmp_path, monkeypatch):
    import torch

    from fedgl_secure.audit.attacks import membership_inference_auc

    _no_retraining(monkeypatch)
    weights = np.random.default_rng(7).normal(0.0, 0.5, PARAMETERS)
    reference = _reference_dir(tmp_path / "ref", weights)
    result = _audit(run_dir, "--reference", reference, "--format", "json")
    assert result.exit_code == 0, result.output
    figures = _membership_figures(json.loads(result.stdout))

    direct = membership_inference_auc(torch.as_tensor(weights, dtype=torch.float32), _merged_synthetic(), seed=0)
    assert figures["dp"] is True
    assert figures["run"]["auc"] == pytest.approx(0.5)  # the fixture's all-zero model
    assert figures["reference"]["status"] == "computed"
    assert figures["reference"]["auc"] == pytest.approx(direct.auc, abs=1e-12)
    assert figures["reference"]["auc_stderr"] == pytest.approx(direct.auc_stderr, abs=1e-12)
    assert abs(direct.auc - 0.5) > 1e-3  # so the reference's model, not the run's, was attacked
    assert figures["difference"] == pytest.approx(0.5 - direct.auc)
    assert figures["difference_stderr"] > max(figures["run"]["auc_stderr"], direct.auc_stderr)
    assert str(reference) in figures["reference"]["source"]

    report = audit_run(run_dir, reference_dir=reference)
    check = _check(report, "membership-reference")
    assert check.status == "info" and f"{direct.auc:.3f}" in check.detail
    from fedgl_secure.audit.report import render_html, render_markdown

    for text in (render_markdown(report), render_html(report)):
        assert "Membership inference with and without DP" in text
        assert "difference (run − reference)" in text and f"{direct.auc:.4g}" in text


def test_a_high_reference_auc_is_information_not_a_failure(run_dir, tmp_path, monkeypatch):
    from fedgl_secure.audit.attacks import MembershipResult

    leaky = MembershipResult(auc=0.97, members=50, nonmembers=50, attack="loss", auc_stderr=0.01)
    from fedgl_secure.audit import attack_section as audit

    attack, calls = audit._membership_auc, []

    def reference_leaks(*args):  # the attacks run in order: the run's model, its reference, the floor
        calls.append(args)
        return leaky if len(calls) == 2 else attack(*args)

    monkeypatch.setattr(audit, "_membership_auc", reference_leaks)
    report = audit_run(run_dir, reference_dir=_reference_dir(tmp_path / "ref", np.zeros(PARAMETERS)))
    assert _check(report, "membership-reference").status == "info"
    assert _check(report, "membership").status == "green"
    assert report.status == "green" and report.exit_code(strict=True) == 0


def test_dp_run_retrains_its_reference_without_dp_for_the_rounds_it_ran(run_dir, monkeypatch):
    from fedgl_secure.audit.attacks import membership_inference_auc
    from fedgl_secure.data.registry import load_dataset
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.simulation.experiment import run_experiment

    events: list[tuple[str, dict]] = []

    class Recorder:
        def info(self, event: str, **values) -> None:
            events.append((event, values))

    monkeypatch.setattr("fedgl_secure.audit.reference.get_logger", lambda **_context: Recorder())
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run["result"]["rounds_run"] = 1  # the config says max_rounds = 300: the reference trains as long as the run did
    run["result"]["config"]["training"]["local_epochs"] = 1  # a small experiment keeps the test fast
    (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
    report = audit_run(run_dir)  # no --reference: retrained from run.json
    assert [values["rounds"] for event, values in events if event == "audit.reference.retraining"] == [1]
    figures = report.sections[-1].data["membership"]
    assert figures["reference"]["status"] == "computed"
    assert figures["reference"]["source"].startswith("retrained in-process (1 rounds")

    config = build_config(
        {
            "dataset": "synthetic",
            "seed": 0,
            "device": "cpu",
            "training": {"local_epochs": 1},
            "federation": {"max_rounds": 1},
        }
    )
    final = []
    run_experiment(config, load_dataset("synthetic", None, 0), progress=False, observer=final.append)
    direct = membership_inference_auc(final[-1].weights, _merged_synthetic(), seed=0)
    assert figures["reference"]["auc"] == pytest.approx(direct.auc, abs=1e-9)
    assert figures["difference"] == pytest.approx(0.5 - direct.auc, abs=1e-9)


def test_no_reference_skips_it_as_information(run_dir, monkeypatch):
    _no_retraining(monkeypatch)
    result = _audit(run_dir, "--no-reference", "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    attacks = next(s for s in document["sections"] if s["key"] == "attacks")
    check = next(c for c in attacks["checks"] if c["name"] == "membership-reference")
    assert check["status"] == "info" and "skipped (--no-reference)" in check["detail"]
    assert attacks["data"]["membership"]["reference"]["status"] == "skipped"
    assert "difference" not in attacks["data"]["membership"]
    assert not any(t["title"] == "Membership inference with and without DP" for t in attacks["tables"])


def test_run_without_dp_needs_no_reference(run_dir, monkeypatch):
    _no_retraining(monkeypatch)
    (run_dir / "policy.toml").write_text(_policy_text("baseline.toml"), encoding="utf-8")
    check = _check(audit_run(run_dir), "membership-reference")
    assert check.status == "info" and check.detail == "run has no DP; its AUC is the without-DP figure"


def test_reference_of_a_run_that_completed_no_round_is_not_computed(run_dir):
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    run["result"]["rounds_run"] = 0  # e.g. a consortium export whose federation never applied a round
    (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
    check = _check(audit_run(run_dir), "membership-reference")
    assert check.status == "info" and "records no completed round" in check.detail


# --- central DP noise and the run's stop: a small simulated secure run ---------------------------------

CENTRAL_POLICY = """description = "test: central noise on the weights, a budget for two rounds"
protection = "he"
quorum = 3
allowed_kinds = ["weights", "node_weight"]

{he}
[dp.weights]
clip = 1.0
noise_multiplier = {z}
noise = "{noise}"

[budget]
epsilon = 3.6
delta = 1e-5
rounds = 2
"""
CENTRAL_SIGMA = 4.0  # noise_multiplier 2 × the weights' sensitivity 2C (C = 1)


def _central_policy(path: Path, z: float = 2.0, noise: str = "central") -> Path:
    path.write_text(CENTRAL_POLICY.format(he=SMALL_HE, z=z, noise=noise), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def central_run(tmp_path_factory) -> Path:
    """A real secure simulation (``fedgl-secure simulate --secure``: synthetic data, 6 banks, CKKS, key authority)
    under a central-noise policy whose budget (ε 3.6) covers two rounds: every bank stops at round 3, and the
    run with them."""
    root = tmp_path_factory.mktemp("central")
    policy_path = _central_policy(root / "central.toml")
    run_dir = root / "run"
    args = ["simulate", "--dataset", "synthetic", "--method", "federated", "--seed", "0", "--rounds", "5"]
    args += ["--device", "cpu", "--set", "training.local_epochs=1", "--no-progress"]
    args += ["--secure", "--policy", str(policy_path), "--run-dir", str(run_dir)]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads(outcome.stdout.strip().splitlines()[-1])
    assert summary["rounds_run"] == 2 and "round 3" in summary["stopped_reason"]
    assert summary["run_dir"] == str(run_dir)
    return run_dir


@pytest.fixture
def central_dir(central_run, tmp_path) -> Path:
    return _copy(central_run, tmp_path / "central")


def _find(report, key: str, name: str):
    return next(c for k, c in report.checks() if k == key and c.name == name)


def _edit_decrypt_records(run_dir: Path, edit) -> None:
    """Apply ``edit(record)`` to every allowed decryption record of audit.jsonl (breaking its hash chain)."""
    log = run_dir / "key-authority" / "audit.jsonl"
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    for record in records:
        if record.get("event") == "decrypt" and record.get("decision") == "allowed":
            edit(record)
    log.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records), encoding="utf-8")


def test_central_noise_run_stopped_by_its_budget_is_green(central_run):
    report = audit_run(central_run, attacks=False)
    assert report.with_status("red") == []
    central = _find(report, "decryptions", "central-noise")
    assert central.status == "green", central.detail
    assert central.detail.startswith("2 decryptions of central kinds") and "weights σ = 4" in central.detail
    table = next(t for s in report.sections for t in s.tables if t.title.startswith("Central DP noise"))
    # the key authority's records: σ of the policy, every weight noised but the last (Σ ŵ_k)
    assert [row[:3] for row in table.rows] == [(1, "weights", CENTRAL_SIGMA), (2, "weights", CENTRAL_SIGMA)]
    assert all(row[4] == row[5] - 1 for row in table.rows)

    stop = _find(report, "privacy", "stop")
    assert stop.status == "green", stop.detail
    assert "fail closed" in stop.detail and "within their privacy budget" in stop.detail  # the run's reason
    assert "bank-0, bank-1, bank-2, bank-3, bank-4, bank-5 at round 3" in stop.detail
    privacy = next(s for s in report.sections if s.key == "privacy")
    assert privacy.data["stop"]["stopped_banks"] == {f"bank-{k}": 3 for k in range(6)}


def test_auditing_against_another_noise_multiplier_or_distributed_noise_is_red(central_run, tmp_path):
    report = audit_run(central_run, _central_policy(tmp_path / "z3.toml", z=3.0), attacks=False)
    central = _find(report, "decryptions", "central-noise")
    assert central.status == "red"
    for round_number in (1, 2):
        assert f"round {round_number} 'weights': central noise σ = 4.0, the policy's σ = 6" in central.detail

    report = audit_run(central_run, _central_policy(tmp_path / "dist.toml", noise="distributed"), attacks=False)
    central = _find(report, "decryptions", "central-noise")
    assert central.status == "red"
    assert "round 2 'weights': central noise (σ = 4.0) added, but the policy asks for none" in central.detail
    assert "noise is 'distributed'" in central.detail


def test_tampered_central_noise_records_are_red_even_with_the_chain_broken(central_dir):
    def wrong_sigma_and_count(record: dict) -> None:
        if record["round"] == 1:
            record["central_noise_std"] = 4.000001  # outside the 1e-9 relative tolerance
        else:
            record["central_noise_values"] = record["values"]  # Σ ŵ_k noised too

    _edit_decrypt_records(central_dir, wrong_sigma_and_count)
    report = audit_run(central_dir, attacks=False)
    assert _find(report, "audit-log", "chain").status == "red"
    central = _find(report, "decryptions", "central-noise")
    assert central.status == "red" and "whose chain is broken" in central.detail
    assert "round 1 'weights': central noise σ = 4.000001, the policy's σ = 4" in central.detail
    assert "round 2 'weights': central noise on 1685 values, expected 1684 of the 1685 decrypted" in central.detail

    def no_noise(record: dict) -> None:
        del record["central_noise_std"], record["central_noise_values"]

    _edit_decrypt_records(central_dir, no_noise)
    central = _find(audit_run(central_dir, attacks=False), "decryptions", "central-noise")
    assert central.status == "red" and "round 1 'weights': decrypted WITHOUT central noise" in central.detail

    def restore(record: dict) -> None:
        record.update(central_noise_std=CENTRAL_SIGMA, central_noise_values=record["values"] - 1)

    _edit_decrypt_records(central_dir, restore)  # byte for byte as the key authority wrote it: chain intact
    assert _find(audit_run(central_dir, attacks=False), "decryptions", "central-noise").status == "green"

    _edit_decrypt_records(central_dir, lambda record: record.update(time="2026-01-01T00:00:00+00:00"))
    report = audit_run(central_dir, attacks=False)  # the right noise, in records the chain no longer vouches for
    assert _find(report, "audit-log", "chain").status == "red"
    central = _find(report, "decryptions", "central-noise")
    assert central.status == "amber" and "unverified" in central.detail


def test_a_stopped_bank_whose_ledger_disagrees_with_its_stop_is_red(central_dir):
    late = PrivacyLedger.load(central_dir / "privacy" / "bank-2.ledger.json")
    late.record_pure("edges", 0.01, round=3)  # a release in the round it stopped at; ε stays within budget
    late.save(central_dir / "privacy" / "bank-2.ledger.json")
    over = PrivacyLedger.load(central_dir / "privacy" / "bank-4.ledger.json")
    over.record(2, "weights", noise_multiplier=0.5, sample_rate=1.0, steps=5)
    over.save(central_dir / "privacy" / "bank-4.ledger.json")

    report = audit_run(central_dir, attacks=False)
    stop = _find(report, "privacy", "stop")
    assert stop.status == "red"
    assert "bank 'bank-2' stopped at round 3 but its ledger records releases in round(s) 3" in stop.detail
    assert "bank 'bank-4' stopped at round 3 with ε = " in stop.detail and "above the budget 3.6" in stop.detail
    assert "bank-0" not in stop.detail
    assert _find(report, "privacy", "budget:bank-2").status == "green"  # only the stop check sees bank-2


def test_a_stop_not_for_the_budget_is_amber_and_a_malformed_stop_red(run_dir):
    def audit_with(reason, stopped_banks) -> Check:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        run["result"]["stopped_reason"], run["stopped_banks"] = reason, stopped_banks
        (run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")
        return _find(audit_run(run_dir, attacks=False), "privacy", "stop")

    stop = audit_with("the federation did not finish (stopped or stalled)", {})
    assert stop.status == "amber" and "not for the privacy budget: the federation did not finish" in stop.detail
    stop = audit_with("privacy budget exhausted: 2 banks left, quorum 3", {})
    assert stop.status == "amber" and "names no bank" in stop.detail
    stop = audit_with(None, {"bank-a": "soon"})
    assert stop.status == "red" and "stopped_banks" in stop.detail
    stop = audit_with(None, {"bank-a": 2})  # bank-a's ledger records releases in rounds 1 and 2
    assert stop.status == "red" and "bank 'bank-a' stopped at round 2" in stop.detail and "round(s) 2" in stop.detail


def test_the_attack_floor_is_the_untrained_initial_model_and_only_information(run_dir, monkeypatch):
    from fedgl_secure.audit.attacks import membership_inference_auc
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.engine.round_pipeline import initial_parameters

    _no_retraining(monkeypatch)
    report = audit_run(run_dir, reference=False)
    floor = _check(report, "membership-floor")
    config = build_config(json.loads((run_dir / "run.json").read_text())["result"]["config"])
    merged = _merged_synthetic()
    untrained = initial_parameters(config, merged.features.shape[1], merged.num_classes)
    direct = membership_inference_auc(untrained, merged, seed=0, hidden=config.training.hidden)
    assert floor.status == "info" and f"AUC {direct.auc:.3f} ± {direct.auc_stderr:.3f}" in floor.detail
    attacks = next(section for section in report.sections if section.key == "attacks")
    assert attacks.data["membership"]["floor"]["auc"] == pytest.approx(direct.auc, abs=1e-12)
    assert abs(direct.auc - 0.5) > 1e-3  # the fixture's all-zero run model scores exactly 0.5: this is W₀


def test_leakage_ledger_lists_the_flows_of_the_runs_method(run_dir):
    from fedgl_secure.audit.ledger import leakage_section
    from fedgl_secure.audit.run_files import read_run_dir

    files = read_run_dir(run_dir)

    def values(method: str) -> list[str]:
        files.directory.run["result"]["method"] = method
        return [row[0] for row in leakage_section(files).tables[0].rows]

    common = values("fedgl")
    assert not any("meta_gradients" in value or "X25519" in value for value in common)
    assert [value for value in values("graphfl") if value not in common] == [
        "Uploads: N_k·g_k (meta_gradients)",
        "Σ N_k g_k and Σ N_k",
        "θ̂ (meta step)",
    ]
    assert any("X25519" in value for value in values("fed2gnn"))
