"""PyG ``Data`` out of and into the project's graph type, and PyG's own Planetoid reader against ours on the
offline files (shared/datasets' README has the verified statistics)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import Planetoid
from torch_geometric.utils import coalesce

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.errors import DatasetError


def assert_same_graph(a: GraphDataset, b: GraphDataset) -> None:
    assert (a.features != b.features).nnz == 0 and a.features.shape == b.features.shape
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.edge_index, b.edge_index)
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, mask), getattr(b, mask)), mask
    assert a.num_classes == b.num_classes and np.array_equal(a.node_ids, b.node_ids)


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_consortium(seed=0, num_nodes=200, num_val=30, num_test=40)


def test_a_graph_goes_to_pyg_and_back_unchanged(synthetic):
    data = synthetic.to_pyg()
    assert isinstance(data, Data) and data.num_nodes == synthetic.num_nodes
    assert data.x.shape == (200, synthetic.num_features) and data.x.dtype == torch.float32
    assert data.edge_index.shape == synthetic.edge_index.shape and data.is_undirected()
    assert int(data.train_mask.sum()) == int(synthetic.train_mask.sum()) and data.num_classes == synthetic.num_classes
    assert_same_graph(GraphDataset.from_pyg(data), synthetic)


def test_bank_customer_keys_travel_as_they_are(synthetic):
    keys = np.array([f"customer-{i:04d}" for i in range(synthetic.num_nodes)])
    graph = GraphDataset(**{**synthetic.__dict__, "node_ids": keys})
    assert np.array_equal(GraphDataset.from_pyg(graph.to_pyg()).node_ids, keys)


def test_a_directed_pyg_graph_comes_in_undirected_without_loops_or_duplicates():
    data = Data(
        x=torch.eye(4),
        y=torch.tensor([0, 1, 0, -1]),
        edge_index=torch.tensor([[0, 1, 1, 2, 3], [1, 2, 2, 2, 0]]),
        train_mask=torch.tensor([True, False, False, False]),
    )
    graph = GraphDataset.from_pyg(data, name="mine")
    assert graph.edge_index.T.tolist() == [[0, 1], [0, 3], [1, 0], [1, 2], [2, 1], [3, 0]]
    assert graph.num_classes == 2 and not graph.val_mask.any() and graph.name == "mine"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"x": None}, r"no node features \(data\.x\)"),
        ({"y": torch.zeros(3, 2)}, r"data\.y must hold one integer class id per node \(3\)"),
        ({"edge_index": torch.tensor([[0], [5]])}, r"edge_index refers to nodes outside 0\.\.2"),
        ({"val_mask": torch.tensor([1, 0, 0])}, r"data\.val_mask must be a bool vector of 3 entries"),
        ({"test_mask": torch.tensor([False, False, True])}, r"data\.test_mask holds nodes without a label"),
        ({"val_mask": torch.tensor([True, False, False])}, r"train_mask, val_mask and test_mask overlap"),
    ],
)
def test_a_pyg_graph_that_does_not_fit_is_refused_by_name(change, message):
    fields = {
        "x": torch.ones(3, 2),
        "y": torch.tensor([0, 1, -1]),
        "edge_index": torch.tensor([[0], [1]]),
        "train_mask": torch.tensor([True, False, False]),
    }
    with pytest.raises(DatasetError, match=message):
        GraphDataset.from_pyg(Data(**{**fields, **change}), name="bad")


def pyg_planetoid(data_root: Path, name: str, tmp_path: Path):
    """PyG's ``Planetoid`` on a copy of the offline raw files (it writes its processed/ folder beside raw/, and the
    shared data root stays read-only)."""
    shutil.copytree(data_root / name / "raw", tmp_path / name / "raw")
    return Planetoid(str(tmp_path), name)[0]


@pytest.mark.parametrize("name, unlabelled", [("cora", 0), ("citeseer", 15)])
def test_pygs_planetoid_reader_agrees_with_ours_except_on_citeseers_featureless_nodes(
    data_root, tmp_path, name, unlabelled
):
    """Same features, edges and public split; Citeseer's 15 ids that test.index skips have no features and no
    label (README: 3312 of 3327 labelled), which PyG's reader turns into class 0 (the argmax of an all-zero row),
    and ours into -1 — why the project keeps its own reader, and PyG's Data comes from ``to_pyg()``."""
    theirs = pyg_planetoid(data_root, name, tmp_path)
    ours = load_dataset(name, data_root)
    data = ours.to_pyg()
    assert torch.equal(theirs.x, data.x)
    assert torch.equal(coalesce(theirs.edge_index, num_nodes=ours.num_nodes), data.edge_index)  # PyG's by target
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(theirs, mask), getattr(data, mask)), mask
    differ = theirs.y != data.y
    assert int(differ.sum()) == unlabelled == int((data.y < 0).sum())
    assert bool((theirs.y[differ] == 0).all()) and not bool(theirs.x[differ].any())
