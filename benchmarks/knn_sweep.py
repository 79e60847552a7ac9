"""Sweep the candidate approximate indexes for Eq. 15's top-s: recall, CPU seconds and memory per option.

    python benchmarks/knn_sweep.py --nodes 100000 --output docs/results/knn_sweep.json

For each data kind (``clustered``, ``banks``: ``benchmarks/pseudo_graph.py``'s generators) and
similarity (``dot``, ``cosine``) it builds, over the rows lifted
(``[h, √(Φ² − ‖h‖²)]``, so L2 order is inner-product order; as ``faiss_ivf`` lifts them), faiss ``IndexHNSWFlat`` and
``IndexIVFFlat`` (``nlist = 4√M``), and for ``s`` in {10, 100} measures, per search breadth
(HNSW's efSearch, IVF's nprobe), the recall of the exact top-s on ``--sample`` random rows and the
CPU seconds of searching ``--queries`` rows, scaled to 10^6 rows. CPU seconds (both threads), not
wall seconds: the machine is shared. ``rss_mb`` is the process's peak after each build. The
indexes are measured alone: ``faiss_ivf`` adds, for ``dot``, an exact scan of the highest-norm rows.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from pseudo_graph import random_embeddings

from fedgl_secure.engine import faiss_ivf

# faiss' defaults for IndexHNSWFlat's M and efConstruction
HNSW_LINKS = 16
HNSW_EF_CONSTRUCTION = 40
EF_SEARCH = (48, 96, 192, 384)
NPROBE = (8, 16, 32, 64)
S_VALUES = (10, 100)


def exact_top_s(points: np.ndarray, sample: np.ndarray, s: int) -> np.ndarray:
    scores = points[sample] @ points.T
    scores[np.arange(sample.size), sample] = -np.inf
    return np.argsort(-scores, axis=1)[:, :s]


def recall(ids: np.ndarray, sample: np.ndarray, truth: np.ndarray) -> float:
    s = truth.shape[1]
    kept = [row[row != own][:s] for row, own in zip(ids, sample, strict=True)]
    return float(np.mean([len(set(k) & set(t)) / s for k, t in zip(kept, truth, strict=True)]))


def measure(index, queries: np.ndarray, sample: np.ndarray, truths: dict, timed: int) -> list[dict]:
    rows = []
    for s, truth in truths.items():
        _, ids = index.search(queries[sample], s + 1)
        started = time.process_time()
        index.search(queries[:timed], s + 1)
        cpu = time.process_time() - started
        rows.append(
            {"s": s, "recall": round(recall(ids, sample, truth), 4), "cpu_s_per_1m_rows": round(cpu / timed * 1e6, 1)}
        )
    return rows


def sweep_one(points: np.ndarray, sample: np.ndarray, args: argparse.Namespace) -> list[dict]:
    truths = {s: exact_top_s(points, sample, s) for s in S_VALUES}
    phi = faiss_ivf.largest_norm(points)
    stored, queries = faiss_ivf.stored_vectors(points, phi), faiss_ivf.query_vectors(points)
    out = []
    started = time.process_time()
    hnsw = faiss.IndexHNSWFlat(stored.shape[1], HNSW_LINKS)
    hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    hnsw.add(stored)
    build = time.process_time() - started
    for ef in EF_SEARCH:
        hnsw.hnsw.efSearch = ef
        for row in measure(hnsw, queries, sample, truths, args.queries):
            out.append(
                {"index": "IndexHNSWFlat", "links": HNSW_LINKS, "ef_search": ef, "build_cpu_s": round(build, 1)} | row
            )
    out[-1]["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    del hnsw
    nlist = int(4 * math.sqrt(points.shape[0]))
    started = time.process_time()
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(stored.shape[1]), stored.shape[1], nlist)
    ivf.train(stored[np.random.default_rng(1).choice(points.shape[0], min(points.shape[0], 64 * nlist), replace=False)])
    ivf.add(stored)
    build = time.process_time() - started
    for nprobe in NPROBE:
        ivf.nprobe = nprobe
        for row in measure(ivf, queries, sample, truths, args.queries):
            out.append(
                {"index": "IndexIVFFlat", "nlist": nlist, "nprobe": nprobe, "build_cpu_s": round(build, 1)} | row
            )
    out[-1]["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--queries", type=int, default=10_000, help="rows whose search is timed")
    parser.add_argument("--output", type=Path, default=Path("docs/results/knn_sweep.json"))
    args = parser.parse_args()
    faiss.omp_set_num_threads(torch.get_num_threads())
    sample = np.sort(np.random.default_rng(2).choice(args.nodes, args.sample, replace=False))
    results = []
    for data in ("clustered", "banks"):
        h = random_embeddings(args.nodes, args.dim, 0, data)
        for similarity in ("dot", "cosine"):
            points = torch.nn.functional.normalize(h, dim=1) if similarity == "cosine" else h
            for row in sweep_one(points.numpy(), sample, args):
                results.append({"data": data, "similarity": similarity} | row)
                print(json.dumps(results[-1]), flush=True)
    report = {
        "benchmark": f"benchmarks/knn_sweep.py --nodes {args.nodes} --sample {args.sample} --queries {args.queries}",
        "nodes": args.nodes,
        "dim": args.dim,
        "threads": torch.get_num_threads(),
        "faiss_version": faiss.__version__,
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
