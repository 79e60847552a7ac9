"""One entry point from a dataset name (as typed on the command line) to a :class:`GraphDataset`.

Real datasets are read from a *data root* holding ``<name>/raw/<files>`` (the layout of
``shared/datasets``). The root is never baked into the package: it comes from ``--data-root`` or
the ``FEDGL_DATA`` environment variable, so an installed package works on any machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedgl_secure.data.benchmarks.acm import load_acm
from fedgl_secure.data.benchmarks.planetoid import PLANETOID_NAMES, load_planetoid
from fedgl_secure.data.benchmarks.synthetic import SYNTHETIC_NAME, synthetic_consortium
from fedgl_secure.data.benchmarks.wiki import load_wiki
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.splits import SplitConfig, apply_split
from fedgl_secure.errors import ConfigError, DatasetError

DATASETS = ("synthetic", "cora", "citeseer", "acm", "wiki")
DATA_ROOT_ENV = "FEDGL_DATA"


def resolve_data_root(data_root: str | Path | None) -> Path:
    """The data root: ``data_root`` if given, else ``$FEDGL_DATA``.

    Raises:
        DatasetError: neither is set, or the chosen directory does not exist.
    """
    if data_root is not None and str(data_root) != "":
        root, origin = Path(data_root), "--data-root"
    elif os.environ.get(DATA_ROOT_ENV):
        root, origin = Path(os.environ[DATA_ROOT_ENV]), DATA_ROOT_ENV
    else:
        raise DatasetError(
            f"no dataset directory given: pass --data-root DIR or set {DATA_ROOT_ENV}=DIR "
            "(DIR holds <dataset>/raw/..., e.g. the shared/datasets folder)"
        )
    root = root.expanduser()
    if not root.is_dir():
        raise DatasetError(f"data root {root} (from {origin}) does not exist or is not a directory")
    return root


def load_dataset(
    name: str, data_root: str | Path | None = None, seed: int = 0, split: SplitConfig | None = None
) -> GraphDataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) with the split ``split`` asks for.

    ``seed`` matters only where the data or split is drawn at random: ``synthetic`` (the whole
    graph), ``wiki`` (its split) and any dataset under ``split.split = "random"``. Cora, Citeseer
    and ACM have fixed published splits. ``synthetic`` needs no data root. ``split`` None is the
    dataset's standard split.

    Raises:
        ConfigError: unknown dataset name (the message lists the valid ones), or a random split
            that does not fit the dataset (naming the ``data.*`` field).
        DatasetError: the data root or a dataset file is missing or corrupt.
    """
    dataset = _load_standard(name, data_root, seed)
    return apply_split(dataset, split, seed) if split is not None else dataset


def _load_standard(name: str, data_root: str | Path | None, seed: int) -> GraphDataset:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in DATASETS:
        raise ConfigError(f"dataset: unknown dataset {name!r}; valid names are {', '.join(DATASETS)}")
    if key == SYNTHETIC_NAME:
        return synthetic_consortium(seed=seed)
    root = resolve_data_root(data_root)
    if key in PLANETOID_NAMES:
        return load_planetoid(key, root)
    if key == "acm":
        return load_acm(root)
    return load_wiki(root, seed=seed)
