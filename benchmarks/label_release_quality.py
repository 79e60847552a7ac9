"""How many released labels are right, per label-DP release (docs/privacy.md §6.10): no training, seconds per bank.

For every bank of the federation (the same sampled banks as ``simulate``), every seed and every variant, the bank
releases its training and validation labels once at ε — plain randomised response (``rr``) or the multi-stage
RRWithPrior release (:func:`~fedgl_secure.privacy.label_release.multi_stage_release`, variant
``PRIOR:STAGES:ORDER[:TEMPERATURE]``; ``consortium-sgc:…`` releases every bank's labels together with the consortium
prior, :func:`~fedgl_secure.privacy.consortium_prior.consortium_release`) — and the script counts the released labels
equal to the true ones, separately for training and validation nodes, pooled over banks and seeds. The fraction of
training labels kept right is what the model is fitted to; it explains most of the accuracy of ``privacy_utility.py
--units label`` (randomised response at ε = 2 and 3 keeps 55 % and 77 % of 7 classes). Randomness is a seeded byte
source (reproducible, and therefore private for nothing: a measurement, not a release).

    FEDGL_DATA=/work/shared/datasets OMP_NUM_THREADS=1 python benchmarks/label_release_quality.py --dataset cora \\
        --epsilon 2 --seeds 2 sgc:2:validation-first sgc:3:validation-first sgc:2:random propagation:2:validation-first
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.aggregation import PlaintextSummation, client_weight
from fedgl_secure.engine.config import build_config
from fedgl_secure.privacy import consortium_prior, label_mechanisms, label_release
from fedgl_secure.simulation.experiment import Federation, resolve_device


def released_together(variant: str, federation, epsilon: float, sources: list) -> list[np.ndarray]:
    """``consortium-sgc:STAGES:ORDER``: every bank's release with the consortium prior, the prior's FedAvg summed in
    plaintext (the secure summation gives the same sums up to CKKS rounding)."""
    _, stages, order, *temperature = variant.split(":")
    graphs = federation.client_graphs
    banks = [
        consortium_prior.BankLabels(
            graph.labels.numpy(),
            graph.train_mask.numpy(),
            graph.val_mask.numpy(),
            label_release.propagated_features(bank.adjacency(), graph.features.to_scipy()),
            source,
        )
        for bank, graph, source in zip(federation.clients, graphs, sources, strict=True)
    ]
    normaliser = max(client_weight(graph.num_nodes) for graph in graphs)
    releases = consortium_prior.consortium_release(
        banks,
        graphs[0].num_classes,
        epsilon,
        int(stages),
        order,
        PlaintextSummation(),
        normaliser,
        *map(float, temperature),
    )
    return [release.labels for release in releases]


def released(variant: str, bank, graph, epsilon: float, random_bytes) -> np.ndarray:
    labels, train, val = graph.labels.numpy(), graph.train_mask.numpy(), graph.val_mask.numpy()
    if variant == "rr":
        return label_mechanisms.randomized_response_labels(
            labels, epsilon, graph.num_classes, train | val, _random_bytes=random_bytes
        )
    prior, stages, order, *temperature = variant.split(":")
    return label_release.multi_stage_release(
        labels,
        train,
        val,
        bank.adjacency(),
        graph.num_classes,
        epsilon,
        int(stages),
        order,
        prior,
        graph.features.to_scipy(),
        *map(float, temperature),
        _random_bytes=random_bytes,
    ).labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "variants", nargs="*", help="PRIOR:STAGES:ORDER[:TEMPERATURE], e.g. sgc:2:validation-first; rr is always run"
    )
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..n-1 (bank sampling and the byte source)")
    args = parser.parse_args(argv)
    counts: dict[str, np.ndarray] = {}
    for seed in range(args.seeds):
        dataset = load_dataset(args.dataset, args.data_root, seed=seed)
        config = build_config({"dataset": args.dataset, "method": "fedgl", "seed": seed, "device": "cpu"})
        federation = Federation.build(dataset, config, resolve_device("cpu"))
        banks = list(zip(federation.clients, federation.client_graphs, strict=True))
        for variant in ["rr", *args.variants]:
            # the same byte stream for every variant of a bank: their stage-1 draws coincide where they can
            sources = [np.random.default_rng([seed, index]).bytes for index in range(len(banks))]
            if variant.startswith(f"{label_release.CONSORTIUM_PRIOR}:"):
                outputs = released_together(variant, federation, args.epsilon, sources)
            else:
                outputs = [
                    released(variant, bank, graph, args.epsilon, source)
                    for (bank, graph), source in zip(banks, sources, strict=True)
                ]
            for (_, graph), out in zip(banks, outputs, strict=True):
                labels, train, val = graph.labels.numpy(), graph.train_mask.numpy(), graph.val_mask.numpy()
                right = [int((out[m] == labels[m]).sum()) for m in (train, val)] + [int(train.sum()), int(val.sum())]
                counts[variant] = counts.get(variant, np.zeros(4, dtype=np.int64)) + np.array(right)
    table = {
        variant: {"train_right": round(c[0] / c[2], 4), "val_right": round(c[1] / c[3], 4), "train": int(c[2])}
        for variant, c in counts.items()
    }
    print(json.dumps({"dataset": args.dataset, "epsilon": args.epsilon, "seeds": args.seeds, "released": table}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
