"""Dataset loaders, the synthetic consortium graph and the registry.

Expected numbers come from the datasets README (verified independently of this code).
"""

from __future__ import annotations

import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.registry import DATASETS, load_dataset, resolve_data_root
from fedgl_secure.errors import ConfigError, DatasetError

# name: (nodes, undirected edges, classes, features, train, val, test)
EXPECTED = {
    "cora": (2708, 5278, 7, 1433, 140, 500, 1000),
    "citeseer": (3327, 4552, 6, 3703, 120, 500, 1000),
    "acm": (3025, 13128, 3, 1870, 60, 500, 1000),
    "wiki": (2405, 11596, 17, 4973, 289, 500, 1000),
}
REAL = tuple(EXPECTED)
RAW_FILES = {
    "cora": [f"ind.cora.{p}" for p in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")],
    "citeseer": [f"ind.citeseer.{p}" for p in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")],
    "acm": ["acm.feature", "acm.label", "acm_PAP.edge", "train20.txt", "test20.txt"],
    "wiki": ["wiki.mat", "graph.txt"],
}
WIKI_CLASS_COUNTS = [92, 406, 203, 103, 10, 361, 157, 53, 109, 11, 269, 179, 9, 30, 77, 228, 108]

Loader = Callable[..., GraphDataset]


@pytest.fixture(scope="module")
def load(data_root: Path) -> Loader:
    """``load(name, seed=0)``, each (name, seed) parsed once per module."""
    cache: dict[tuple[str, int], GraphDataset] = {}

    def get(name: str, seed: int = 0) -> GraphDataset:
        if (name, seed) not in cache:
            cache[(name, seed)] = load_dataset(name, data_root, seed=seed)
        return cache[(name, seed)]

    return get


def assert_well_formed(data: GraphDataset) -> None:
    n = data.num_nodes
    assert sp.isspmatrix_csr(data.features) and data.features.dtype == np.float32
    assert data.features.shape[0] == n
    assert data.labels.dtype == np.int64 and data.labels.max() == data.num_classes - 1
    assert np.array_equal(data.node_ids, np.arange(n))
    src, dst = data.edge_index
    assert data.edge_index.dtype == np.int64
    assert not (src == dst).any()
    keys = src * n + dst
    assert (np.diff(keys) > 0).all(), "edges sorted and unique"
    assert np.array_equal(np.sort(dst * n + src), keys), "symmetric"
    masks = (data.train_mask, data.val_mask, data.test_mask)
    for mask in masks:
        assert mask.dtype == bool and mask.shape == (n,)
        assert (data.labels[mask] >= 0).all(), "split only on labelled nodes"
    assert not (masks[0] & masks[1]).any()
    assert not (masks[0] & masks[2]).any()
    assert not (masks[1] & masks[2]).any()


def edge_homophily(data: GraphDataset) -> float:
    src, dst = data.edge_index
    return float((data.labels[src] == data.labels[dst]).mean())


# --- real datasets ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", REAL)
def test_real_dataset_statistics_and_split(load: Loader, name: str) -> None:
    data = load(name)
    nodes, edges, classes, features, train, val, test = EXPECTED[name]
    assert data.name == name
    assert (data.num_nodes, data.num_undirected_edges, data.num_classes, data.num_features) == (
        nodes,
        edges,
        classes,
        features,
    )
    assert (data.train_mask.sum(), data.val_mask.sum(), data.test_mask.sum()) == (train, val, test)
    assert_well_formed(data)


@pytest.mark.parametrize(("name", "nnz"), [("cora", 49216), ("citeseer", 105165), ("acm", 253300), ("wiki", 1556595)])
def test_features_are_raw_not_normalised(load: Loader, name: str, nnz: int) -> None:
    features = load(name).features
    assert features.nnz == nnz
    if name != "wiki":
        assert set(np.unique(features.data)) == {1.0}


def test_cora_classes_and_public_split(load: Loader) -> None:
    data = load("cora")
    assert np.bincount(data.labels).tolist() == [351, 217, 418, 818, 426, 298, 180]
    assert np.array_equal(np.flatnonzero(data.train_mask), np.arange(140))
    assert np.array_equal(np.flatnonzero(data.val_mask), np.arange(140, 640))
    assert np.array_equal(np.flatnonzero(data.test_mask), np.arange(1708, 2708))
    assert np.bincount(data.labels[data.train_mask]).tolist() == [20] * 7


def test_cora_node_order_follows_test_index(load: Loader, data_root: Path) -> None:
    """GCN load_data convention: the i-th row of ``tx`` belongs to node ``test.index[i]``."""
    raw = data_root / "cora" / "raw"
    with (raw / "ind.cora.tx").open("rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tx = pickle.load(f, encoding="latin1")
    test_index = np.loadtxt(raw / "ind.cora.test.index", dtype=np.int64)
    data = load("cora")
    for row in (0, 1, 500, 999):
        assert (data.features[test_index[row]] != tx[row]).nnz == 0


def test_citeseer_padded_nodes_are_unlabelled(load: Loader) -> None:
    data = load("citeseer")
    missing = [2407, 2489, 2553, 2682, 2781, 2953, 3042, 3063, 3212, 3214, 3250, 3292, 3305, 3306, 3309]
    assert np.flatnonzero(data.labels < 0).tolist() == missing
    assert np.flatnonzero(np.diff(data.features.indptr) == 0).tolist() == missing
    assert np.bincount(data.labels[data.labels >= 0]).tolist() == [249, 590, 668, 701, 596, 508]
    assert np.bincount(data.labels[data.train_mask]).tolist() == [20] * 6


def test_acm_split_is_fixed_across_seeds(load: Loader) -> None:
    a, b = load("acm", 0), load("acm", 3)
    assert np.bincount(a.labels).tolist() == [1061, 965, 999]
    assert np.bincount(a.labels[a.train_mask]).tolist() == [20, 20, 20]
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, mask), getattr(b, mask))


def test_wiki_split_depends_on_seed_only(load: Loader, data_root: Path) -> None:
    a = load("wiki", 0)
    assert np.bincount(a.labels).tolist() == WIKI_CLASS_COUNTS
    per_class = np.bincount(a.labels[a.train_mask], minlength=17)
    assert per_class.tolist() == [min(20, c // 2) for c in WIKI_CLASS_COUNTS]
    again = load_dataset("wiki", data_root, seed=0)
    other = load("wiki", 1)
    assert np.array_equal(other.labels, a.labels)
    assert other.num_undirected_edges == a.num_undirected_edges
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(again, mask), getattr(a, mask))
        assert not np.array_equal(getattr(other, mask), getattr(a, mask))


# --- synthetic ---------------------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    a, b, c = synthetic_consortium(0), synthetic_consortium(0), synthetic_consortium(1)
    for field in ("labels", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert (a.features != b.features).nnz == 0
    assert not np.array_equal(a.edge_index, c.edge_index) or not np.array_equal(a.labels, c.labels)
    assert (a.features != c.features).nnz > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_looks_like_a_customer_graph(seed: int) -> None:
    data = synthetic_consortium(seed)
    assert data.name == "synthetic"
    assert (data.num_nodes, data.num_classes, data.num_features) == (1200, 4, 100)
    assert_well_formed(data)
    assert 0.65 <= edge_homophily(data) <= 0.8
    assert 6.0 <= 2 * data.num_undirected_edges / data.num_nodes <= 8.0
    assert np.bincount(data.labels[data.train_mask]).tolist() == [20] * 4
    assert (data.val_mask.sum(), data.test_mask.sum()) == (300, 500)
    assert set(np.unique(data.features.data)) == {1.0}
    # Features carry class signal: each class's mean profile is closest to its own members.
    dense = data.features.toarray()
    centroids = np.stack([dense[data.labels == c].mean(0) for c in range(4)])
    assert np.mean(np.argmax(dense @ centroids.T, axis=1) == data.labels) > 0.45, (
        "nearest class centroid beats chance (0.25)"
    )


def test_synthetic_scales_without_dense_adjacency() -> None:
    data = synthetic_consortium(0, num_nodes=20000, num_classes=5, num_features=50)
    assert sp.issparse(data.features) and data.edge_index.shape[1] < 20000 * 20  # sparse throughout
    assert 6.0 <= 2 * data.num_undirected_edges / data.num_nodes <= 8.0
    assert 0.65 <= edge_homophily(data) <= 0.8


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"seed": -1}, "seed"),
        ({"num_classes": 1}, "num_classes"),
        ({"num_nodes": 500}, "num_nodes"),
        ({"homophily": 1.5}, "homophily"),
        ({"average_degree": 0.0}, "average_degree"),
        ({"average_degree": 5000.0}, "average_degree"),
        ({"prototypes_per_class": 30}, "prototypes_per_class"),
        ({"prototype_prob": -0.1}, "prototype_prob"),
        ({"noise_prob": 2.0}, "noise_prob"),
        ({"num_test": 0}, "num_test"),
    ],
)
def test_synthetic_rejects_bad_arguments(kwargs: dict, argument: str) -> None:
    with pytest.raises(ConfigError, match=argument):
        synthetic_consortium(**kwargs)


# --- registry ----------------------------------------------------------------------------------


def test_registry_names_and_synthetic_needs_no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDGL_DATA", raising=False)
    assert DATASETS == ("synthetic", "cora", "citeseer", "acm", "wiki")
    data = load_dataset("synthetic", seed=3)
    assert np.array_equal(data.edge_index, synthetic_consortium(3).edge_index)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="pubmed.*synthetic, cora, citeseer, acm, wiki"):
        load_dataset("pubmed", "/nonexistent")


def test_data_root_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.mkdir()
    env.mkdir()
    monkeypatch.setenv("FEDGL_DATA", str(env))
    assert resolve_data_root(flag) == flag
    assert resolve_data_root(str(flag)) == flag
    assert resolve_data_root(None) == env
    monkeypatch.delenv("FEDGL_DATA")
    with pytest.raises(DatasetError, match="--data-root.*FEDGL_DATA"):
        resolve_data_root(None)
    with pytest.raises(DatasetError, match="does not exist"):
        resolve_data_root(tmp_path / "absent")


# --- errors ------------------------------------------------------------------------------------


def mirror_raw(data_root: Path, name: str, tmp_path: Path, copy: str | None = None) -> Path:
    """``tmp_path/<name>/raw`` with symlinks to the real files, except ``copy`` (a real copy)."""
    target = tmp_path / name / "raw"
    target.mkdir(parents=True)
    for file in RAW_FILES[name]:
        source = data_root / name / "raw" / file
        if file == copy:
            shutil.copyfile(source, target / file)
        else:
            (target / file).symlink_to(source)
    return target


@pytest.mark.parametrize("name", REAL)
def test_missing_directory_is_reported(tmp_path: Path, name: str) -> None:
    directory = re.escape(str(tmp_path / name / "raw"))
    with pytest.raises(DatasetError, match=f"{name}: dataset directory {directory} does not exist"):
        load_dataset(name, tmp_path)


@pytest.mark.parametrize(("name", "missing"), [(n, files[-1]) for n, files in RAW_FILES.items()])
def test_missing_file_is_named(data_root: Path, tmp_path: Path, name: str, missing: str) -> None:
    raw = mirror_raw(data_root, name, tmp_path)
    (raw / missing).unlink()
    with pytest.raises(DatasetError) as info:
        load_dataset(name, tmp_path)
    assert missing in str(info.value) and str(raw) in str(info.value)


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("cora", "ind.cora.graph"),
        ("citeseer", "ind.citeseer.allx"),
        ("acm", "acm.feature"),
        ("acm", "acm_PAP.edge"),
        ("wiki", "wiki.mat"),
    ],
)
def test_truncated_file_is_reported(data_root: Path, tmp_path: Path, name: str, file: str) -> None:
    raw = mirror_raw(data_root, name, tmp_path, copy=file)
    content = (raw / file).read_bytes()
    (raw / file).write_bytes(content[: len(content) // 2 + 7])
    with pytest.raises(DatasetError, match=file):
        load_dataset(name, tmp_path)


def test_inconsistent_label_count_is_reported(data_root: Path, tmp_path: Path) -> None:
    raw = mirror_raw(data_root, "acm", tmp_path, copy="acm.label")
    lines = (raw / "acm.label").read_text().splitlines()
    (raw / "acm.label").write_text("\n".join(lines[:-5]) + "\n")
    with pytest.raises(DatasetError, match="acm.label has 3020 labels but acm.feature has 3025 rows"):
        load_dataset("acm", tmp_path)


def test_non_numeric_edge_file_is_reported(data_root: Path, tmp_path: Path) -> None:
    raw = mirror_raw(data_root, "wiki", tmp_path, copy="graph.txt")
    (raw / "graph.txt").write_text("0\t1\n2\tbanana\n")
    with pytest.raises(DatasetError, match="graph.txt"):
        load_dataset("wiki", tmp_path)


def test_out_of_range_edge_is_reported(data_root: Path, tmp_path: Path) -> None:
    raw = mirror_raw(data_root, "wiki", tmp_path, copy="graph.txt")
    (raw / "graph.txt").write_text("0\t1\n2\t99999\n")
    with pytest.raises(DatasetError, match="graph.txt references node ids outside"):
        load_dataset("wiki", tmp_path)


def test_pickle_with_foreign_global_is_refused(data_root: Path, tmp_path: Path) -> None:
    """Planetoid pickles may only reference numpy/scipy/collections, never e.g. ``os.system``."""
    raw = mirror_raw(data_root, "cora", tmp_path, copy="ind.cora.y")
    (raw / "ind.cora.y").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(DatasetError, match=r"ind\.cora\.y.*refusing to load global os\.system"):
        load_dataset("cora", tmp_path)
