"""Peak memory of one bank's Eq. 9 operator (project the pseudo graph onto its nodes, normalise it, add it to Â,
hand the sum to torch as the training operator): the plain scipy expressions and the float32 copy the engine used
until now against ``GraphTensors.adjacency``'s memory-lean path (``model/adjacency.fuse_global_pseudo_graph``,
``SparseOperator.from_scipy``), side by side in one run.

A 5,000,000-customer bank's round 2 peaked at 8,630.5 MiB (``docs/results/bank_5m_customers.json``), 2.7 GB above
round 1, in building the fused operator. Both versions run here on the same bank and the same stand-in pseudo graph
(``benchmarks/minibatch_training.py``: s uniformly drawn neighbours per node, weight 1/s), each in a child forked
from the process that holds them, so each child starts from the same memory; a child's peak RSS above its RSS at the
start is what its fusion allocated at most. The two operators are compared bit for bit::

    python benchmarks/fusion_memory.py --data-dir /tmp/mb/banks_5000000 --customers 5000000 \
        --pseudo-neighbors 10 --output docs/results/fusion_memory_5m.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.data.bank_synth import synthetic_bank_schema
from fedgl_secure.data.sources.bank_graph import load_bank_data
from fedgl_secure.data.sources.declaration import FileSource
from fedgl_secure.model.adjacency import fuse_global_pseudo_graph, gcn_normalize
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.seeding import numpy_stream

BETA = 0.3  # benchmarks/minibatch_training.py's stand-in


def scipy_symmetric_normalize(matrix: sp.spmatrix) -> sp.csr_matrix:
    """``D^-1/2 M D^-1/2`` as two sparse products with the diagonal (the engine's form until now)."""
    matrix = sp.csr_matrix(matrix, dtype=np.float64)
    degree = np.asarray(matrix.sum(axis=1)).ravel()
    inv_sqrt = np.zeros_like(degree)
    inv_sqrt[degree > 0] = degree[degree > 0] ** -0.5
    scale = sp.diags(inv_sqrt)
    return (scale @ matrix @ scale).tocsr()


def scipy_projection(neighbors, weights, positions, num_global_nodes) -> sp.csr_matrix:
    """Ā^(k) through int64 ``n x s`` index arrays (the engine's form until now)."""
    n_local = positions.shape[0]
    local_of = np.full(num_global_nodes, -1, dtype=np.int64)
    local_of[positions] = np.arange(n_local)
    local_cols = local_of[neighbors[positions]]
    row_weights = weights[positions]
    keep = (local_cols >= 0) & (row_weights > 0)
    local_rows = np.broadcast_to(np.arange(n_local)[:, None], local_cols.shape)
    return sp.csr_matrix(
        (row_weights[keep].astype(np.float64), (local_rows[keep], local_cols[keep])), shape=(n_local, n_local)
    )


def scipy_operator(fused: sp.spmatrix) -> torch.Tensor:
    """The training operator from a fused matrix through a float32 copy of the whole matrix (the engine's form until
    now)."""
    csr = sp.csr_matrix(fused, dtype=np.float32)
    csr.sum_duplicates()
    csr.sort_indices()
    return torch.sparse_csr_tensor(
        torch.as_tensor(csr.indptr, dtype=torch.int64),
        torch.as_tensor(csr.indices, dtype=torch.int64),
        torch.as_tensor(csr.data, dtype=torch.float32),
        size=csr.shape,
    )


def scipy_fusion(a_hat, neighbors, weights, positions, num_global_nodes) -> torch.Tensor:
    projected = scipy_projection(neighbors, weights, positions, num_global_nodes)
    return scipy_operator((a_hat + BETA * scipy_symmetric_normalize(projected)).tocsr())


def lean_fusion(a_hat, neighbors, weights, positions, num_global_nodes) -> torch.Tensor:
    """What ``GraphTensors.adjacency`` does now."""
    fused = fuse_global_pseudo_graph(a_hat, neighbors, weights, positions, num_global_nodes, BETA)
    return SparseOperator.from_scipy(fused).matrix


FUSIONS = {"scipy-expressions": scipy_fusion, "lean": lean_fusion}


def _status_mib() -> dict[str, float]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmHWM:", "VmRSS:")):
                name, value = line.split(":", 1)
                values[name] = int(value.split()[0]) / 1024
    return values


def digest(matrix: torch.Tensor) -> str:
    """SHA-256 of a CSR tensor's arrays: equal digests, equal operators bit for bit."""
    sha = hashlib.sha256()
    for array in (matrix.crow_indices(), matrix.col_indices(), matrix.values()):
        sha.update(array.contiguous().numpy().tobytes())
    return sha.hexdigest()


def measure_in_child(name: str, inputs: tuple) -> dict:
    """``FUSIONS[name]`` in a forked child: its peak RSS above its RSS at the start, CPU seconds, result digest."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report, exit without running the parent's clean-up
        os.close(read)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
        start, cpu = _status_mib()["VmRSS"], time.process_time()
        fused = FUSIONS[name](*inputs)
        memory = _status_mib()
        record = {
            "rss_at_start_mib": round(start, 1),
            "peak_rss_mib": round(memory["VmHWM"], 1),
            "allocated_at_peak_mib": round(memory["VmHWM"] - start, 1),
            "result_mib": round(
                sum(a.nbytes for a in (fused.crow_indices(), fused.col_indices(), fused.values())) / 2**20, 1
            ),
            "cpu_seconds": round(time.process_time() - cpu, 2),
            "nnz": int(fused.values().shape[0]),
            "sha256": digest(fused),
        }
        os.write(write, json.dumps(record).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status, _ = os.wait4(pid, 0)
    if status != 0:
        raise RuntimeError(f"the {name} child failed (wait status {status})")
    return json.loads(b"".join(chunks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="generated banks (data synth)")
    parser.add_argument("--customers", type=int, required=True, help="customers per bank of --data-dir (recorded)")
    parser.add_argument("--bank", default="bank-a")
    parser.add_argument("--pseudo-neighbors", type=int, default=10, help="s of the stand-in pseudo graph")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    directory = args.data_dir / args.bank
    source = FileSource(
        kind="files", customers=directory / "customers.parquet", transactions=directory / "transactions.parquet"
    )
    graph = load_bank_data(source, synthetic_bank_schema(), name=args.bank, seed=args.seed).graph
    a_hat = gcn_normalize(graph.adjacency())
    n = graph.num_nodes
    del graph
    rng = numpy_stream(args.seed, "benchmark", "pseudo graph")  # as minibatch_training.stand_in_pseudo_graph
    neighbors = rng.integers(0, n - 1, size=(n, args.pseudo_neighbors), dtype=np.int64)
    neighbors += neighbors >= np.arange(n)[:, None]
    weights = np.full((n, args.pseudo_neighbors), 1.0 / args.pseudo_neighbors, dtype=np.float32)
    inputs = (a_hat, neighbors, weights, np.arange(n), n)

    results = {name: measure_in_child(name, inputs) for name in FUSIONS}
    baseline, lean = results["scipy-expressions"], results["lean"]
    record = {
        "benchmark": "fusion_memory",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "customers": args.customers,
        "nodes": n,
        "a_hat_nnz": int(a_hat.nnz),
        "pseudo_neighbors": args.pseudo_neighbors,
        "beta": BETA,
        "parent_rss_mib": round(_status_mib()["VmRSS"], 1),
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "fusions": results,
        "same_matrix_bit_for_bit": baseline["sha256"] == lean["sha256"],
        "allocated_ratio_lean_over_scipy": round(lean["allocated_at_peak_mib"] / baseline["allocated_at_peak_mib"], 3),
        "cpu_ratio_lean_over_scipy": round(lean["cpu_seconds"] / baseline["cpu_seconds"], 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
