"""A real consortium under a DP policy, run by ``consortium up``: central noise from the key authority,
banks that spend their budget and withdraw, and a run that stops with a reason instead of stalling.

One run serves every check (each node process imports torch and TenSEAL, so runs are what costs time):
weights carry **central** noise, predictions distributed noise; the budget affords exactly 2 rounds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from consortium_harness import BANKS, NODE_SECRETS, SMALL_HE, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.bank_data import consortium_slices
from fedgl_secure.consortium.bank_state import LEDGER_FILE
from fedgl_secure.consortium.config import load_consortium
from fedgl_secure.data.global_index import GlobalIndex
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.dp_round import FederationPrivacy, noise_std
from fedgl_secure.privacy.release_schedule import planned_ledger
from fedgl_secure.services.orchestrate import consortium_up
from fedgl_secure.services.run_export import collect_consortium_run
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.wire.run_record import load_run_dir

pytestmark = pytest.mark.slow

UPLOAD_SECONDS = 3600.0
"""An hour: a round waiting for its upload deadline would outlast consortium_up's 240 s, so the run ending at all
shows that the withdrawals aborted round 3 at once (no clock read in the test)."""


def channel(noise: str) -> dict:
    return {"clip": 1.0, "noise_multiplier": 1.0, "noise": noise}


def dp_policy(epsilon: float) -> dict:
    """The policy's DP entries: central noise on the weights, distributed on the predictions, a budget."""
    return {
        "allowed_kinds": ["weights", "predictions", "node_weight"],
        "dp": {"weights": channel("central"), "predictions": channel("distributed"), "graph": {"max_degree": 3}},
        "budget": {"epsilon": epsilon, "delta": 1e-5, "rounds": 10},
    }


def two_round_budget() -> float:
    """Between the ε of 2 and of 3 rounds of this policy: every bank can afford exactly 2 rounds."""
    probe = policy_from_dict({"he": SMALL_HE.model_dump(), **dp_policy(1000.0)})
    two, three = (planned_ledger(probe, n).epsilon(1e-5) for n in (2, 3))
    return (two + three) / 2


def simulation_to_consortium_rows(consortium) -> np.ndarray:
    """``rows[i]``: the consortium's (secret) union row of the simulation's row ``i`` (sorted node ids), through each
    bank's stored positions."""
    config = load_consortium(consortium.consortium_path).experiment_config()
    slices = consortium_slices(config, None)
    store = AggregatorStore(consortium.root / "state" / "aggregator" / "aggregator.sqlite3")
    try:
        size, positions = store.index()
    finally:
        store.close()
    simulation = GlobalIndex.from_id_sets([graph.node_ids for graph in slices])
    rows = np.empty(size, dtype=np.int64)
    for bank, graph in zip(BANKS, slices, strict=True):
        rows[simulation.positions(graph.node_ids)] = positions[bank]
    return rows


def decrypted_sums_in_simulation_order(consortium, rounds) -> dict[int, dict[str, np.ndarray]]:
    """The aggregator's decrypted sums per round and kind, per-node rows moved from the consortium's secret
    union order to the simulation's (:func:`simulation_to_consortium_rows`)."""
    consortium_row = simulation_to_consortium_rows(consortium)
    size = len(consortium_row)
    store = AggregatorStore(consortium.root / "state" / "aggregator" / "aggregator.sqlite3")
    try:
        sums = {r: {kind: values for kind, (_, values, _) in store.sums(r).items()} for r in rounds}
    finally:
        store.close()
    return {
        r: {kind: v if kind == "weights" else v.reshape(size, -1)[consortium_row].reshape(-1) for kind, v in s.items()}
        for r, s in sums.items()
    }


class ReplayedSums:
    """The simulation's summation, fed the consortium's decrypted sums.

    It records the simulation's own sums (no central noise) and returns the consortium's, which already
    carry the key authority's noise, so ``FederationPrivacy.with_central_noise`` must not add more
    (``adds_central_noise``). Each simulated round then starts from the very model (W̄ and pseudo labels)
    the consortium's banks received, and the difference of the weights sums is the key authority's noise alone.
    """

    adds_central_noise = True

    def __init__(self, decrypted: dict[int, dict[str, np.ndarray]]) -> None:
        self.decrypted = decrypted
        self.noiseless: dict[int, dict[str, np.ndarray]] = {}

    def __call__(self, round_number, contributions, reference=None):
        sums = PlaintextSummation()(round_number, contributions)
        self.noiseless[round_number] = {kind: s.double().numpy().reshape(-1) for kind, s in sums.items()}
        if round_number not in self.decrypted:
            return sums
        return {
            kind: torch.from_numpy(self.decrypted[round_number][kind].astype(np.float32)).reshape(s.shape)
            for kind, s in sums.items()
        }


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """`consortium up` on a consortium whose banks can afford 2 of its 5 rounds."""
    root = tmp_path_factory.mktemp("dp-consortium")
    budget = two_round_budget()
    consortium = write_consortium(
        root,
        max_rounds=5,
        upload_seconds=UPLOAD_SECONDS,
        method="fedgl-no-gpg",
        policy_extra=dp_policy(budget),
        # unpacked: the decrypted sums are compared with the simulation's float sums at 1e-4 (node_weight, with no
        # DP channel, would otherwise be packed: quantised to 2^-6)
        he=SMALL_HE.model_copy(update={"packing": "none"}),
    )
    printed: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for variable, secret in NODE_SECRETS.items():
            patch.setenv(variable, secret)
        summary = consortium_up(consortium.consortium_path, progress=False, echo=printed.append, timeout=240)
    return consortium, budget, summary, printed


def test_consortium_up_ends_normally_with_the_reason_when_banks_exhaust_their_budget(stopped_run):
    consortium, budget, summary, printed = stopped_run
    assert summary.get("finished") and not summary.get("interrupted")
    assert summary["rounds_applied"] == 2
    reason = summary["stopped_reason"]
    quorum = load_policy(consortium.root / "policy.toml").quorum
    assert reason.startswith("privacy budget exhausted: ") and f"quorum {quorum}" in reason, reason
    assert printed[-1] == f"the federation stopped early: {reason}"
    # every process ended cleanly: banks on their own once the federation finished, the others on SIGTERM
    assert summary["exit_codes"] == {name: 0 for name in ("key-authority", "aggregator", *BANKS)}

    state = consortium.root / "state"
    logs = {name: (state / "logs" / f"{name}.log").read_text() for name in ("aggregator", *BANKS)}
    assert "rounds.stopped" in logs["aggregator"] and "bank.withdrew" in logs["aggregator"]
    store = AggregatorStore(state / "aggregator" / "aggregator.sqlite3")
    try:
        rounds, withdrawals = store.rounds(), store.withdrawals()
        assert store.finished() and store.stopped_reason() == reason
    finally:
        store.close()
    # rounds 1-2 applied; round 3 aborted once, at once (not at the upload deadline), and never reopened
    assert [(r.round, r.status, r.attempts) for r in rounds] == [
        (1, "applied", 1),
        (2, "applied", 1),
        (3, "aborted", 1),
    ]
    assert all(sorted(r.contributors) == list(BANKS) for r in rounds[:2])
    assert "withdrawn:" in rounds[2].detail  # and at once: the run ended long before the hour (UPLOAD_SECONDS)
    # enough banks withdrew to leave fewer than the quorum: with the quorum at every bank, the first withdrawal
    # stops the run (the others may see the stop before their own check)
    assert len(withdrawals) >= len(BANKS) - quorum + 1
    assert all(w.reason == "privacy-budget-exhausted" and w.round == 3 for w in withdrawals.values())
    for bank in BANKS:
        ledger = PrivacyLedger.load(state / bank / LEDGER_FILE)
        assert {release.round for release in ledger.releases} == {1, 2}
        assert ledger.epsilon(1e-5) <= budget
        if bank in withdrawals:  # a bank that saw the federation stop before its own check never reached it
            assert "privacy.budget_exhausted" in logs[bank]


def test_the_key_authority_adds_central_noise_of_the_configured_scale_to_the_weights(stopped_run):
    consortium, _budget, _summary, _printed = stopped_run
    state = consortium.root / "state"
    policy = load_policy(consortium.root / "policy.toml")
    decrypted = decrypted_sums_in_simulation_order(consortium, (1, 2))
    config = load_consortium(consortium.consortium_path).experiment_config()
    replay = ReplayedSums(decrypted)  # the simulation's banks run out of budget at round 3 as well
    run_experiment(config, progress=False, summation=replay, privacy=FederationPrivacy(policy))

    sigma = noise_std(policy, "weights")
    noise = []
    for r in (1, 2):
        difference = decrypted[r]["weights"] - replay.noiseless[r]["weights"]
        # Σ ŵ_k (last entry) is public and exact: only CKKS error (< 1e-4, as in test_consortium) remains
        assert abs(difference[-1]) < 1e-4, r
        np.testing.assert_allclose(decrypted[r]["node_weight"], replay.noiseless[r]["node_weight"], atol=1e-4)
        noise.append(difference[:-1])
    noise = np.concatenate(noise)
    # n i.i.d. N(0, σ²) values (n = 2 × the model's parameters, in the thousands): the sample std is within
    # 6/√(2n) of σ and the mean within 6σ/√n, each except with probability < 1e-8. CKKS error (< 1e-4) is
    # negligible against σ = 2; 3 bank shares on top (σ²/q each, q = 3) would make the std √2·σ, no noise ≈ 0.
    assert noise.size > 1000
    assert abs(noise.std() / sigma - 1) < 6 / np.sqrt(2 * noise.size), (noise.std(), sigma)
    assert abs(noise.mean()) < 6 * sigma / np.sqrt(noise.size)
    # predictions (distributed): the consortium's 3 bank shares of σ²/q each, minus the simulation's own 3
    # shares: std σ·√(6/q) — and nothing from the key authority, which would add σ² more
    sigma_p, q = noise_std(policy, "predictions"), policy.quorum
    both = np.concatenate([decrypted[r]["predictions"] - replay.noiseless[r]["predictions"] for r in (1, 2)])
    assert abs(both.std() / (sigma_p * np.sqrt(6 / q)) - 1) < 6 / np.sqrt(2 * both.size)

    # the key authority's audit log names the noise of every weights decryption, and only those
    records = [json.loads(line) for line in (state / "key-authority" / "audit.jsonl").read_text().splitlines()]
    allowed = [r for r in records if r["event"] == "decrypt" and r["decision"] == "allowed"]
    noised = {(r["round"], r["kind"]): r.get("central_noise_std") for r in allowed}
    assert noised[(1, "weights")] == noised[(2, "weights")] == sigma
    assert noised[(1, "predictions")] is None and noised[(1, "node_weight")] is None
    weights_length = decrypted[1]["weights"].size
    assert {r["central_noise_values"] for r in allowed if r["kind"] == "weights"} == {weights_length - 1}
    # every bank accounted for the central release with the full multiplier, as planned
    for bank in BANKS:
        spent = PrivacyLedger.load(state / bank / LEDGER_FILE).epsilon(1e-5)
        assert spent == pytest.approx(planned_ledger(policy, 2).epsilon(1e-5))


def test_a_restarted_aggregator_keeps_the_stop_and_withdrawals_are_bank_only_and_idempotent(stopped_run):
    consortium, _budget, summary, _printed = stopped_run
    consortium.start("key-authority", "aggregator")
    try:
        consortium.wait_healthy("aggregator")
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "the restarted aggregator", timeout=30)
        assert status["stopped_reason"] == summary["stopped_reason"]
        assert [row["round"] for row in status["rounds"]] == [1, 2, 3]
        withdrawn = {w["bank"] for w in status["withdrawn"]}
        bank = sorted(withdrawn)[0]
        body = {"reason": "privacy-budget-exhausted", "round": 3}
        with consortium.client(bank, "aggregator") as http:
            again = http.post("/v1/withdraw", json=body)
            assert again.status_code == 200 and again.json() == {"withdrawn": True, "duplicate": True}
            wrong = http.post("/v1/withdraw", json={**body, "reason": "bored"})
            assert wrong.status_code == 422 and wrong.json()["error"] == "invalid-request"
            round_view = http.get("/v1/round").json()
            assert round_view["phase"] == "finished" and round_view["stopped_reason"] == summary["stopped_reason"]
        with consortium.client("key-authority", "aggregator") as http:
            refused = http.post("/v1/withdraw", json=body)
            assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        assert {w["bank"] for w in consortium.status()["withdrawn"]} == withdrawn
    finally:
        consortium.stop_all()


def test_the_stopped_run_exports_its_reason_and_withdrawn_banks_and_passes_the_audit(stopped_run, tmp_path):
    consortium, _budget, summary, _printed = stopped_run
    run_dir = collect_consortium_run(consortium.consortium_path, tmp_path / "run")
    loaded = load_run_dir(run_dir)
    assert loaded.secure and sorted(loaded.ledgers) == list(BANKS) and sorted(loaded.bank_keys) == list(BANKS)
    assert loaded.run["result"]["rounds_run"] == 2
    assert loaded.run["result"]["stopped_reason"] == summary["stopped_reason"]
    quorum = load_policy(consortium.root / "policy.toml").quorum
    # enough withdrawals to leave fewer than the quorum (see the first test)
    assert len(loaded.run["stopped_banks"]) >= len(BANKS) - quorum + 1
    assert set(loaded.run["stopped_banks"].values()) == {3}
    assert [h["status"] for h in loaded.run["result"]["history"]] == ["applied", "applied", "aborted"]
    assert {(r.round, r.sender) for r in loaded.receipts} >= {(n, b) for n in (1, 2) for b in BANKS}
    report = audit_run(run_dir, attacks=False)
    assert report.with_status("red") == []
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    for name in ("audit-log/chain", "receipts/signatures", "receipts/keys-match-key-authority"):
        assert statuses[name] == "green", name
    assert statuses["decryptions/receipts-for-decryptions"] == "green"
