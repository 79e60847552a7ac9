"""ACM (paper–author–paper graph from HAN, as packaged by AM-GCN) with the paper's fixed split.

Raw files (``<root>/acm/raw``): ``acm.feature`` (dense 0/1 text matrix, one node per line),
``acm.label`` (one class id per line), ``acm_PAP.edge`` (``i j`` per line, both directions),
``train20.txt`` / ``test20.txt`` (AM-GCN's 20-per-class training list and 1000-node test list).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.benchmarks.rawfiles import check, parsing, read_int_table, require_files
from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.splits import index_mask

ACM_FILES = ("acm.feature", "acm.label", "acm_PAP.edge", "train20.txt", "test20.txt")
ACM_NUM_VAL = 500
ACM_VAL_SEED = 0


def _binary_matrix_fast(raw: bytes) -> np.ndarray | None:
    """Parse a text matrix of single ``0``/``1`` tokens with byte operations, or return None.

    ``acm.feature`` is 5.6 million such tokens; this takes ~0.1 s where ``np.loadtxt`` takes ~1 s.
    Returns None whenever the text is anything else (other tokens, ragged rows), so that the
    caller falls back to the general parser and its error messages.
    """
    data = np.frombuffer(raw, dtype=np.uint8)
    space, newline, zero, one = (ord(c) for c in " \n01")
    is_digit = (data == zero) | (data == one)
    if not bool((is_digit | (data == space) | (data == newline)).all()):
        return None
    if bool((is_digit[1:] & is_digit[:-1]).any()):  # a multi-digit token such as "10"
        return None
    digit_at = np.flatnonzero(is_digit)
    line_ends = np.append(np.flatnonzero(data == newline), data.size)
    per_line = np.diff(np.searchsorted(digit_at, line_ends), prepend=0)
    per_line = per_line[per_line > 0]  # blank lines carry no values
    if per_line.size == 0 or not bool((per_line == per_line[0]).all()):
        return None
    values = (data[digit_at] - zero).astype(np.float32)
    return values.reshape(per_line.size, int(per_line[0]))


def _read_features(path: Path, dataset: str) -> sp.csr_matrix:
    with parsing(path, dataset):
        dense = _binary_matrix_fast(path.read_bytes())
        if dense is None:
            dense = np.loadtxt(path, dtype=np.float32, ndmin=2)
        return sp.csr_matrix(dense)


def load_acm(root: Path) -> GraphDataset:
    """Load ACM from ``<root>/acm/raw``.

    Split: train = ``train20.txt`` (20 per class), test = ``test20.txt`` (1000 nodes), validation =
    500 nodes drawn from the remaining ones with ``np.random.default_rng(0)``. The validation draw is
    deliberately independent of the run seed: the paper (via AM-GCN) uses one fixed split for ACM, so
    repeated runs with different seeds must vary only the model and the client sampling, never which
    nodes are evaluated. (Wiki, which has no published split, draws its split from the run seed.)

    Raises:
        DatasetError: the directory or a file is missing, a file is corrupt, or the files disagree
            about the number of nodes.
    """
    name = "acm"
    paths = require_files(Path(root) / name / "raw", ACM_FILES, name)
    features = _read_features(paths["acm.feature"], name)
    labels = read_int_table(paths["acm.label"], name, 1).ravel()
    edges = read_int_table(paths["acm_PAP.edge"], name, 2)
    train_index = read_int_table(paths["train20.txt"], name, 1).ravel()
    test_index = read_int_table(paths["test20.txt"], name, 1).ravel()

    num_nodes = features.shape[0]
    check(
        labels.shape[0] == num_nodes,
        name,
        f"acm.label has {labels.shape[0]} labels but acm.feature has {num_nodes} rows",
    )
    check(bool((labels >= 0).all()), name, "acm.label contains negative class ids")
    for file, ids in (("acm_PAP.edge", edges), ("train20.txt", train_index), ("test20.txt", test_index)):
        check(
            ids.size == 0 or (ids.min() >= 0 and ids.max() < num_nodes),
            name,
            f"{file} references node ids outside 0..{num_nodes - 1} (acm.feature has {num_nodes} rows)",
        )
    train_mask = index_mask(num_nodes, train_index)
    test_mask = index_mask(num_nodes, test_index)
    check(not bool((train_mask & test_mask).any()), name, "train20.txt and test20.txt overlap")
    rest = np.flatnonzero(~train_mask & ~test_mask)
    check(
        rest.shape[0] >= ACM_NUM_VAL,
        name,
        f"only {rest.shape[0]} nodes are outside train20.txt/test20.txt, {ACM_NUM_VAL} needed for validation",
    )
    rng = np.random.default_rng(ACM_VAL_SEED)
    val_mask = index_mask(num_nodes, rng.choice(rest, size=ACM_NUM_VAL, replace=False))

    return GraphDataset(
        name=name,
        features=features,
        labels=labels,
        edge_index=canonical_edge_index(edges[:, 0], edges[:, 1], num_nodes),
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=int(labels.max()) + 1,
        node_ids=np.arange(num_nodes, dtype=np.int64),
    )
