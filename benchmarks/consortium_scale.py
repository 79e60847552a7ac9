"""How the five-process consortium (key authority, aggregator, N banks over mutual TLS) scales with the banks' size.

For each size (customers per bank) the banks' tables are generated (``synthesize_banks``, Parquet; kept in
``--work-dir`` so a rerun of the same size does not regenerate them), a throw-away loopback consortium with
the baseline policy's CKKS parameters is written, every node is started as its own process and the
federation runs ``--rounds`` rounds. Reported per size, from the nodes' JSON logs and ``/proc``:

* seconds per round (the aggregator's ``round.applied`` ``seconds``: open -> applied);
* per phase, from the services' own timings: the banks' ``round.uploaded`` ``phases`` (download, evaluation,
  training, encryption, upload), the aggregator's ``round.applied`` ``phases`` (aggregation, decryption, server
  step) and its ``pseudo_graph.discovered`` ``seconds`` with the ``recall`` of the exact top-s the aggregator
  measures on ``--recall-sample`` rows (default 500); the time from the last bank's upload to
  ``round.applied``; the start-up (data loading, enrolment, union index);
* bytes on the wire per bank per round (``round.uploaded`` ``bytes``);
* the peak resident memory of every node process (``VmHWM`` of ``/proc/<pid>/status``, polled);
* the ratio of seconds per round between consecutive sizes against the ratio of the sizes.

The JSON is rewritten after every size (``"complete": false`` until the last), so a killed run keeps what
it measured.

    nice -n 5 .venv/bin/python benchmarks/consortium_scale.py --customers 20000,100000 --rounds 2 \\
        --output docs/results/consortium_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from fedgl_secure.consortium.config import load_consortium
from fedgl_secure.data.bank_synth import bank_name, synthesize_banks, synthetic_bank_schema
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import NodeProcess, start_node_process, stop_processes

NOTES = [
    "seconds_per_round: the aggregator's round.applied 'seconds' (round opened -> model applied).",
    "phases.bank: mean seconds per round of each bank's round.uploaded 'phases' (download of the broadcast, "
    "evaluation report, local training, CKKS encryption, upload); their sum is bank_round_seconds.",
    "phases.aggregator: mean seconds per round of the aggregator's round.applied 'phases' (aggregation: homomorphic "
    "sums, fusing the partial decryptions and decoding; decryption: the key authority's and t banks' partial "
    "decryptions as the aggregator waits for them; "
    "server_step: fusion, pseudo labels, pseudo graph, broadcast encoding and storing).",
    "phases.pseudo_graph: the aggregator's pseudo_graph.discovered 'seconds' (part of server_step), with its backend.",
    "phases.pseudo_graph_recall: the aggregator's pseudo_graph.discovered 'recall' (self_supervision.recall_sample = "
    "--recall-sample rows whose exact top-s it computes after the search, engine/pseudo_graph_recall.py), mean "
    "over the rounds; recall_ties counts a kept neighbour tying the s-th exact similarity as right (bank customers "
    "with the same features have the same embedding, so exact top-s lists are often one choice among ties); "
    "per round [recall, recall_ties] beside them.",
    "phases.after_last_upload_seconds: time from the last bank's round.uploaded to round.applied (log timestamps).",
    "startup_seconds: offsets from the start of the processes (node.started: after the imports; bank.data_loaded: "
    "tables read and graph built, its own 'seconds' in bank_data_read_seconds; bank.enrolled at the aggregator: "
    "pseudonyms received; index.built: union index; bank.ready; the first round.opened).",
    "the first round's seconds include the banks' start-up after the index (the round opens before the banks "
    "are ready), so seconds_per_round_steady (rounds after the first) is given as well.",
    "peak_rss_mib: VmHWM of /proc/<pid>/status of each node process, polled every 0.5 s (last value before exit).",
    "traffic: upload bytes per encrypted value (banks' round.uploaded bytes / values) and the threshold "
    "decryption's traffic from each party's own log — verification downloads (each receipted upload's c1, to the key "
    "authority and to every bank asked) and partial decryptions — per decrypted value and per applied round.",
]


def parse_value(text: str):
    """``--set`` values as the CLI reads them: JSON where it parses (numbers, booleans, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(experiment: dict, overrides: list[str]) -> dict:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects section.field=value, got {item!r}")
        *sections, leaf = key.split(".")
        table = experiment
        for section in sections:
            table = table.setdefault(section, {})
        table[leaf] = parse_value(value)
    return experiment


def read_events(path: Path) -> list[dict]:
    events = []
    if not path.exists():
        return events
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return events


def event_time(event: dict) -> float | None:
    stamp = event.get("timestamp") or event.get("time") or event.get("ts")
    if stamp is None:
        return None
    if isinstance(stamp, int | float):
        return float(stamp)
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def vm_status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process in kB ({} once it is gone)."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    name, value = line.split(":", 1)
                    values[name] = int(value.split()[0])
    except OSError:
        pass
    return values


def repeated_failure(processes: list[NodeProcess], times: int = 3) -> str | None:
    """A bank that logged ``round.failed`` ``times`` times (it retries forever: the round would only time out)."""
    for node in processes:
        if node.role.value != "bank":
            continue
        failed = [e for e in read_events(node.log_path) if e.get("event") == "round.failed"]
        if len(failed) >= times:
            return f"{node.name}: round.failed x{len(failed)}: {failed[-1].get('error')}"
    return None


def mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def mean_phases(phases: list[dict | None]) -> dict[str, float | None]:
    """Mean seconds per phase over rounds (a phase missing from a round counts as absent, not 0)."""
    names = list(dict.fromkeys(name for entry in phases if entry for name in entry))
    return {name: mean([float(entry[name]) for entry in phases if entry and name in entry]) for name in names}


def tail(path: Path, chars: int = 1500) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def he_parameters(args) -> HEParameters:
    """The baseline policy's CKKS parameters, or them with another scale (``--he-scale-bits``)."""
    if args.he_scale_bits is None:
        return HEParameters()
    return HEParameters(global_scale_bits=args.he_scale_bits)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # a killed run (SIGTERM) stops its nodes and writes what it measured


def run_size(args, customers: int, work_dir: Path) -> dict:
    banks = tuple(bank_name(i) for i in range(args.banks))
    data_dir = work_dir / f"data-{args.banks}x{customers}-seed{args.seed}"
    started = time.monotonic()
    synth = synthesize_banks(data_dir, banks=args.banks, customers=customers, seed=args.seed, fmt="parquet")
    synth_seconds = round(time.monotonic() - started, 2)
    print(f"[{customers}] data: {'reused' if synth.already_there else f'generated in {synth_seconds} s'}", flush=True)
    experiment = {
        "method": "fedgl",
        "seed": args.seed,
        "device": "cpu",
        "federation": {"max_rounds": args.rounds, "patience": args.rounds + 10},
    }
    recall = [f"self_supervision.recall_sample={args.recall_sample}"] if args.recall_sample else []
    experiment = apply_overrides(experiment, [*recall, *args.set])
    root = work_dir / f"consortium-{customers}"
    shutil.rmtree(root, ignore_errors=True)
    write_loopback_consortium(
        root,
        banks=banks,
        experiment=experiment,
        he=he_parameters(args),
        upload_seconds=args.upload_seconds,
        federation=f"scale-{customers}",
        schema=synthetic_bank_schema().model_dump(mode="json", exclude_none=True),
        bank_data=synth.files_declarations(),
    )
    consortium = load_consortium(root / "consortium.toml")
    logs = consortium.state_root / "logs"
    env = {name: os.environ.get(name) or os.urandom(32).hex() for name in ("FEDGL_KA_SECRET", "FEDGL_BANK_SECRET")}
    order = [consortium.key_authority, consortium.aggregator, *consortium.banks]
    processes: list[NodeProcess] = []
    peak_kb: dict[str, int] = {}
    rss_kb: dict[str, int] = {}
    outcome = "finished"
    wall_start = time.time()
    started = time.monotonic()
    aggregator_log = logs / f"{consortium.aggregator.name}.log"
    next_report = started + 30
    try:
        for node in order:
            process = start_node_process(root / f"{node.name}.toml", logs / f"{node.name}.log", env=env)
            processes.append(NodeProcess(node.name, node.role, logs / f"{node.name}.log", process))
        while True:
            for node in processes:
                status = vm_status(node.process.pid)
                if "VmHWM" in status:
                    peak_kb[node.name] = max(peak_kb.get(node.name, 0), status["VmHWM"])
                    rss_kb[node.name] = status.get("VmRSS", 0)
            events = read_events(aggregator_log) if aggregator_log.exists() else []
            finished = any(e.get("event") == "rounds.finished" for e in events)
            dead = [n for n in processes if not n.alive() and n.role.value != "bank"]
            if dead:
                outcome = f"{dead[0].name} exited with code {dead[0].process.returncode}"
                break
            if finished and all(not n.alive() for n in processes if n.role.value == "bank"):
                break
            if (failing := repeated_failure(processes)) is not None:
                outcome = failing
                break
            if time.monotonic() - started > args.timeout:
                outcome = f"timed out after {args.timeout:.0f} s"
                break
            if time.monotonic() > next_report:
                applied = sum(e.get("event") == "round.applied" for e in events)
                rss = ", ".join(f"{k}={v // 1024}" for k, v in rss_kb.items())
                last = events[-1].get("event") if events else None
                print(
                    f"[{customers}] {time.monotonic() - started:.0f} s: {applied} rounds applied, "
                    f"aggregator's last event {last}; RSS MiB {rss}",
                    flush=True,
                )
                next_report = time.monotonic() + 30
            time.sleep(0.5)
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        wall_seconds = round(time.monotonic() - started, 2)
        stop_processes(list(reversed(processes)))
    result = summarise(customers, consortium, logs, outcome, wall_start, wall_seconds, peak_kb, synth)
    result["data"] = {
        "dir": str(data_dir),
        "generated_seconds": None if synth.already_there else synth_seconds,
        "customers_per_bank": [b.customers for b in synth.banks],
        "transactions_per_bank": [b.transactions for b in synth.banks],
        "persons": synth.persons,
        "shared_persons": synth.shared_persons,
    }
    result["experiment"] = experiment
    result["exit_codes"] = {n.name: n.process.returncode for n in processes}
    if outcome != "finished":
        result["log_tails"] = {n.name: tail(n.log_path) for n in processes}
    return result


def summarise(customers, consortium, logs, outcome, wall_start, wall_seconds, peak_kb, synth) -> dict:
    bank_names = [b.name for b in consortium.banks]
    aggregator = read_events(logs / f"{consortium.aggregator.name}.log")
    bank_events = {b: read_events(logs / f"{b}.log") for b in bank_names}
    applied = [e for e in aggregator if e.get("event") == "round.applied"]
    discovered = [e for e in aggregator if e.get("event") == "pseudo_graph.discovered"]
    round_seconds = [float(e["seconds"]) for e in applied if e.get("seconds") is not None]
    uploaded = {b: [e for e in ev if e.get("event") == "round.uploaded"] for b, ev in bank_events.items()}
    bytes_per_bank = {b: mean([float(e["bytes"]) for e in ups if "bytes" in e]) for b, ups in uploaded.items()}
    bank_seconds = {b: mean([float(e["seconds"]) for e in ups if "seconds" in e]) for b, ups in uploaded.items()}
    # after the last upload of a round: the round of an upload is in its bound 'round' field
    after_last = []
    for event in applied:
        round_number, applied_at = event.get("round"), event_time(event)
        stamps = [
            event_time(e) for ups in uploaded.values() for e in ups if e.get("round") == round_number and event_time(e)
        ]
        if applied_at is not None and stamps:
            after_last.append(round(applied_at - max(stamps), 3))

    def first_time(events: list[dict], name: str) -> float | None:
        stamp = next((event_time(e) for e in events if e.get("event") == name), None)
        return None if stamp is None else round(stamp - wall_start, 2)

    bank_ready = {b: first_time(ev, "bank.ready") for b, ev in bank_events.items()}
    data_loaded = {b: first_time(ev, "bank.data_loaded") for b, ev in bank_events.items()}
    index = next((e for e in aggregator if e.get("event") == "index.built"), {})
    return {
        "customers_per_bank": customers,
        "outcome": outcome,
        "rounds_applied": len(applied),
        "seconds_per_round": mean(round_seconds),
        "seconds_per_round_steady": mean(round_seconds[1:]),
        "round_seconds": round_seconds,
        "wall_seconds": wall_seconds,
        "num_global_nodes": index.get("num_global_nodes"),
        "startup_seconds": {
            "node_started": {
                name: first_time(events, "node.started")
                for name, events in {consortium.aggregator.name: aggregator, **bank_events}.items()
            },
            "bank_data_loaded": data_loaded,
            "bank_data_read_seconds": {
                b: next((e.get("seconds") for e in ev if e.get("event") == "bank.data_loaded"), None)
                for b, ev in bank_events.items()
            },
            "enrolled": {
                e.get("bank"): round(event_time(e) - wall_start, 2)
                for e in aggregator
                if e.get("event") == "bank.enrolled" and event_time(e)
            },
            "index_built": first_time(aggregator, "index.built"),
            "bank_ready": bank_ready,
            "first_round_opened": first_time(aggregator, "round.opened"),
        },
        "phases": {
            "bank_round_seconds": bank_seconds,
            "bank": {b: mean_phases([e.get("phases") for e in ups]) for b, ups in uploaded.items()},
            "aggregator": mean_phases([e.get("phases") for e in applied]),
            "pseudo_graph": mean([float(e["seconds"]) for e in discovered if "seconds" in e]),
            "pseudo_graph_backend": sorted({str(e.get("backend")) for e in discovered}),
            "pseudo_graph_recall": mean([float(e["recall"]) for e in discovered if e.get("recall") is not None]),
            "pseudo_graph_recall_ties": mean(
                [float(e["recall_ties"]) for e in discovered if e.get("recall_ties") is not None]
            ),
            "pseudo_graph_recall_per_round": [[e.get("recall"), e.get("recall_ties")] for e in discovered],
            "after_last_upload_seconds": after_last,
        },
        "bytes_per_bank_per_round": bytes_per_bank,
        "traffic": traffic(aggregator, uploaded, bank_events, len(applied)),
        "peak_rss_mib": {name: round(kb / 1024, 1) for name, kb in peak_kb.items()},
        "events_seen": {
            name: sorted({e.get("event") for e in events if e.get("event")})
            for name, events in {consortium.aggregator.name: aggregator, **bank_events}.items()
        },
    }


def traffic(aggregator: list[dict], uploaded: dict[str, list[dict]], bank_events: dict, rounds: int) -> dict:
    """The issue-27 split, from each party's own log: upload bytes per encrypted value (banks' ``round.uploaded``),
    and the threshold decryption's traffic — the verification downloads (every receipted upload's c1, to the key
    authority and to each bank asked, refusals included) and the partial decryptions sent back — per decrypted
    value and per applied round (aggregator's ``sum.decrypted``, banks' ``decryption.partial_sent`` /
    ``decryption.refusal_sent``)."""
    upload_bytes = sum(float(e.get("bytes", 0)) for ups in uploaded.values() for e in ups)
    upload_values = sum(float(e.get("values", 0)) for ups in uploaded.values() for e in ups)
    sums = [e for e in aggregator if e.get("event") == "sum.decrypted"]
    answers = [
        e
        for events in bank_events.values()
        for e in events
        if e.get("event") in ("decryption.partial_sent", "decryption.refusal_sent")
    ]
    verification = sum(e.get("authority_c1_bytes", 0) for e in sums) + sum(e.get("c1_bytes", 0) for e in answers)
    partial = sum(e.get("authority_partial_bytes", 0) for e in sums) + sum(e.get("partial_bytes", 0) for e in answers)
    decrypted = sum(e.get("values", 0) for e in sums)
    return {
        "upload_bytes_per_value": round(upload_bytes / upload_values, 3) if upload_values else None,
        "upload_bytes_per_round": round(upload_bytes / rounds) if rounds else None,
        "decryption_verification_bytes": verification,
        "decryption_partial_bytes": partial,
        "decrypted_values": decrypted,
        "decryption_bytes_per_decrypted_value": round((verification + partial) / decrypted, 3) if decrypted else None,
        "decryption_bytes_per_round": round((verification + partial) / rounds) if rounds else None,
        "partial_decryptions_by_banks": sum(1 for e in answers if e.get("event") == "decryption.partial_sent"),
    }


def scaling(sizes: list[dict]) -> list[dict]:
    ratios = []
    done = [s for s in sizes if s.get("seconds_per_round")]
    for small, large in zip(done, done[1:], strict=False):
        size_ratio = large["customers_per_bank"] / small["customers_per_bank"]
        time_ratio = large["seconds_per_round"] / small["seconds_per_round"]
        ratios.append(
            {
                "from": small["customers_per_bank"],
                "to": large["customers_per_bank"],
                "size_ratio": round(size_ratio, 3),
                "seconds_per_round_ratio": round(time_ratio, 3),
                "time_ratio_over_size_ratio": round(time_ratio / size_ratio, 3),
            }
        )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", default="20000,100000,1000000", help="customers per bank, comma separated")
    parser.add_argument("--banks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument(
        "--recall-sample", type=int, default=500, help="rows the pseudo graph's recall is checked on (0: off)"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="generated data and consortia (default: temp)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per size before giving up")
    parser.add_argument("--upload-seconds", type=float, default=1800.0, help="the policy's upload deadline")
    parser.add_argument("--he-scale-bits", type=int, default=None, help="CKKS scale 2^bits (default: baseline)")
    parser.add_argument("--append", action="store_true", help="keep an existing --output's runs (earlier_runs)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.customers.split(",") if s.strip()]
    work_dir = args.work_dir or Path(tempfile.gettempdir()) / "fedgl-consortium-scale"
    work_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminated)
    he = he_parameters(args)
    earlier = []
    if args.append and args.output.exists():
        previous = json.loads(args.output.read_text())
        earlier = [*previous.pop("earlier_runs", []), previous]
    document = {
        "benchmark": "consortium_scale",
        "complete": False,
        "command": " ".join(sys.argv),
        "banks": args.banks,
        "rounds": args.rounds,
        "he": {
            "poly_modulus_degree": he.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(he.coeff_mod_bit_sizes),
            "global_scale_bits": he.global_scale_bits,
        },
        "cores": os.cpu_count(),
        "machine": platform.platform(),
        "notes": NOTES,
        "sizes": [],
        "scaling": [],
        "earlier_runs": earlier,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for customers in sizes:
        result = run_size(args, customers, work_dir)
        interrupted = result["outcome"] == "interrupted"
        document["sizes"].append(result)
        document["scaling"] = scaling(document["sizes"])
        args.output.write_text(json.dumps(document, indent=2) + "\n")
        brief = {k: result.get(k) for k in ("customers_per_bank", "outcome", "seconds_per_round", "round_seconds")}
        print(json.dumps({**brief, "phases": result["phases"], "bytes": result["bytes_per_bank_per_round"]}))
        print(json.dumps({"startup": result["startup_seconds"], "peak_rss_mib": result["peak_rss_mib"]}), flush=True)
        if interrupted:
            raise SystemExit(130)
    document["complete"] = True
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document["scaling"]))


if __name__ == "__main__":
    main()
