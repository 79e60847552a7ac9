"""Audit sections 3 to 6: the key authority's decryption ledger and central noise, the audit log's hash chain,
the upload receipts, and the leakage ledger.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgl_secure.audit.report_model import AMBER, GREEN, INFO, RED, Check, Section, Table
from fedgl_secure.audit.run_files import Decryption, RunFiles
from fedgl_secure.errors import FedGLError
from fedgl_secure.wire.run_record import (
    AUDIT_HEAD_FILE,
    BANKS_FILE,
    RECEIPTS_FILE,
)

if TYPE_CHECKING:
    pass

# --- 3. the decryption ledger ----------------------------------------------------------------------


def check_decryptions(files: RunFiles, audit: AuditRecords, receipts: list[Any]) -> tuple[Section, list[Decryption]]:
    """Every decryption once per (round, kind), ≥ quorum distinct registered senders, backed by audit and
    receipts; central DP noise as the policy asks (:func:`check_central_noise`).

    With the audit chain broken (``audit.verified`` false) the cross-check with the ledger is not made
    (amber), the chain check itself being red.
    """
    section = Section("decryptions", "Key authority decryption ledger")
    decryptions = _ledger_checks(section, files, audit.records if audit.verified else None, receipts)
    central, table = check_central_noise(files, audit)
    section.checks.append(central)
    if table is not None:
        section.tables.append(table)
    return section, decryptions


def _ledger_checks(
    section: Section, files: RunFiles, audit_records: list[dict] | None, receipts: list[Any]
) -> list[Decryption]:
    """The decryption ledger's checks (see :func:`check_decryptions`); the decryptions it holds."""
    ledger = files.ledger
    if ledger.error is not None:
        section.add("ledger", RED, f"{ledger.path}: unreadable decryption ledger ({ledger.error})")
        return []
    decryptions, registered = ledger.decryptions, ledger.banks
    quorum = files.policy.quorum
    section.tables.append(
        Table(
            "Decryptions",
            ("round", "kind", "senders", "decrypted at"),
            tuple((d.round, d.kind, ", ".join(d.senders), d.decrypted_at) for d in decryptions),
        )
    )
    if not decryptions:
        section.add("decryptions", AMBER, "the key authority decrypted nothing (did the run train?)")
        return decryptions
    section.add("decryptions", GREEN, f"{len(decryptions)} decryptions recorded")

    repeated = [key for key, n in Counter((d.federation, d.round, d.kind) for d in decryptions).items() if n > 1]
    section.add(
        "once-per-round-kind",
        RED if repeated else GREEN,
        "decrypted more than once: " + ", ".join(f"round {r} {k!r} ({f})" for f, r, k in repeated)
        if repeated
        else "no (round, kind) was decrypted twice (no differencing)",
    )
    short = [d for d in decryptions if len(set(d.senders)) < quorum or len(set(d.senders)) != len(d.senders)]
    section.add(
        "quorum",
        RED if short else GREEN,
        "below the quorum of distinct senders: "
        + "; ".join(f"round {d.round} {d.kind!r}: {list(d.senders)}" for d in short)
        if short
        else f"every decryption had ≥ {quorum} distinct senders",
    )
    kinds = [d for d in decryptions if d.kind not in files.policy.allowed_kinds]
    section.add(
        "kinds",
        RED if kinds else GREEN,
        "kinds the policy does not allow were decrypted: " + ", ".join(sorted({d.kind for d in kinds}))
        if kinds
        else "only kinds the policy allows were decrypted",
    )
    unknown = sorted({s for d in decryptions for s in d.senders} - set(registered))
    section.add(
        "senders-registered",
        RED if unknown else GREEN,
        f"senders not registered with the key authority: {unknown}" if unknown else "every sender is a registered bank",
    )
    # Every decryption must appear in the audit log as allowed, with the same senders, and vice versa.
    if audit_records is None:
        section.add("matches-audit-log", AMBER, "not checked: the audit log's chain is broken (see audit-log)")
    else:
        audited = Counter(
            (r.get("federation"), r.get("round"), r.get("kind"), tuple(r.get("senders", ())))
            for r in audit_records
            if r.get("event") == "decrypt" and r.get("decision") == "allowed"
        )
        recorded = Counter((d.federation, d.round, d.kind, tuple(d.senders)) for d in decryptions)
        problems = [
            f"round {r} {k!r} decrypted but not in the audit log as allowed" for _, r, k, _ in recorded - audited
        ]
        problems += [
            f"round {r} {k!r} in the audit log as allowed but not in the ledger" for _, r, k, _ in audited - recorded
        ]
        section.add(
            "matches-audit-log",
            RED if problems else GREEN,
            "; ".join(problems) if problems else "ledger and audit log agree on every decryption and its senders",
        )
    # Each sender of each decryption must have signed a receipt bound to that round, nonce and kind.
    signed = {(r.federation, r.round, r.nonce, r.kind, r.sender) for r in receipts}
    missing = [
        f"round {d.round} {d.kind!r} from {s!r}"
        for d in decryptions
        for s in d.senders
        if (d.federation, d.round, d.nonce, d.kind, s) not in signed
    ]
    section.add(
        "receipts-for-decryptions",
        RED if missing else GREEN,
        f"{len(missing)} contributions without a receipt: " + "; ".join(missing[:10])
        if missing
        else "every contribution to every decrypted sum has a receipt",
    )
    return decryptions


# Fields of the key authority's allowed decision when it added central DP noise (KeyAuthority.decrypt_sum).
CENTRAL_NOISE_STD = "central_noise_std"
CENTRAL_NOISE_VALUES = "central_noise_values"
CENTRAL_NOISE_RTOL = 1e-9


@dataclass(frozen=True)
class AuditRecords:
    """audit.jsonl as read once: its records, and whether its hash chain verified up to the recorded head."""

    records: list[dict]  # every line that parses as a JSON object (all of them when verified)
    verified: bool  # False: the chain is broken, the records are only what the file says


def _read_audit_records(path: Path) -> list[dict]:
    """Every line of audit.jsonl that parses as a JSON object, trusted or not."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _central_noise_problem(record: dict, expected: dict[str, float], policy: Any) -> str | None:
    """What is wrong with one allowed decision's central noise, or None."""
    from fedgl_secure.privacy.calibration import central_noise_count

    kind = record.get("kind")
    where = f"round {record.get('round')} {kind!r}"
    carried = CENTRAL_NOISE_STD in record or CENTRAL_NOISE_VALUES in record
    std, count, values = record.get(CENTRAL_NOISE_STD), record.get(CENTRAL_NOISE_VALUES), record.get("values")
    if kind not in expected:
        if not carried:
            return None
        channel = policy.dp.upload_channel(kind) if isinstance(kind, str) else None
        why = f"its channel's noise is {channel.noise!r}" if channel is not None else "it has no DP channel"
        return f"{where}: central noise (σ = {std}) added, but the policy asks for none on {kind!r} ({why})"
    sigma = expected[kind]
    if not carried:
        if values == 0:
            return None  # nothing decrypted, nothing to noise
        return f"{where}: decrypted WITHOUT central noise; the policy asks for σ = {sigma:.6g}"
    problems = []
    number = isinstance(std, (int, float)) and not isinstance(std, bool)
    if not (number and math.isclose(std, sigma, rel_tol=CENTRAL_NOISE_RTOL)):
        problems.append(f"σ = {std}, the policy's σ = {sigma:.6g}")
    if _is_count(values):
        wanted = central_noise_count(kind, values)  # Σ ŵ_k, the last weight, is exact
        if count != wanted:
            problems.append(f"on {count} values, expected {wanted} of the {values} decrypted")
    elif not _is_count(count):
        problems.append(f"no count of noised values ({count!r})")
    return f"{where}: central noise " + ", ".join(problems) if problems else None


def check_central_noise(files: RunFiles, audit: AuditRecords) -> tuple[Check, Table | None]:
    """Central DP noise in the key authority's allowed decisions (audit.jsonl) against the policy.

    Every decryption of a kind whose channel says ``noise = "central"`` must record
    ``central_noise_std`` equal to the policy's σ (relative tolerance :data:`CENTRAL_NOISE_RTOL`)
    and ``central_noise_values`` equal to the decrypted size (less the weights' last entry, Σ ŵ_k);
    no decryption of any other kind may carry central noise. Red naming the round and kind; info
    (not applicable) when the policy has no central channel and no decision carries any. With the
    chain broken (``audit.verified`` false) the records are taken as they are: a mismatch is still
    red, agreement only amber (unverified).
    """
    from fedgl_secure.crypto.key_authority import AUDIT_FILE
    from fedgl_secure.privacy.calibration import central_noise_stds

    name = "central-noise"
    try:
        expected = central_noise_stds(files.policy)
    except (FedGLError, ValueError) as error:
        return Check(name, RED, f"cannot compute the policy's central-noise σ: {error}"), None
    verified = audit.verified
    allowed = [r for r in audit.records if r.get("event") == "decrypt" and r.get("decision") == "allowed"]
    carrying = [r for r in allowed if CENTRAL_NOISE_STD in r or CENTRAL_NOISE_VALUES in r]
    if not expected and not carrying:
        not_applicable = (
            "not applicable: the policy has no central DP channel (noise = 'central'), and no decryption "
            "carries central noise"
        )
        return Check(name, INFO, not_applicable), None
    problems = [p for r in allowed if (p := _central_noise_problem(r, expected, files.policy)) is not None]
    central = sum(1 for r in allowed if r.get("kind") in expected)
    table = Table(
        "Central DP noise added by the key authority (audit log)",
        ("round", "kind", "σ recorded", "σ policy", "values noised", "values decrypted"),
        tuple(
            (
                r.get("round"),
                r.get("kind"),
                r.get(CENTRAL_NOISE_STD),
                expected.get(r.get("kind")),
                r.get(CENTRAL_NOISE_VALUES),
                r.get("values"),
            )
            for r in allowed
            if r.get("kind") in expected or CENTRAL_NOISE_STD in r or CENTRAL_NOISE_VALUES in r
        ),
    )
    unverified = "" if verified else f" (read from {AUDIT_FILE}, whose chain is broken: see audit-log)"
    if problems:
        shown = "; ".join(problems[:10]) + (f"; … {len(problems) - 10} more" if len(problems) > 10 else "")
        detail = f"{len(problems)} decryptions do not carry the policy's central noise{unverified}: {shown}"
        return Check(name, RED, detail), table
    sigmas = ", ".join(f"{kind} σ = {sigma:.6g}" for kind, sigma in expected.items()) or "none"
    values = "every value decrypted but Σ ŵ_k (the weights' last entry)" if "weights" in expected else "every value"
    detail = (
        f"{central} decryptions of central kinds carried the key authority's noise at the policy's σ ({sigmas}) "
        f"on {values}; {len(allowed) - central} decryptions of other kinds carried none"
    )
    if not verified:
        return Check(name, AMBER, f"{detail}, but these records are unverified{unverified}"), table
    return Check(name, GREEN, detail), table


# --- 4. the audit-log hash chain -------------------------------------------------------------------


def check_audit_chain(files: RunFiles) -> tuple[Section, AuditRecords]:
    """Verify audit.jsonl's chain up to the recorded head; its records for the cross-checks, read once."""
    from fedgl_secure.crypto.audit_log import verify_audit_chain
    from fedgl_secure.crypto.key_authority import AUDIT_FILE, AUDIT_HEAD

    section = Section("audit-log", "Audit log hash chain")
    log_path = files.directory.key_authority_dir / AUDIT_FILE
    head = files.directory.audit_head
    recorded_head = files.ledger.meta.get(AUDIT_HEAD)  # None too when the ledger is unreadable (decryptions)
    if recorded_head is not None and recorded_head != head:
        section.add(
            "head",
            RED,
            f"{AUDIT_HEAD_FILE} ({head[:12]}…) differs from the head in the key authority's ledger "
            f"({recorded_head[:12]}…): one of them was replaced",
        )
    report = verify_audit_chain(log_path, head)
    records = _read_audit_records(log_path)
    if not report.ok:
        section.add(
            "chain",
            RED,
            f"BROKEN LINK in {AUDIT_FILE} at line {report.broken_line}: "
            f"{report.problem.removeprefix(f'line {report.broken_line}: ')}",
        )
        return section, AuditRecords(records, verified=False)
    section.add("chain", GREEN, f"{report.lines} records, chain intact up to the recorded head {head[:12]}…")
    decisions = Counter((r.get("event", "?"), r.get("decision", "?")) for r in records)
    section.tables.append(
        Table(
            "Audit log decisions",
            ("event", "decision", "count"),
            tuple((event, decision, n) for (event, decision), n in sorted(decisions.items())),
        )
    )
    refused = [r for r in records if r.get("decision") == "refused"]
    if refused:
        section.tables.append(
            Table(
                "Refusals (the key authority enforcing its rules)",
                ("line", "event", "round", "kind", "reason", "detail"),
                tuple(
                    (r.get("seq"), r.get("event"), r.get("round"), r.get("kind"), r.get("reason"), r.get("detail"))
                    for r in refused
                ),
            )
        )
    return section, AuditRecords(records, verified=True)


# --- 5. receipts -------------------------------------------------------------------------------------


def check_receipts(files: RunFiles) -> tuple[Section, list[Any]]:
    """Every receipt verifies under ``banks.json``; banks.json matches the key authority's registry.

    :func:`~fedgl_secure.wire.run_record.load_run_dir` has already parsed every receipt and every
    key (a malformed one is a corrupt run directory, not a check).
    """
    from fedgl_secure.crypto.receipts import load_public_key, verify_receipt
    from fedgl_secure.errors import ReceiptError

    section = Section("receipts", "Upload receipt signatures")
    bank_keys = files.directory.bank_keys
    keys = {bank: load_public_key(bytes.fromhex(hex_key)) for bank, hex_key in bank_keys.items()}
    if files.ledger.error is None:
        registered = files.ledger.banks
        differing = sorted(
            bank for bank in set(registered) | set(bank_keys) if registered.get(bank, b"").hex() != bank_keys.get(bank)
        )
        section.add(
            "keys-match-key-authority",
            RED if differing else GREEN,
            f"{BANKS_FILE} and the key authority's registry disagree for {differing} (a substituted key would "
            "make forged receipts verify)"
            if differing
            else f"{BANKS_FILE} holds exactly the {len(registered)} keys the key authority registered",
        )
    valid: list[Any] = []
    bad: list[str] = []
    for number, receipt in enumerate(files.directory.receipts, start=1):
        key = keys.get(receipt.sender)
        if key is None:
            bad.append(f"{RECEIPTS_FILE} line {number}: sender {receipt.sender!r} has no key in {BANKS_FILE}")
            continue
        try:
            verify_receipt(key, receipt)
        except ReceiptError as error:
            bad.append(f"{RECEIPTS_FILE} line {number}: FORGED — {error}")
            continue
        valid.append(receipt)
    if bad:
        section.add(
            "signatures", RED, f"{len(bad)} of {len(valid) + len(bad)} receipts do not verify: " + "; ".join(bad)
        )
    elif not valid:
        section.add("signatures", AMBER, f"{RECEIPTS_FILE} holds no receipts")
    else:
        section.add("signatures", GREEN, f"all {len(valid)} receipts carry valid Ed25519 signatures of their senders")
    by_bank = Counter((r.sender, r.kind) for r in valid)
    section.tables.append(
        Table(
            "Valid receipts per bank and kind",
            ("bank", "kind", "receipts"),
            tuple((bank, kind, n) for (bank, kind), n in sorted(by_bank.items())),
        )
    )
    return section, valid


# --- 6. the leakage ledger -----------------------------------------------------------------------------

LEAKAGE_DOC = "docs/threat-model.md §3"
# Condensed from docs/threat-model.md §3 (the authoritative, longer table; keep the two in step).
LEAKAGE_LEDGER: tuple[tuple[str, str, str, str], ...] = (
    ("Node certificates (name, role, federation)", "node → peers (TLS)", "peers", "who talks to whom (R10)"),
    ("Banks' signing public keys", "public/ → aggregator, key authority", "both", "none"),
    ("Public CKKS context and fingerprint", "key authority → every node", "every node", "anyone can encrypt (R6)"),
    (
        "Key ceremony: signed public shares, Shamir shares sealed to each recipient",
        "bank → key authority → banks",
        "public shares: key authority, banks; Shamir shares: their recipient only",
        "banks trusted to deal consistently (R16)",
    ),
    (
        "Sealed key shares (key authority's s_0, each bank's Shamir share)",
        "each node's disk",
        "nobody without that node's operator secret",
        "operator secrets (R8)",
    ),
    (
        "Pseudonym set of bank k (HMAC per node)",
        "bank → aggregator",
        "aggregator",
        "N_k and which banks hold each pseudonymised customer (R4)",
    ),
    ("M and bank k's own union positions", "aggregator → bank k", "bank k", "M − N_k (R4)"),
    (
        "Round view and history, evaluation counts",
        "aggregator ↔ banks",
        "all nodes",
        "liveness, per-bank accuracy (R6)",
    ),
    ("Receipts (metadata + signature)", "bank → aggregator → key authority", "both", "who contributed what, when"),
    (
        "Ciphertext sizes and timing",
        "bank → aggregator (network)",
        "aggregator, network",
        "shapes, N_k via timing (R10)",
    ),
    (
        "Uploads: N_k·(W_k − W̄) (centred on the public W̄), N_k·P_k, N_k·H_k, node_weight",
        "bank → aggregator",
        "nobody (CKKS)",
        "none while encrypted",
    ),
    (
        "Each receipted upload's c1; partial decryptions c1·s_i + E_i",
        "aggregator ↔ key authority and t banks",
        "decryptors see c1 only",
        "R7",
    ),
    ("Σ N_k W_k and Σ N_k", "aggregator (fused)", "aggregator", "with the rest colluding: the other's update (R2)"),
    ("Σ N_k P_k and Σ N_k H_k per row", "aggregator (fused)", "aggregator", "single-holder rows in clear (R1)"),
    ("W̄ (global model)", "aggregator → every bank", "aggregator, all banks", "model attacks unless DP (R9)"),
    ("Ȳ pseudo labels (all M)", "aggregator → every bank", "aggregator, all banks", "single-holder labels (R4)"),
    ("Ā pseudo graph (M × s)", "aggregator → every bank", "aggregator, all banks", "link inference (R4)"),
    ("Aggregator state (sums, pseudonyms, models)", "aggregator.sqlite3", "aggregator operators", "R1, R4, R11"),
    ("Key authority ledger and audit log", "key authority state", "its operators", "decisions, no values"),
)
# The flows only some methods add (docs/threat-model.md §3 rows of the same names), listed for their runs.
METHOD_LEAKAGE: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "graphfl": (
        ("Uploads: N_k·g_k (meta_gradients)", "bank → aggregator", "nobody (CKKS)", "none while encrypted"),
        ("Σ N_k g_k and Σ N_k", "aggregator (unmasked)", "aggregator", "two contributors: the other's gradient (R2)"),
        ("θ̂ (meta step)", "aggregator → every bank", "aggregator, all banks", "model attacks, no DP for GraphFL (R9)"),
    ),
    "fed2gnn": (
        ("X25519 exchange keys, Ed25519-signed", "bank → aggregator → every bank", "all nodes", "none"),
        ("Boundary pseudonyms of bank a", "bank a → aggregator → other banks", "all nodes", "cross-bank links exist"),
        ("Masked passive terms y_p", "bank p → aggregator", "nobody (pairwise masks)", "volume per bank"),
        ("Σ_p of passive terms per boundary node", "aggregator → bank a", "bank a", "one passive bank: its sums"),
    ),
}


def leakage_section(files: RunFiles) -> Section:
    section = Section("leakage", "Leakage ledger (what crosses which boundary)")
    rows = LEAKAGE_LEDGER + METHOD_LEAKAGE.get(files.run.get("method", ""), ())
    section.tables.append(Table("Leakage ledger", ("value", "from → to", "seen in clear by", "residual risk"), rows))
    section.notes.append(f"Condensed from {LEAKAGE_DOC}, which gives each row's justification and mitigation.")
    if files.policy.protection == "none":
        section.add("uploads", RED, "under this policy every upload crosses bank → aggregator in clear")
    elif not files.policy.has_dp:
        section.add("decrypted-sums", AMBER, "no DP: the fused results (W̄, Ȳ, Ā) that reach every bank are exact")
    else:
        section.add("documented", GREEN, f"every boundary crossing is documented in {LEAKAGE_DOC}")
    return section
