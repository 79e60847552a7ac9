"""Share of correct self-training pseudo labels on the non-IID clients at 10 labels per class, n = 5/10/20 (issue 11).

The labelling is the one `self_training.per_class` runs (engine/self_training.py: each client's own GCN, Kipf's
lr and decay, 100 epochs); docs/reproduction.md, "Non-IID". One JSON line per run:

    FEDGL_DATA=/work/shared/datasets OMP_NUM_THREADS=1 python benchmarks/graphfl_pseudo_label_accuracy.py cora 0
"""

import json
import sys

import numpy as np
import torch

from fedgl_secure.data.graphfl_split import graphfl_clients
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import initial_parameters
from fedgl_secure.engine.self_training import candidate_nodes, local_class_probabilities, most_confident_per_class
from fedgl_secure.simulation.graphfl_experiments import NUM_CLIENTS, non_iid_schedule, protocol_config

torch.set_num_threads(1)
name, seed = sys.argv[1], int(sys.argv[2])
dataset = load_dataset(name, None, seed=0)
config = protocol_config(name, "graphfl", seed, non_iid_schedule("graphfl+st", 5))
settings = config.self_training
training = config.training.model_copy(
    update={"learning_rate": settings.learning_rate, "weight_decay": settings.weight_decay}
)
start = initial_parameters(config, dataset.num_features, dataset.num_classes)
truth = torch.as_tensor(dataset.labels)
counts = (5, 10, 20)
correct = {n: 0 for n in counts}
total = {n: 0 for n in counts}
classes = {n: [] for n in counts}
for k, client in enumerate(graphfl_clients(dataset, NUM_CLIENTS, 10, seed)):
    graph = GraphTensors.from_graph(client, np.arange(client.num_nodes), client.num_nodes, torch.device("cpu"))
    probabilities = local_class_probabilities(graph, training, start, settings.epochs, seed, k)
    for n in counts:
        nodes, labels = most_confident_per_class(probabilities, candidate_nodes(graph), n)
        correct[n] += int((truth[nodes] == labels).sum())
        total[n] += int(nodes.numel())
        classes[n].append(int(torch.unique(labels).numel()))
print(
    json.dumps(
        {
            "dataset": name,
            "seed": seed,
            **{
                str(n): {
                    "correct": correct[n] / total[n],
                    "nodes": total[n],
                    "mean_classes_per_client": float(np.mean(classes[n])),
                }
                for n in counts
            },
        }
    )
)
