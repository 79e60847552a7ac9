"""A hundred generated banks simulated with each executor, the same command but for ``--executor``.

The banks' tables are generated once (``synthesize_banks``, Parquet, kept in ``--work-dir``), a consortium file
naming them is written (``write_loopback_consortium``; its services are never started), and then, for each executor,

    fedgl-secure simulate --consortium <dir>/consortium.toml --rounds R --no-progress --output <run>.json \\
        --executor {in-process,ray} [--set ...]

runs as a child process while this script polls ``/proc`` every 0.5 s for the child and every process below it:
the driver (the ``simulate`` process), the Ray actors holding the banks (``ray::BankShard``), and Ray's own
processes (GCS, raylet, agents, idle workers). Reported per executor:

* seconds per round (the run record's ``history[].seconds``, the driver's own clock from a round's start to its
  evaluation) and the command's wall seconds (start-up, data loading and Ray's start included);
* CPU seconds of the whole process tree (``utime + stime`` of every process, the last value seen before it ended),
  the fairer comparison on a shared 2-core host;
* peak resident memory: the driver's ``VmHWM``, each actor's ``VmHWM`` and their sum, and the peak of the tree's
  summed ``VmRSS`` (everything this run held at one moment);
* whether the two run records are equal field for field, wall-clock fields aside (``run_records.first_difference``).

Ratios are Ray's figure over the in-process one.

    nice -n 19 .venv/bin/python benchmarks/ray_executor.py --banks 100 --customers 3000 --rounds 3 \\
        --output docs/results/ray_executor_100_banks.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_records import first_difference

from fedgl_secure.data.bank_synth import bank_name, synthesize_banks, synthetic_bank_schema
from fedgl_secure.services.loopback import write_loopback_consortium

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
EXECUTORS = ("in-process", "ray")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, from each process's parent in ``/proc/<pid>/stat``."""
    below: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        below.setdefault(parent, []).append(int(entry.name))
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += below.get(pid, [])
    return seen


def sample(pid: int) -> dict | None:
    """``VmHWM`` and ``VmRSS`` (KiB), CPU seconds and the command line of ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    memory = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            memory[name] = int(value.split()[0])
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return {"hwm": memory.get("VmHWM", 0), "rss": memory.get("VmRSS", 0), "cpu": cpu, "cmdline": cmdline}


def role(cmdline: str, pid: int, driver: int) -> str:
    if pid == driver:
        return "driver"
    if cmdline.startswith("ray::BankShard"):
        return "actor"
    return "ray_system"


def run_executor(args, consortium: Path, executor: str, out_dir: Path) -> dict:
    output = out_dir / f"{executor}.json"
    command = [sys.executable, "-m", "fedgl_secure", "simulate", "--consortium", str(consortium)]
    command += ["--rounds", str(args.rounds), "--no-progress", "--output", str(output), "--executor", executor]
    for item in args.set:
        command += ["--set", item]
    log_path = out_dir / f"{executor}.log"
    started = time.monotonic()
    seen: dict[int, dict] = {}  # pid -> last sample, with the peak summed RSS kept apart
    peak_tree_rss = 0
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            total = 0
            for pid in process_tree(process.pid):
                now = sample(pid)
                if now is None:
                    continue
                previous = seen.get(pid)
                if previous is not None and previous["cmdline"].startswith("ray::") and not now["cmdline"]:
                    now["cmdline"] = previous["cmdline"]
                seen[pid] = {**now, "hwm": max(now["hwm"], previous["hwm"] if previous else 0)}
                total += now["rss"]
            peak_tree_rss = max(peak_tree_rss, total)
            if time.monotonic() - started > args.timeout:
                process.kill()
                break
            time.sleep(0.5)
    wall = time.monotonic() - started
    outcome = "finished" if process.returncode == 0 else f"exit code {process.returncode}"
    result: dict = {"executor": executor, "command": " ".join(command[1:]), "outcome": outcome}
    result["wall_seconds"] = round(wall, 2)
    by_role: dict[str, list[dict]] = {"driver": [], "actor": [], "ray_system": []}
    for pid, last in seen.items():
        by_role[role(last["cmdline"], pid, process.pid)].append(last)
    result["cpu_seconds"] = {name: round(sum(p["cpu"] for p in procs), 1) for name, procs in by_role.items()}
    result["cpu_seconds"]["total"] = round(sum(result["cpu_seconds"].values()), 1)
    actors = by_role["actor"]
    result["peak_rss_mib"] = {
        "driver": round(max((p["hwm"] for p in by_role["driver"]), default=0) / 1024, 1),
        "actors": [round(p["hwm"] / 1024, 1) for p in actors],
        "actors_sum": round(sum(p["hwm"] for p in actors) / 1024, 1),
        "ray_system_sum": round(sum(p["hwm"] for p in by_role["ray_system"]) / 1024, 1),
        "tree_at_once": round(peak_tree_rss / 1024, 1),
    }
    result["processes"] = {name: len(procs) for name, procs in by_role.items()}
    if process.returncode != 0:
        result["log_tail"] = log_path.read_text()[-3000:]
        return result
    record = json.loads(output.read_text())
    seconds = [h["seconds"] for h in record["history"]]
    result["round_seconds"] = [round(s, 2) for s in seconds]
    result["seconds_per_round"] = round(statistics.mean(seconds), 2)
    result["seconds_per_round_after_first"] = round(statistics.mean(seconds[1:]), 2) if len(seconds) > 1 else None
    result["record"] = str(output)
    result["global_test_metrics"] = record["global_test_metrics"]
    result["num_clients"], result["num_global_nodes"] = record["num_clients"], record["num_global_nodes"]
    return result


def ratio(ray: float | None, in_process: float | None) -> float | None:
    return None if not ray or not in_process else round(ray / in_process, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--banks", type=int, default=100)
    parser.add_argument("--customers", type=int, default=3000, help="customers per bank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="to simulate")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "fedgl-ray-executor")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds per executor before giving up")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    work = args.work_dir
    data_dir = work / f"data-{args.banks}x{args.customers}-seed{args.seed}"
    started = time.monotonic()
    synth = synthesize_banks(data_dir, banks=args.banks, customers=args.customers, seed=args.seed, fmt="parquet")
    print(f"data: {'reused' if synth.already_there else 'generated'} in {time.monotonic() - started:.0f} s", flush=True)
    banks = tuple(bank_name(i) for i in range(args.banks))
    root = work / f"consortium-{args.banks}x{args.customers}"
    if not (root / "consortium.toml").exists():  # provisioning a hundred banks' keys takes a while: kept
        write_loopback_consortium(
            root,
            banks=banks,
            experiment={"method": "fedgl", "seed": args.seed, "device": "cpu"},
            federation=f"ray-executor-{args.banks}",
            schema=synthetic_bank_schema().model_dump(mode="json", exclude_none=True),
            bank_data=synth.files_declarations(),
        )
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    document: dict = {
        "benchmark": "ray_executor",
        "command": " ".join(sys.argv),
        "banks": args.banks,
        "customers_per_bank": args.customers,
        "persons": synth.persons,
        "shared_persons": synth.shared_persons,
        "rounds": args.rounds,
        "set": args.set,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "machine": platform.platform(),
        "notes": __doc__.split("\n\n")[1:3],
        "executors": {},
    }
    for executor in EXECUTORS:
        result = run_executor(args, root / "consortium.toml", executor, runs)
        document["executors"][executor] = result
        print(json.dumps({k: v for k, v in result.items() if k not in ("log_tail",)}), flush=True)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(document, indent=2) + "\n")
    local, ray_run = document["executors"]["in-process"], document["executors"]["ray"]
    if "record" in local and "record" in ray_run:
        difference = first_difference(
            json.loads(Path(local["record"]).read_text()), json.loads(Path(ray_run["record"]).read_text())
        )
        document["records_equal"] = difference is None
        document["first_difference"] = difference
    document["ray_over_in_process"] = {
        "seconds_per_round": ratio(ray_run.get("seconds_per_round"), local.get("seconds_per_round")),
        "wall_seconds": ratio(ray_run.get("wall_seconds"), local.get("wall_seconds")),
        "cpu_seconds_total": ratio(ray_run["cpu_seconds"]["total"], local["cpu_seconds"]["total"]),
        "driver_peak_rss": ratio(ray_run["peak_rss_mib"]["driver"], local["peak_rss_mib"]["driver"]),
        "tree_peak_rss": ratio(ray_run["peak_rss_mib"]["tree_at_once"], local["peak_rss_mib"]["tree_at_once"]),
    }
    document["load_average_at_end"] = os.getloadavg()
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps({k: document.get(k) for k in ("records_equal", "first_difference", "ray_over_in_process")}))


if __name__ == "__main__":
    main()
