"""CPU seconds of mini-batch neighbour sampling (``model/neighbor_sampling.sample_batch``) against the sort-based
sampler it replaced, side by side in one process, on a generated bank's round-2 operator (issue 29).

py-spy over a 5,000,000-customer bank's round 2 (``benchmarks/minibatch_training.py``, 8,192 seeds a batch,
fan-outs 10, 10, Eq. 9's operator with a 10-neighbour stand-in pseudo graph) put two thirds of its samples in the
sampler: a third in ``np.setdiff1d`` (a sort of every sampled column), a quarter in the ``lexsort`` that ranks every
row's entries, a tenth in locating columns among the sources by sorting them. The sampler now marks nodes in a
boolean array, ranks only the rows longer than the fan-out and indexes columns through a node → position array.

Both samplers draw from copies of one generator state for each batch, and every batch's layers are compared entry for
entry (the run stops on the first difference). The batches are an epoch's first ``--batches`` of round 2's loss nodes
(training nodes, then every other node as pseudo-labelled, as round 2 of the 5M run had), alternating which sampler
goes first::

    python benchmarks/neighbor_sampling.py --data-dir /tmp/mb/banks_5000000 --batches 20 \\
        --output docs/results/neighbor_sampling_5m.json

``--data-dir`` holds ``<bank>/customers.parquet`` and ``transactions.parquet`` (``fedgl-secure data synth`` or
``benchmarks/minibatch_training.py`` writes them).
"""

from __future__ import annotations

import argparse
import json
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
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.minibatch import epoch_batches
from fedgl_secure.model.neighbor_sampling import row_entries, sample_batch
from fedgl_secure.seeding import numpy_stream


def reference_sample_layer(
    operator: sp.csr_matrix, targets: np.ndarray, fanout: int, rng: np.random.Generator
) -> tuple[np.ndarray, sp.csr_matrix]:
    """The sampler as first written, by sorting: a full lexsort ranks every row's entries, a sorted set difference
    finds the new nodes and a search locates each column among the sources. Returns (sources, operator)."""
    positions, owner = row_entries(operator.indptr, targets)
    columns = operator.indices[positions].astype(np.int64)
    values = operator.data[positions].astype(np.float64)
    off_diagonal = columns != targets[owner]
    degree = np.bincount(owner[off_diagonal], minlength=targets.shape[0])
    off_owner = owner[off_diagonal]
    order = np.lexsort((rng.random(off_owner.shape[0]), off_owner))
    row_start = np.cumsum(degree) - degree
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0]) - row_start[off_owner[order]]
    keep = np.ones(columns.shape[0], dtype=bool)
    keep[off_diagonal] = rank < fanout
    values = np.where(off_diagonal, values * np.maximum(degree / fanout, 1.0)[owner], values)[keep]
    columns, owner = columns[keep], owner[keep]
    sources = np.concatenate([targets, np.setdiff1d(columns, targets)])
    order_of = np.argsort(sources, kind="stable")
    local_columns = order_of[np.searchsorted(sources[order_of], columns)]
    matrix = sp.csr_matrix((values.astype(np.float32), (owner, local_columns)), shape=(targets.size, sources.size))
    return sources, matrix


def reference_sample_batch(
    operator: sp.csr_matrix, seeds: np.ndarray, fanouts: tuple[int, ...], rng: np.random.Generator
) -> list[tuple[np.ndarray, sp.csr_matrix]]:
    """:func:`reference_sample_layer` layer by layer from the seeds outwards, as ``sample_batch``; input side first."""
    layers = []
    targets = np.asarray(seeds, dtype=np.int64)
    for fanout in reversed(fanouts):
        sources, matrix = reference_sample_layer(operator, targets, fanout, rng)
        layers.append((sources, matrix))
        targets = sources
    return layers[::-1]


def same_layers(batch, reference: list[tuple[np.ndarray, sp.csr_matrix]]) -> bool:
    return all(
        np.array_equal(layer.sources, sources)
        and np.array_equal(layer.operator.indptr, matrix.indptr)
        and np.array_equal(layer.operator.indices, matrix.indices)
        and np.array_equal(layer.operator.data, matrix.data)
        for layer, (sources, matrix) in zip(batch.layers, reference, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--bank", default="bank-a")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--fanouts", default="10,10", help="neighbours per node and layer, input layer first")
    parser.add_argument("--pseudo-neighbors", type=int, default=10, help="s of the stand-in pseudo graph")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    fanouts = tuple(int(part) for part in args.fanouts.split(","))
    torch.set_num_threads(1)
    # run as a script, benchmarks/ is on sys.path; imported by the tests (for the reference), it need not be
    from minibatch_training import BETA, memory_mib, stand_in_pseudo_graph

    directory = args.data_dir / args.bank
    source = FileSource(
        kind="files", customers=directory / "customers.parquet", transactions=directory / "transactions.parquet"
    )
    data = load_bank_data(source, synthetic_bank_schema(), name=args.bank, seed=args.seed)
    n = data.graph.num_nodes
    graph = GraphTensors.from_graph(data.graph, np.arange(n), n, torch.device("cpu"), False)
    del data
    pseudo_graph = stand_in_pseudo_graph(n, args.pseudo_neighbors, args.seed)
    operator = graph.adjacency(pseudo_graph, BETA, False).csr_view()
    train = graph.train_mask.numpy()
    batches = epoch_batches(
        np.flatnonzero(train), np.flatnonzero(~train), args.batch_size, numpy_stream(args.seed, "b")
    )
    print(f"operator ready: {n} nodes, {operator.nnz} entries, {memory_mib()}", file=sys.stderr, flush=True)

    seconds = {"current": [], "reference": []}
    for index, seeds in enumerate(batches[: args.batches]):
        state = np.random.default_rng([args.seed, index]).bit_generator.state
        runs = {}
        for name in ("current", "reference") if index % 2 == 0 else ("reference", "current"):
            rng = np.random.default_rng()
            rng.bit_generator.state = state
            started = time.process_time()
            if name == "current":
                runs[name] = sample_batch(operator, seeds, fanouts, rng)
            else:
                runs[name] = reference_sample_batch(operator, seeds, fanouts, rng)
            seconds[name].append(time.process_time() - started)
        if not same_layers(runs["current"], runs["reference"]):
            raise SystemExit(f"batch {index}: the two samplers drew different layers")
    total = {name: round(sum(values), 3) for name, values in seconds.items()}
    record = {
        "benchmark": "neighbor_sampling",
        "command": " ".join(sys.argv),
        "what": "CPU seconds of sample_batch (current) against the sort-based sampler it replaced (reference), "
        "same batches, same generator states, layers compared entry for entry",
        "nodes": n,
        "operator_entries": int(operator.nnz),
        "batches": len(seconds["current"]),
        "batch_size": args.batch_size,
        "fanouts": list(fanouts),
        "pseudo_neighbors": args.pseudo_neighbors,
        "identical_layers": True,
        "cpu_seconds": total,
        "cpu_seconds_per_batch": {name: round(value / len(seconds[name]), 4) for name, value in total.items()},
        "ratio_current_over_reference": round(total["current"] / total["reference"], 3),
        "threads": 1,
        "machine": platform.platform(),
        "numpy": np.__version__,
    }
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
