"""A consortium run's run directory (DESIGN §6): what ``fedgl-secure audit`` reads, from the nodes' state.

:func:`collect_consortium_run` reads, after every node process has stopped (files closed): the
aggregator's SQLite (final model as stored, accepted receipts, rounds and pooled reports, banks'
withdrawals and the run's ``stopped_reason``), each bank's ``privacy-ledger.json`` (DP policies),
the key authority's ledger, audit log and audit head, the policy file and the banks' public signing
keys, and writes them with :func:`fedgl_secure.wire.run_record.write_run_dir` — the same layout
a simulation leaves (a withdrawn bank is a ``stopped_banks`` entry, with the round it declined).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from fedgl_secure.consortium.aggregator_store import (
    AggregatorStore,
    best_report,
    pooled_test_metrics,
    round_history,
    validation_scores,
)
from fedgl_secure.consortium.bank_state import LEDGER_FILE as BANK_LEDGER_FILE
from fedgl_secure.consortium.config import ConsortiumConfig, PkiLayout, load_consortium, load_node_config
from fedgl_secure.crypto.key_authority import AUDIT_HEAD
from fedgl_secure.crypto.key_authority import LEDGER_FILE as KA_LEDGER_FILE
from fedgl_secure.crypto.receipts import parse_receipt, public_key_bytes
from fedgl_secure.engine.evaluation import ratio
from fedgl_secure.errors import ConfigError
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.services.pki import load_signing_public_keys
from fedgl_secure.wire.run_record import MODEL_FILE, SecureRecord, write_run_dir


def node_state_dir(consortium: ConsortiumConfig, name: str) -> Path:
    """A node's state directory: as its node config resolves it (``load_node_config`` fills the default),
    else ``<state_root>/<name>`` when the node has no config next to the consortium file."""
    if consortium.source is not None:
        config_path = Path(consortium.source).resolve().parent / f"{name}.toml"
        if config_path.is_file():
            return load_node_config(config_path)[0].state_dir
    return consortium.state_dir(name)


def _audit_head(ledger_path: Path) -> str:
    connection = sqlite3.connect(f"{ledger_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT value FROM meta WHERE key = ?", (AUDIT_HEAD,)).fetchall()
    finally:
        connection.close()
    if not rows:
        raise ConfigError(f"{ledger_path}: the key authority recorded no audit head")
    return rows[0][0]


def _result(consortium: ConsortiumConfig, store) -> dict[str, Any]:
    """The run record from the aggregator's rounds and the banks' pooled evaluation reports."""
    config = consortium.experiment_config()
    reports = store.pooled_reports()
    rows = store.rounds()
    round_of_version = {row.base_version + 1: row.round for row in rows if row.status == "applied"}
    history = round_history(store, reports)
    best = best_report(reports, round_of_version, validation_scores(store, reports, config.evaluation.selection))
    top_fraction = config.evaluation.top_fraction
    metrics = pooled_test_metrics(store, best[0] if best else None, top_fraction)
    index = store.index()
    finished = store.finished()
    return {
        "dataset": config.dataset,
        "method": config.method,
        "seed": config.seed,
        "rounds_run": len(round_of_version),
        "best_round": round_of_version[best[0]] if best else 0,
        "best_val_accuracy": ratio(best[1][1], best[1][2]) if best else float("nan"),
        "global_test_accuracy": ratio(best[1][3], best[1][4]) if best else float("nan"),
        "local_test_accuracy": [],
        # from the banks' pooled score histograms (engine/score_histograms.py); None without a positive class
        "global_test_metrics": metrics,
        "wall_seconds": sum(h["seconds"] or 0.0 for h in history),
        "num_clients": len(consortium.banks),
        "num_global_nodes": index[0] if index else 0,
        "history": history,
        "config": config.model_dump(mode="json"),
        "stopped_reason": store.stopped_reason() if finished else "the federation did not finish (stopped or stalled)",
    }


def collect_consortium_run(consortium: ConsortiumConfig | str | Path, out_dir: str | Path) -> Path:
    """Write the run directory of a consortium whose node processes have all stopped; returns its path."""
    if not isinstance(consortium, ConsortiumConfig):
        consortium = load_consortium(consortium)
    out_dir = Path(out_dir)
    aggregator_db = node_state_dir(consortium, consortium.aggregator.name) / "aggregator.sqlite3"
    if not aggregator_db.is_file():
        raise ConfigError(f"{aggregator_db}: no aggregator state; did the consortium run?")
    store = AggregatorStore(aggregator_db)
    try:
        version = store.latest_version()
        model = store.model(version) if version is not None else None
        receipts = [parse_receipt(text) for text in store.receipts()]
        result = _result(consortium, store)
        withdrawn = {bank: w.round for bank, w in store.withdrawals().items()}
    finally:
        store.close()
    if model is None:
        raise ConfigError(f"{aggregator_db}: no model stored; the federation never started")

    policy = load_policy(consortium.policy)
    ledgers = None  # no DP: no ledgers, and no bank stops for its budget
    if policy.has_dp:
        ledgers = {}
        for bank in consortium.banks:
            path = node_state_dir(consortium, bank.name) / BANK_LEDGER_FILE
            if not path.is_file():
                raise ConfigError(f"{path}: bank {bank.name!r} has no privacy ledger (DP policy)")
            ledgers[bank.name] = PrivacyLedger.load(path)

    ka_state = node_state_dir(consortium, consortium.key_authority.name)
    bank_names = [bank.name for bank in consortium.banks]
    public_keys = {
        bank: public_key_bytes(key).hex()
        for bank, key in sorted(load_signing_public_keys(PkiLayout(consortium.pki_dir), bank_names).items())
    }
    secure = SecureRecord(
        federation=consortium.federation,
        fingerprint=receipts[0].context_fingerprint if receipts else None,
        key_authority_dir=ka_state,
        audit_head=_audit_head(ka_state / KA_LEDGER_FILE),
        receipts=receipts,
        bank_public_keys=public_keys,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MODEL_FILE).write_bytes(model)  # the final broadcast, byte for byte as the banks received it
    return write_run_dir(
        out_dir,
        result,
        policy_path=consortium.policy,
        ledgers=ledgers,
        stopped_banks=withdrawn if ledgers is not None else None,
        secure=secure,
    )
