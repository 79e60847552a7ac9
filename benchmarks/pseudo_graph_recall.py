"""Recall of the ``faiss_ivf`` pseudo graph (Eq. 15) at millions of rows, from a sample of its rows (issue 29).

    OMP_NUM_THREADS=1 python benchmarks/pseudo_graph_recall.py --nodes 10000000 --recall-sample 500 \\
        --output docs/results/pseudo_graph_recall_10m.json

``benchmarks/pseudo_graph.py --recall-sample`` builds the whole graph — every row searched — and then
measures recall on a sample of rows: at 2.5·10^6 rows one case took 1,967.9 s on one thread, and at 10^7
the search of every row would take hours per case. But a row's neighbours depend on that row and the index
only (``engine/faiss_ivf.search_rows``; ``tests/test_faiss_ivf.py`` checks that a sample searched alone gets
exactly the neighbours the whole graph gives it). So here, for each data kind and similarity, the index is
built over all ``--nodes`` rows exactly as ``discover_pseudo_graph(backend="faiss_ivf")`` builds it (the
same plan, rows, seed and thread count), and only the sampled rows are searched, for each ``s``: their
recall is the recall the whole graph has on them. The sample is ``pseudo_graph.py``'s (the same seed), so
both scripts score the same rows.

Reported per case: ``recall`` (share of each sampled row's exact top-s kept) and ``recall_ties`` (a kept
neighbour tying the s-th exact similarity counts as right), as ``pseudo_graph.py`` reports them; the index's
build seconds (CPU and wall), the sampled rows' search seconds, and ``seconds_estimated``: the build plus the
search of every row at the sample's per-row speed — an estimate, labelled so, against which
``pseudo_graph.py``'s measured full runs are set in ``full_run_checks`` where one exists; and the peak RSS
(``VmHWM``) of the whole script so far, which holds the rows, the index and the exact scores of the sample
(not a full graph of ``M x s`` neighbours, which a full run also holds: 12 bytes a neighbour).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedgl_secure.engine import faiss_ivf, pseudo_graph
from fedgl_secure.engine.pseudo_graph_recall import sampled_recall

DATA = ("clustered", "banks")
SIMILARITIES = ("dot", "cosine")
NEIGHBOURS = (10, 100)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def measure(args: argparse.Namespace, data: str, similarity: str, embeddings: torch.Tensor, faiss) -> list[dict]:
    """Every ``s`` of one (data, similarity): one index, the sampled rows searched for each ``s``."""
    m = embeddings.shape[0]
    h = torch.nn.functional.normalize(embeddings, p=2.0, dim=1) if similarity == "cosine" else embeddings
    h = h.contiguous()
    plan = faiss_ivf.faiss_ivf_plan(m, mips=similarity == "dot")
    # the sample of benchmarks/pseudo_graph.py's sample_recall (same seed): both scripts score the same rows
    sample = torch.from_numpy(
        np.sort(np.random.default_rng(args.seed + 2).choice(m, args.recall_sample, replace=False))
    )
    with pseudo_graph._faiss_threads(faiss, torch.get_num_threads()):
        cpu, wall = time.process_time(), time.perf_counter()
        index = faiss_ivf.build_index(faiss, h.numpy(), plan, progress=True)
        build_cpu, build_wall = time.process_time() - cpu, time.perf_counter() - wall
        cases = []
        for s in args.s:
            cpu, wall = time.process_time(), time.perf_counter()
            found, _ = faiss_ivf.search_rows(faiss, index, h, sample, s)
            search_cpu, search_wall = time.process_time() - cpu, time.perf_counter() - wall
            recall, recall_ties = sampled_recall(h, similarity, sample, found)
            per_row_wall = search_wall / sample.shape[0]
            cases.append(
                {
                    "data": data,
                    "similarity": similarity,
                    "s": s,
                    "recall": round(recall, 4),
                    "recall_ties": round(recall_ties, 4),
                    "index_build_seconds": round(build_wall, 1),
                    "index_build_cpu_seconds": round(build_cpu, 1),
                    "sample_search_seconds": round(search_wall, 3),
                    "sample_search_cpu_seconds": round(search_cpu, 3),
                    "seconds_estimated": round(build_wall + per_row_wall * m, 1),
                    "peak_rss_mb": peak_rss_mb(),
                    "faiss_ivf_plan": {
                        "nlist": plan.nlist,
                        "nprobe": plan.nprobe,
                        "train_rows": plan.train_rows,
                        "mips": plan.mips,
                        "hubs": plan.hubs,
                    },
                }
            )
            print(json.dumps(cases[-1]), file=sys.stderr, flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--recall-sample", type=int, default=500)
    parser.add_argument("--data", default=",".join(DATA))
    parser.add_argument("--similarity", default=",".join(SIMILARITIES))
    parser.add_argument("--s", default=",".join(map(str, NEIGHBOURS)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    args.s = [int(part) for part in args.s.split(",")]
    # run as a script, benchmarks/ is on sys.path: the embeddings of benchmarks/pseudo_graph.py, row for row
    from pseudo_graph import random_embeddings

    faiss = pseudo_graph._import_faiss()
    if faiss is None:
        raise SystemExit("faiss is not installed (pip install faiss-cpu)")
    record = {
        "benchmark": "pseudo_graph_recall",
        "command": " ".join(sys.argv),
        "nodes": args.nodes,
        "dim": args.dim,
        "recall_sample": args.recall_sample,
        "target_recall": faiss_ivf.TARGET_RECALL,
        "how": __doc__.split("\n\n")[2].replace("\n", " "),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "faiss_version": faiss.__version__,
        "platform": platform.platform(),
        "cases": [],
    }
    for data in args.data.split(","):
        embeddings = random_embeddings(args.nodes, args.dim, args.seed, data)
        for similarity in args.similarity.split(","):
            record["cases"] += measure(args, data, similarity, embeddings, faiss)
            ties = [case["recall_ties"] for case in record["cases"]]
            record["min_recall"] = min(case["recall"] for case in record["cases"])
            record["min_recall_ties"] = min(ties)
            record["meets_recall_target"] = min(ties) >= faiss_ivf.TARGET_RECALL
            args.output.write_text(json.dumps(record, indent=1) + "\n")  # what is measured survives a stop
        del embeddings
    print(json.dumps({k: v for k, v in record.items() if k != "cases"}, indent=1))


if __name__ == "__main__":
    main()
