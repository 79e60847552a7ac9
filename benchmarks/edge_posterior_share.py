"""How much of a released graph's weight lands on true edges, by weighting (docs/privacy.md §6.2, §6.13).

For one bank of the paper's six on a dataset (the largest, p = 0.7, by default), releases its graph by randomised
response at each ε (OS CSPRNG, one draw each) and weights the release as ``[dp.edges] weighting`` would: one
global posterior (``posterior``) or one per feature-similarity bin (``feature-posterior``). Reports, per ε, the
released edge count, the share of released edges that are true, and the share of the weight on true edges under
each weighting. Writes JSON.

    FEDGL_DATA=/work/shared/datasets python benchmarks/edge_posterior_share.py --dataset cora \\
        --output docs/results/edge_posterior_share_cora.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.sampling import make_clients
from fedgl_secure.engine.config import build_config
from fedgl_secure.privacy import edge_mechanisms, edge_posterior


def weight_share(weighted: sp.spmatrix, true: sp.spmatrix) -> float:
    """Share of the weight of ``weighted``'s upper triangle that lies on ``true``'s edges."""
    upper = sp.triu(weighted, k=1).tocsr()
    return float(upper.multiply(true).sum() / upper.sum()) if upper.sum() > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--bank", type=int, default=5, help="which of the six sampled banks (5: p = 0.7)")
    parser.add_argument("--epsilons", default="8,4,2,1,0.5")
    parser.add_argument("--seed", type=int, default=0, help="the banks' sampling seed (the release is not seeded)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    config = build_config({"dataset": args.dataset, "seed": args.seed, "device": "cpu"})
    dataset = load_dataset(args.dataset, args.data_root, seed=args.seed)
    client = make_clients(dataset, config.federation.proportions, args.seed, config.federation.overlap)[args.bank]
    adjacency = sp.csr_matrix(client.adjacency())
    features = client.features  # cosine similarity ignores the training's row scaling of the features
    true = sp.triu(adjacency, k=1).tocsr()
    rows = []
    for epsilon in (float(e) for e in args.epsilons.split(",")):
        started = time.perf_counter()
        released = edge_mechanisms.randomized_response_edges(adjacency, epsilon)
        uniform = released * edge_mechanisms.randomized_response_posterior(client.num_nodes, released.nnz // 2, epsilon)
        binned = edge_posterior.feature_posterior_weights(released, features, epsilon, np.random.default_rng(0))
        kept_true = sp.triu(released, k=1).multiply(true).nnz
        row = {
            "epsilon": epsilon,
            "nodes": client.num_nodes,
            "true_edges": true.nnz,
            "released_edges": released.nnz // 2,
            "true_share_of_released": kept_true / max(released.nnz // 2, 1),
            "weight_share_on_true": {
                "posterior": weight_share(uniform, true),
                "feature-posterior": weight_share(binned, true),
            },
            "seconds": round(time.perf_counter() - started, 2),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/edge_posterior_share.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.output.write_text(json.dumps({"dataset": args.dataset, "command": command, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
