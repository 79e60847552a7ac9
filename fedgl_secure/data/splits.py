"""Train/validation/test split helpers shared by the loaders and the synthetic generator."""

from __future__ import annotations

import numpy as np

from fedgl_secure.errors import DatasetError


def index_mask(num_nodes: int, index: np.ndarray) -> np.ndarray:
    """Boolean mask of length ``num_nodes`` that is True exactly at ``index``."""
    mask = np.zeros(num_nodes, dtype=bool)
    mask[np.asarray(index, dtype=np.int64)] = True
    return mask


def sample_split(
    labels: np.ndarray,
    rng: np.random.Generator,
    *,
    train_per_class: np.ndarray,
    num_val: int,
    num_test: int,
    exclude: np.ndarray | None = None,
    dataset: str = "dataset",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw disjoint train/val/test masks over the labelled nodes.

    ``train_per_class[c]`` training nodes are drawn uniformly from class ``c``; then ``num_val``
    validation and ``num_test`` test nodes are drawn uniformly from the remaining labelled nodes
    (not in ``exclude``). Only ``rng`` decides the draw, so the same generator state gives the same
    split on every machine.

    Raises:
        DatasetError: a class has fewer nodes than requested, or too few nodes remain for
            validation and test.
    """
    labels = np.asarray(labels)
    num_nodes = labels.shape[0]
    available = labels >= 0
    if exclude is not None:
        available &= ~exclude
    train: list[np.ndarray] = []
    for cls, count in enumerate(np.asarray(train_per_class, dtype=np.int64)):
        members = np.flatnonzero(available & (labels == cls))
        if members.shape[0] < count:
            raise DatasetError(f"{dataset}: class {cls} has {members.shape[0]} available nodes, {count} requested")
        train.append(rng.choice(members, size=int(count), replace=False))
    train_index = np.concatenate(train) if train else np.empty(0, dtype=np.int64)
    train_mask = index_mask(num_nodes, train_index)
    rest = np.flatnonzero(available & ~train_mask)
    if rest.shape[0] < num_val + num_test:
        raise DatasetError(
            f"{dataset}: {rest.shape[0]} labelled nodes remain after training selection, "
            f"{num_val} validation + {num_test} test requested"
        )
    chosen = rng.choice(rest, size=num_val + num_test, replace=False)
    return (
        train_mask,
        index_mask(num_nodes, chosen[:num_val]),
        index_mask(num_nodes, chosen[num_val:]),
    )
