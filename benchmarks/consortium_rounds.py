"""Round time of the five-process loopback consortium (key authority, aggregator, three banks).

Writes a throw-away consortium (fresh keys, free ports, the baseline policy's CKKS parameters)
for a dataset, runs ``consortium up`` on it and reports the aggregator's time per applied round
(open → applied: download, local training, encryption, upload, homomorphic sum, decryption,
server step) — as JSON.

    FEDGL_DATA=../shared/datasets python benchmarks/consortium_rounds.py --dataset cora --rounds 5 \\
        --output results/consortium_rounds_cora.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import consortium_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=os.environ.get("FEDGL_DATA"))
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    experiment = {
        "dataset": args.dataset,
        "method": "fedgl",
        "seed": args.seed,
        "device": "cpu",
        "federation": {"proportions": [0.5, 0.6, 0.7], "max_rounds": args.rounds, "patience": args.rounds + 10},
    }
    with tempfile.TemporaryDirectory(prefix="fedgl-loopback-") as root:
        consortium = write_loopback_consortium(
            Path(root), experiment=experiment, data_root=args.data_root, federation=f"bench-{args.dataset}"
        )
        os.environ.setdefault("FEDGL_KA_SECRET", os.urandom(32).hex())
        os.environ.setdefault("FEDGL_BANK_SECRET", os.urandom(32).hex())
        summary = consortium_up(consortium, progress=False, timeout=1800)
    seconds = [s for s in summary.get("round_seconds", []) if s is not None]
    result = {
        "dataset": args.dataset,
        "rounds": len(seconds),
        "round_seconds": seconds,
        "mean_round_seconds": statistics.fmean(seconds) if seconds else None,
        "max_round_seconds": max(seconds) if seconds else None,
        "wall_seconds": summary.get("wall_seconds"),
        "processes": 5,
        "cores": os.cpu_count(),
        "finished": bool(summary.get("finished")),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
