"""Soak the three services with schemathesis while a federation runs, then check a round still completes.

A loopback consortium (key authority, aggregator, five synthetic banks, each its own process over mutual
TLS, the default 128-bit CKKS parameters, threshold decryption with t = 2, quorum 3) runs rounds for the whole
soak. Once round 1 has been applied, seeded ``st run --checks all`` passes go round the services until
``--requests`` requests have been sent:

* the key authority as the **aggregator** (the only role that may open rounds and ask for decryptions),
  and as bank-a (every refusal of the role check; a bank's decryption attempts go to the audit log);
* the aggregator as **bank-d** (every bank-only route: enrol, index, round, models, uploads, reports,
  withdraw) — bank-d is a real participant, so this is a bank whose own certificate sends garbage (and
  withdraws it, a schema-valid request a bank may make);
* bank-a's service as the aggregator (its health is all a bank serves).

The JSON says how many requests went out, the responses by status, the 5xx count, crashes (a node process
that died, or a ``request.crashed`` line in a log), every failed schemathesis check, whether rounds kept
being applied after the fuzzing stopped (two more rounds: the first may have been open during the soak),
and whether the key authority's audit chain (every refused request appends to it) still verifies.

    python benchmarks/fuzz_services.py --requests 10000 --output docs/results/fuzz_services.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path

import schemathesis

from fedgl_secure.consortium.config import PkiLayout, load_consortium
from fedgl_secure.services.fuzzing import FuzzRun, run_schemathesis
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import NodeProcess, start_node_process, stop_processes
from fedgl_secure.services.tls import make_http_client

TARGETS = (
    ("key-authority", "aggregator"),
    ("key-authority", "bank-a"),
    ("aggregator", "bank-d"),
    ("bank-a", "aggregator"),
)
BANKS = ("bank-a", "bank-b", "bank-c", "bank-d", "bank-e")
"""Five banks, quorum 3: the fuzzer's schema-valid withdrawal takes bank-d out for good, and one more bank may
fail its rounds (a bug of its own) without stopping the federation, which the JSON then shows."""
ROUNDS_AFTER = 2  # rounds that must be applied after the soak
UPLOAD_SECONDS = 20.0  # a round with a silent participant is applied without it after this long
POLICY_EXTRA: dict = {}
"""The default, packed policy. (Until the weights were centred on W̄, docs/protocol.md §6.9, this was
``packing = "none"``: the synthetic banks' packed weights left [-2.25, 2.25] after ~35 rounds of the soak and
every bank refused to upload.)"""


def rounds_applied(consortium, layout) -> tuple[int, dict]:
    with make_http_client(layout, "key-authority", consortium.aggregator.url, timeout=10) as http:
        status = http.get("/v1/status").json()
    return len(status.get("rounds") or []), status


def wait_for_rounds(consortium, layout, nodes: list[NodeProcess], at_least: int, timeout: float) -> tuple[bool, dict]:
    deadline, status = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        if any(not node.alive() for node in nodes):
            return False, status
        try:
            applied, status = rounds_applied(consortium, layout)
        except Exception as error:  # noqa: BLE001 - a slow answer under load is retried until the deadline
            status = {"error": repr(error)}
            applied = 0
        if applied >= at_least:
            return True, status
        time.sleep(1.0)
    return False, status


def audit_report(consortium, layout) -> dict:
    with make_http_client(layout, "aggregator", consortium.key_authority.url, timeout=30) as http:
        return http.get("/v1/audit/verify").json()


def bank_round_failures(nodes: list[NodeProcess]) -> dict[str, dict]:
    """Rounds a bank could not take part in (``round.failed`` in its log): how often, and the distinct reasons."""
    failures = {}
    for node in nodes:
        if not node.log_path.exists():
            continue
        errors = [
            json.loads(line).get("error", "")
            for line in node.log_path.read_text(errors="replace").splitlines()
            if line.startswith("{") and '"round.failed"' in line
        ]
        if errors:
            failures[node.name] = {"count": len(errors), "reasons": sorted(set(errors))[:5]}
    return failures


def crashed_requests(nodes: list[NodeProcess]) -> int:
    return sum(
        node.log_path.read_text(errors="replace").count('"request.crashed"') for node in nodes if node.log_path.exists()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000, help="stop fuzzing once this many were sent")
    parser.add_argument("--max-examples", type=int, default=100, help="per operation and schemathesis pass")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first pass (each next pass adds one)")
    parser.add_argument(
        "--max-minutes", type=float, default=60.0, help="stop fuzzing after this long, whatever the count"
    )
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    result: dict = {
        "requested": args.requests,
        "schemathesis": schemathesis.__version__,
        "checks": "all",
        "policy_extra": POLICY_EXTRA,
    }
    with tempfile.TemporaryDirectory(prefix="fedgl-fuzz-") as root:
        experiment = {
            "dataset": "synthetic",
            "method": "fedgl",
            "seed": 0,
            "device": "cpu",
            # enough rounds that the federation outlives the soak
            "federation": {"proportions": [0.5, 0.6, 0.7, 0.6, 0.5], "max_rounds": 100_000, "patience": 100_000},
        }
        path = write_loopback_consortium(
            Path(root),
            banks=BANKS,
            experiment=experiment,
            upload_seconds=UPLOAD_SECONDS,
            federation="fuzz-soak",
            policy_extra=POLICY_EXTRA,
        )
        consortium = load_consortium(path)
        layout = PkiLayout(consortium.pki_dir)
        env = {"FEDGL_KA_SECRET": os.urandom(32).hex(), "FEDGL_BANK_SECRET": os.urandom(32).hex()}
        nodes = []
        try:
            for node in (consortium.key_authority, consortium.aggregator, *consortium.banks):
                log = consortium.state_root / "logs" / f"{node.name}.log"
                nodes.append(
                    NodeProcess(
                        node.name, node.role, log, start_node_process(Path(root) / f"{node.name}.toml", log, env)
                    )
                )
            ok, status = wait_for_rounds(consortium, layout, nodes, 1, timeout=600)
            if not ok:
                raise SystemExit(f"the federation applied no round before the soak: {json.dumps(status)[:2000]}")
            urls = {node.name: node.url for node in consortium.nodes}
            runs: list[FuzzRun] = []
            fuzz_started, seed = time.monotonic(), args.seed
            requests = 0
            while requests < args.requests and time.monotonic() - fuzz_started < args.max_minutes * 60:
                for service, as_node in TARGETS:
                    report = Path(root) / f"report-{seed}-{service}.ndjson"
                    run = run_schemathesis(
                        service,
                        urls[service],
                        layout,
                        as_node,
                        seed=seed,
                        max_examples=args.max_examples,
                        report=report,
                    )
                    report.unlink(missing_ok=True)  # the response bodies add up (a public context is ~0.3 MB)
                    runs.append(run)
                    requests += run.requests
                    print(
                        f"seed {seed} {service} as {as_node}: {run.requests} requests, "
                        f"{dict(sorted(run.statuses.items()))}, {len(run.failures)} failed checks "
                        f"(total {requests}, {time.monotonic() - fuzz_started:.0f} s)",
                        flush=True,
                    )
                seed += 1
            fuzz_seconds = time.monotonic() - fuzz_started
            alive_after_fuzz = {node.name: node.alive() for node in nodes}
            before, _ = rounds_applied(consortium, layout) if all(alive_after_fuzz.values()) else (0, {})
            round_ok, status = wait_for_rounds(consortium, layout, nodes, before + ROUNDS_AFTER, timeout=600)
            statuses: Counter[int] = Counter()
            for run in runs:
                statuses.update(run.statuses)
            failures = [failure | {"service": run.service} for run in runs for failure in run.failures]
            result |= {
                "requests": requests,
                "responses_by_status": {str(code): count for code, count in sorted(statuses.items())},
                "server_errors_5xx": sum(count for code, count in statuses.items() if code >= 500),
                "crashes": [name for name, alive in alive_after_fuzz.items() if not alive],
                "crashed_requests_logged": crashed_requests(nodes),
                "conformance_failures": failures,
                "schemathesis_errors": [error for run in runs for error in run.errors],
                "passes": len(runs),
                "seeds": [args.seed, seed - 1],
                "max_examples": args.max_examples,
                "per_target": {
                    f"{service} as {as_node}": {
                        "requests": sum(r.requests for r in mine),
                        "statuses": dict(sorted(sum((r.statuses for r in mine), Counter()).items())),
                    }
                    for service, as_node in TARGETS
                    for mine in [[r for r in runs if (r.service, r.as_node) == (service, as_node)]]
                },
                "fuzz_seconds": round(fuzz_seconds, 1),
                "rounds_applied_before_check": before,
                "round_completed_after": round_ok,
                "rounds_applied_at_end": len(status.get("rounds") or []),
                "withdrawn": status.get("withdrawn"),
                "audit_chain": audit_report(consortium, layout),
                "bank_round_failures": bank_round_failures(nodes),
            }
        finally:
            stop_processes(list(reversed(nodes)), grace=10.0)
    result |= {
        "wall_seconds": round(time.monotonic() - started, 1),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_target"}, indent=2))


if __name__ == "__main__":
    main()
