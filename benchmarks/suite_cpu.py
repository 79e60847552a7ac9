"""CPU seconds of the test suite, per test file: the test process and the node processes its tests start.

Wall time on a shared 2-core host says more about the other users than about the suite, so issue 28's "``make test``
≤ 5 minutes on 2 cores" is tracked as CPU: a pytest plugin records, around each test (set-up, call, tear-down), the
growth of ``getrusage`` of the test process and of its reaped children (every node process a consortium test starts
and stops), one JSON line per test into ``$SUITE_CPU_DIR/<xdist worker>.jsonl``::

    PYTHONPATH=$PWD:benchmarks python -m pytest -n 2 --dist loadfile -p suite_cpu   # or one file, -n 1
    python benchmarks/suite_cpu.py $SUITE_CPU_DIR --output per_file.json

``-n 1`` for a single file keeps torch on one thread, as ``make test``'s workers are (tests/conftest.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest


def _cpu_seconds() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children, started = *_cpu_seconds(), time.monotonic()
    yield
    own_after, children_after = _cpu_seconds()
    record = {
        "test": item.nodeid,
        "file": item.path.name,
        "self_s": own_after - own,
        "children_s": children_after - children,
        "wall_s": time.monotonic() - started,
    }
    directory = Path(os.environ.get("SUITE_CPU_DIR", "suite-cpu"))
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl").open("a") as lines:
        lines.write(json.dumps(record) + "\n")


def per_file(directory: Path) -> dict[str, dict[str, float]]:
    """CPU, self and children's CPU, wall seconds and tests of each file, most CPU first."""
    files: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "self_s": 0.0, "children_s": 0.0})
    for path in directory.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            row = files[record["file"]]
            row["self_s"] += record["self_s"]
            row["children_s"] += record["children_s"]
            row["cpu_s"] += record["self_s"] + record["children_s"]
    ranked = sorted(files.items(), key=lambda item: -item[1]["cpu_s"])
    return {name: {key: round(value, 1) for key, value in row.items()} for name, row in ranked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the plugin's $SUITE_CPU_DIR")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    files = per_file(args.directory)
    summary = {"total_cpu_s": round(sum(row["cpu_s"] for row in files.values()), 1), "files": files}
    args.output.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
