"""Run records before and after a change that must not change behaviour (issue 28's acceptance: a redesign of where
code lives, "proven by identical results").

    python benchmarks/run_records.py record --output-dir runs/records-before     # on the commit before the change
    python benchmarks/run_records.py record --output-dir runs/records-after      # on the commit after it
    python benchmarks/run_records.py compare runs/records-before runs/records-after --output runs/records.json

Run ``record`` from the checkout whose code is recorded (a ``git worktree`` of the earlier commit for "before"): each
run is ``python -m fedgl_secure`` started in that checkout's directory, which Python puts first on ``sys.path``,
ahead of ``PYTHONPATH`` and of the installed package. Record both sides on one host: torch's CPU kernels may take
other vector paths on another CPU, and FedGL's and FGCL's records then differ from the sixth digit of a metric on
(docs/results/run_records_host_check.json).

``record`` runs ``fedgl-secure simulate`` (one process per run, as a user would) for Cora seeds 0–2 under each of
the configurations of :data:`CONFIGURATIONS` — FedGL, FGCL, GraphFL, Fed²GNN, and FedGL through the secure path
(``--secure`` under the HE-only ``policies/baseline.toml``) — and keeps each run record as ``<name>-seed<k>.json``;
it skips a record that is already there (resumable). The secure run is recordable because, without DP, its only
randomness (the CKKS encryption and decryption-flooding noise) stays within the packing's guard bits and is removed
when the decrypted registers are rounded to the packed integers (``crypto.packing.unpack``): two runs of one commit
give equal records. A secure run under a DP policy is not among them: its noise
(edges, flooding, the channels' Gaussians) comes from the OS CSPRNG, so two runs of one commit differ
(``docs/results/run_records_issue28_moves.json``) and equality could never hold.

``compare`` checks that both directories hold the same records and that each pair is equal in every field but the
wall-clock ones (:data:`TIMING_FIELDS`, at any depth), number for number (NaN equals NaN); it writes the verdict per
record as JSON and exits non-zero on any difference, naming the first differing field of each record.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
CONFIGURATIONS: dict[str, list[str]] = {
    "fedgl": ["--method", "fedgl"],
    "fgcl": ["--method", "fgcl"],
    "graphfl": ["--method", "graphfl"],
    # Fed²GNN needs disjoint clients: the Louvain partition into as many clients as the other runs have
    "fed2gnn": ["--method", "fed2gnn", "--set", "federation.partition=louvain", "--set", "federation.num_clients=6"],
    # the secure path: CKKS uploads, receipts, the key authority's checks and the decryption of the sums
    "fedgl-secure": ["--method", "fedgl", "--secure"],
}
TIMING_FIELDS = frozenset({"wall_seconds", "seconds"})


def record(output_dir: Path, rounds: int | None, data_root: str | None, names: list[str] | None = None) -> None:
    """Run every configuration (or those ``names``) and seed not recorded yet, printing the seconds each took."""
    unknown = sorted(set(names or ()) - CONFIGURATIONS.keys())
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGURATIONS)}")
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, flags in CONFIGURATIONS.items():
        if names and name not in names:
            continue
        for seed in SEEDS:
            path = output_dir / f"{name}-seed{seed}.json"
            if path.exists():
                continue
            command = [sys.executable, "-m", "fedgl_secure", "simulate", "--dataset", "cora", "--seed", str(seed)]
            command += [*flags, "--device", "cpu", "--no-progress", "--output", str(path)]
            if rounds is not None:
                command += ["--rounds", str(rounds)]
            if data_root is not None:
                command += ["--data-root", data_root]
            started = time.perf_counter()
            subprocess.run(command, check=True, cwd=REPO)
            print(f"{path.name}: {time.perf_counter() - started:.1f} s", flush=True)


def first_difference(before: object, after: object, where: str = "", added: frozenset[str] = frozenset()) -> str | None:
    """The path of the first field where two run records differ (timing fields skipped), or None.

    ``added``: paths (``.config.training.batch_size``) of settings the later commit introduced; a record of it may
    hold them where the earlier one does not (a new option, whose default the run record shows)."""
    if isinstance(before, dict) and isinstance(after, dict):
        new_keys = {key for key in after.keys() - before.keys() if f"{where}.{key}" in added}
        if before.keys() != after.keys() - new_keys:
            return f"{where or '.'}: keys {sorted(before.keys() ^ (after.keys() - new_keys))} on one side only"
        for key in before:
            if key in TIMING_FIELDS:
                continue
            found = first_difference(before[key], after[key], f"{where}.{key}", added)
            if found:
                return found
        return None
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return f"{where}: {len(before)} entries against {len(after)}"
        for index, (left, right) in enumerate(zip(before, after, strict=True)):
            found = first_difference(left, right, f"{where}[{index}]", added)
            if found:
                return found
        return None
    if isinstance(before, float) and isinstance(after, float) and math.isnan(before) and math.isnan(after):
        return None
    if before != after or type(before) is not type(after):
        return f"{where}: {before!r} against {after!r}"
    return None


def compare(before_dir: Path, after_dir: Path, added: frozenset[str] = frozenset()) -> dict:
    """Record by record: equal, or the first difference; records present on one side only. ``added``: settings new
    in the later commit (:func:`first_difference`)."""
    before = {path.name for path in before_dir.glob("*.json")}
    after = {path.name for path in after_dir.glob("*.json")}
    verdicts = {}
    for name in sorted(before & after):
        left = json.loads((before_dir / name).read_text())
        right = json.loads((after_dir / name).read_text())
        difference = first_difference(left, right, added=added)
        verdicts[name] = "equal" if difference is None else f"differs at {difference}"
    return {
        "before": str(before_dir),
        "after": str(after_dir),
        "ignored_fields": sorted(TIMING_FIELDS),
        "added_settings": sorted(added),
        "records": verdicts,
        "only_before": sorted(before - after),
        "only_after": sorted(after - before),
        "all_equal": bool(verdicts) and all(v == "equal" for v in verdicts.values()) and before == after,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("record", help="run every configuration and seed; keep the run records")
    make.add_argument("--output-dir", type=Path, required=True)
    make.add_argument("--rounds", type=int, default=None, help="at most this many rounds per run (default: 300)")
    make.add_argument("--data-root", default=None, help="directory holding cora/raw/ ($FEDGL_DATA)")
    make.add_argument("--configs", default=None, help="comma-separated configurations to record (default: all)")
    check = commands.add_parser("compare", help="compare two directories of run records")
    check.add_argument("before", type=Path)
    check.add_argument("after", type=Path)
    check.add_argument("--output", type=Path, default=None, help="write the verdicts as JSON here")
    check.add_argument(
        "--added-settings",
        default="",
        help="comma-separated settings new in the later commit, e.g. training.batch_size: present only after",
    )
    args = parser.parse_args(argv)
    if args.command == "record":
        names = [name.strip() for name in args.configs.split(",") if name.strip()] if args.configs else None
        record(args.output_dir, args.rounds, args.data_root, names)
        return 0
    added = frozenset(f".config.{name.strip()}" for name in args.added_settings.split(",") if name.strip())
    result = compare(args.before, args.after, added)
    text = json.dumps(result, indent=2)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
