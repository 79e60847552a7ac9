"""Cora and Citeseer from the Planetoid raw files (``ind.<name>.*``), with the public split.

The files are Python-2 pickles (Yang et al., ICML 2016). Node order follows Kipf's GCN
``load_data``: ``features = vstack(allx, tx)`` and then the test rows are moved to the ids listed in
``test.index`` (which is not sorted). Citeseer's ``test.index`` skips 15 ids of its range; those nodes
exist in the graph but have no features and no label, so — as in GCN and PyG — they get an all-zero
feature row, and here label ``-1`` (unlabelled) so that no split or metric ever uses them.

Public split (Planetoid): train = the rows of ``x`` (20 per class, ids ``0..len(x)-1``),
validation = the next 500 ids, test = ``test.index``.

Pickles can execute code when loaded, and a bank will load data from directories it does not fully
control, so the unpickler here only resolves the handful of numpy/scipy/collections globals these
files actually reference; anything else is refused as a corrupt file.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.benchmarks.rawfiles import check, parsing, require_files
from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.splits import index_mask
from fedgl_secure.errors import ConfigError

PLANETOID_NAMES = ("cora", "citeseer")
_PICKLED = ("x", "y", "tx", "ty", "allx", "ally", "graph")
_NUM_VAL = 500

# Globals the Planetoid pickles reference (module names as written by Python 2 / old numpy+scipy,
# plus their modern equivalents). Anything else is refused.
_ALLOWED_GLOBALS = frozenset(
    {
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("scipy.sparse.csr", "csr_matrix"),
        ("scipy.sparse._csr", "csr_matrix"),
        ("scipy.sparse", "csr_matrix"),
        ("collections", "defaultdict"),
        ("__builtin__", "list"),
        ("builtins", "list"),
    }
)


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only :data:`_ALLOWED_GLOBALS`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def _load_pickle(path: Path, dataset: str) -> Any:
    with parsing(path, dataset), path.open("rb") as handle, warnings.catch_warnings():
        # Old pickles name ``scipy.sparse.csr`` / ``numpy.core``; both still load, with a warning.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _RestrictedUnpickler(handle, encoding="latin1").load()


def _as_csr(value: Any, path: Path, dataset: str) -> sp.csr_matrix:
    check(sp.issparse(value), dataset, f"{path} should hold a sparse matrix, found {type(value).__name__}")
    return sp.csr_matrix(value, dtype=np.float32)


def _as_onehot(value: Any, path: Path, dataset: str) -> np.ndarray:
    check(
        isinstance(value, np.ndarray) and value.ndim == 2,
        dataset,
        f"{path} should hold a 2-d one-hot label array, found {type(value).__name__}",
    )
    return np.asarray(value)


def _read_test_index(path: Path, dataset: str) -> np.ndarray:
    with parsing(path, dataset):
        tokens = path.read_text(encoding="ascii").split()
        return np.array([int(token) for token in tokens], dtype=np.int64)


def _labels_from_onehot(onehot: np.ndarray) -> np.ndarray:
    """``argmax`` of each row, ``-1`` for all-zero rows (nodes without a label)."""
    labels = onehot.argmax(axis=1).astype(np.int64)
    labels[~onehot.any(axis=1)] = -1
    return labels


def _graph_edges(graph: Any, num_nodes: int, path: Path, dataset: str) -> np.ndarray:
    check(
        isinstance(graph, dict),
        dataset,
        f"{path} should hold an adjacency dict, found {type(graph).__name__}",
    )
    with parsing(path, dataset):
        rows = np.fromiter((int(node) for node, neighbours in graph.items() for _ in neighbours), dtype=np.int64)
        cols = np.fromiter((int(other) for neighbours in graph.values() for other in neighbours), dtype=np.int64)
    if rows.size:
        low, high = min(rows.min(), cols.min()), max(rows.max(), cols.max())
        check(
            low >= 0 and high < num_nodes,
            dataset,
            f"{path} references node ids {low}..{high}, but the feature files define {num_nodes} nodes",
        )
    return canonical_edge_index(rows, cols, num_nodes)


def load_planetoid(name: str, root: Path) -> GraphDataset:
    """Load ``cora`` or ``citeseer`` from ``<root>/<name>/raw/ind.<name>.*``.

    Returns features as stored (binary bag of words, CSR float32, not normalised), labels as the
    argmax of the one-hot rows (``-1`` for Citeseer's 15 featureless nodes), the undirected graph
    without self-loops or duplicates, and the public Planetoid split.

    Raises:
        DatasetError: the directory or a file is missing, a file is corrupt, or the files disagree
            about shapes.
    """
    if name not in PLANETOID_NAMES:
        raise ConfigError(f"dataset: {name!r} is not a Planetoid dataset; expected one of {PLANETOID_NAMES}")
    directory = Path(root) / name / "raw"
    files = [f"ind.{name}.{part}" for part in (*_PICKLED, "test.index")]
    paths = require_files(directory, files, name)
    loaded = {part: _load_pickle(paths[f"ind.{name}.{part}"], name) for part in _PICKLED}
    path_of = {part: paths[f"ind.{name}.{part}"] for part in (*_PICKLED, "test.index")}

    x = _as_csr(loaded["x"], path_of["x"], name)
    allx = _as_csr(loaded["allx"], path_of["allx"], name)
    tx = _as_csr(loaded["tx"], path_of["tx"], name)
    y = _as_onehot(loaded["y"], path_of["y"], name)
    ally = _as_onehot(loaded["ally"], path_of["ally"], name)
    ty = _as_onehot(loaded["ty"], path_of["ty"], name)
    test_index = _read_test_index(path_of["test.index"], name)

    num_features = allx.shape[1]
    num_classes = ally.shape[1]
    for part, matrix in (("x", x), ("tx", tx)):
        check(
            matrix.shape[1] == num_features,
            name,
            f"ind.{name}.{part} has {matrix.shape[1]} feature columns, ind.{name}.allx has {num_features}",
        )
    for part, onehot in (("y", y), ("ty", ty)):
        check(
            onehot.shape[1] == num_classes,
            name,
            f"ind.{name}.{part} has {onehot.shape[1]} label columns, ind.{name}.ally has {num_classes}",
        )
    for feat, lab, matrix, onehot in (("x", "y", x, y), ("allx", "ally", allx, ally), ("tx", "ty", tx, ty)):
        check(
            matrix.shape[0] == onehot.shape[0],
            name,
            f"ind.{name}.{feat} has {matrix.shape[0]} rows but ind.{name}.{lab} has {onehot.shape[0]}",
        )
    check(
        test_index.shape[0] == tx.shape[0],
        name,
        f"ind.{name}.test.index lists {test_index.shape[0]} ids but ind.{name}.tx has {tx.shape[0]} rows",
    )
    check(
        np.unique(test_index).shape[0] == test_index.shape[0],
        name,
        f"ind.{name}.test.index contains duplicate ids",
    )
    num_known = allx.shape[0]
    check(
        test_index.shape[0] > 0 and test_index.min() >= num_known,
        name,
        f"ind.{name}.test.index must list ids >= {num_known} (the rows of allx)",
    )
    check(
        x.shape[0] + _NUM_VAL <= num_known,
        name,
        f"ind.{name}.allx has {num_known} rows, fewer than the {x.shape[0]} training + {_NUM_VAL} "
        "validation nodes of the public split",
    )

    # Test rows cover ids test_min..test_max; ids in that range absent from test.index
    # (Citeseer) become zero rows / unlabelled nodes.
    sorted_test = np.sort(test_index)
    test_min = int(sorted_test[0])
    span = int(sorted_test[-1]) - test_min + 1
    tx_full = sp.lil_matrix((span, num_features), dtype=np.float32)
    tx_full[sorted_test - test_min, :] = tx
    ty_full = np.zeros((span, num_classes), dtype=ty.dtype)
    ty_full[sorted_test - test_min, :] = ty
    # Rows num_known..test_min-1 (none in Cora/Citeseer) would have no data either.
    gap = test_min - num_known
    features = sp.vstack([allx, sp.csr_matrix((gap, num_features), dtype=np.float32), tx_full.tocsr()]).tolil()
    onehot = np.vstack([ally, np.zeros((gap, num_classes), dtype=ally.dtype), ty_full])
    # GCN load_data: the i-th tx row belongs to node test_index[i].
    features[test_index, :] = features[sorted_test, :]
    onehot[test_index, :] = onehot[sorted_test, :]
    features = features.tocsr().astype(np.float32)
    features.sort_indices()
    labels = _labels_from_onehot(onehot)
    num_nodes = labels.shape[0]

    edge_index = _graph_edges(loaded["graph"], num_nodes, path_of["graph"], name)

    num_train = x.shape[0]
    train_mask = index_mask(num_nodes, np.arange(num_train))
    val_mask = index_mask(num_nodes, np.arange(num_train, num_train + _NUM_VAL))
    test_mask = index_mask(num_nodes, test_index)
    check(
        bool((labels[train_mask | val_mask | test_mask] >= 0).all()),
        name,
        "the public split contains nodes without a label",
    )
    return GraphDataset(
        name=name,
        features=features,
        labels=labels,
        edge_index=edge_index,
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=int(num_classes),
        node_ids=np.arange(num_nodes, dtype=np.int64),
    )
