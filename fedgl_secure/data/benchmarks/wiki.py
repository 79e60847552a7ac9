"""Wiki (TADW, Yang et al. IJCAI 2015): 2405 web pages, 17 very imbalanced classes, TF-IDF features.

Raw files (``<root>/wiki/raw``): ``wiki.mat`` (MATLAB v5 with ``fea``, the 2405 x 4973 TF-IDF
matrix, and ``gnd``, labels 1..17) and ``graph.txt`` (directed ``src<TAB>dst`` links, 0-based,
with duplicates and self-loops). The links are symmetrised and de-duplicated, self-loops dropped,
which gives 11596 undirected edges. The ``W`` matrix in ``wiki.mat`` is not used: it is the same
graph with multiplicities as weights.

Wiki has no published split, so one is drawn from the run's seed (paper §5.1: 20 labels per class,
500 validation and 1000 test nodes).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from fedgl_secure.data.benchmarks.rawfiles import check, parsing, read_int_table, require_files
from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.splits import capped_train_per_class, sample_split

WIKI_FILES = ("wiki.mat", "graph.txt")
WIKI_TRAIN_PER_CLASS = 20
WIKI_NUM_VAL = 500
WIKI_NUM_TEST = 1000


def wiki_train_per_class(class_counts: np.ndarray) -> np.ndarray:
    """Training nodes per class: ``min(20, count // 2)``.

    Four Wiki classes have 9-11 nodes; taking 20 (or all) of them would leave none for validation
    and test, so small classes give at most half of their nodes to training.
    """
    return capped_train_per_class(class_counts, WIKI_TRAIN_PER_CLASS)


def _read_mat(path: Path, dataset: str) -> tuple[sp.csr_matrix, np.ndarray]:
    with parsing(path, dataset), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mat = scipy.io.loadmat(path, variable_names=("fea", "gnd"))
    missing = [key for key in ("fea", "gnd") if key not in mat]
    check(not missing, dataset, f"{path} lacks the variable(s) {', '.join(missing)}")
    with parsing(path, dataset):
        features = sp.csr_matrix(mat["fea"], dtype=np.float32)
        gnd = np.asarray(mat["gnd"]).astype(np.int64)
    check(
        gnd.ndim == 2 and 1 in gnd.shape,
        dataset,
        f"{path}: 'gnd' should be a label vector, found shape {gnd.shape}",
    )
    return features, gnd.ravel()


def load_wiki(root: Path, seed: int) -> GraphDataset:
    """Load Wiki from ``<root>/wiki/raw`` with a split drawn by ``np.random.default_rng(seed)``.

    Split: per class ``min(20, count // 2)`` training nodes (:func:`wiki_train_per_class`), then
    500 validation and 1000 test nodes uniformly from the remaining nodes. The same seed always
    gives the same split; different seeds give different splits (the paper averages over them).

    Raises:
        DatasetError: the directory or a file is missing, a file is corrupt, or the files disagree
            about the number of nodes.
    """
    name = "wiki"
    paths = require_files(Path(root) / name / "raw", WIKI_FILES, name)
    features, gnd = _read_mat(paths["wiki.mat"], name)
    edges = read_int_table(paths["graph.txt"], name, 2)

    num_nodes = features.shape[0]
    check(
        gnd.shape[0] == num_nodes,
        name,
        f"wiki.mat: 'gnd' has {gnd.shape[0]} labels but 'fea' has {num_nodes} rows",
    )
    check(bool((gnd >= 1).all()), name, "wiki.mat: 'gnd' labels must start at 1")
    check(
        edges.size == 0 or (edges.min() >= 0 and edges.max() < num_nodes),
        name,
        f"graph.txt references node ids outside 0..{num_nodes - 1} (wiki.mat has {num_nodes} nodes)",
    )
    labels = gnd - 1
    num_classes = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=num_classes)
    train_mask, val_mask, test_mask = sample_split(
        labels,
        np.random.default_rng(seed),
        train_per_class=wiki_train_per_class(counts),
        num_val=WIKI_NUM_VAL,
        num_test=WIKI_NUM_TEST,
        dataset=name,
    )
    features.sort_indices()
    return GraphDataset(
        name=name,
        features=features,
        labels=labels,
        edge_index=canonical_edge_index(edges[:, 0], edges[:, 1], num_nodes),
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=num_classes,
        node_ids=np.arange(num_nodes, dtype=np.int64),
    )
