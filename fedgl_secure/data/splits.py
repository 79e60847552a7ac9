"""Train/validation/test splits: helpers shared by the loaders, and the ``[data]`` split options.

Every dataset comes with its *standard* split (Planetoid's public split, ACM's train20/test20,
20 per class on Wiki and the synthetic graph). The FedGL paper's Table 3 instead draws *random*
splits with few labels — 5/10/15 per class on Cora, Citeseer and Wiki, 15/25/35 on ACM — and
500 validation and 1000 test nodes from the rest; :class:`SplitConfig` chooses between the two
and :func:`apply_split` draws the random one.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.errors import ConfigError, DatasetError
from fedgl_secure.log import get_logger
from fedgl_secure.seeding import numpy_stream
from fedgl_secure.tomlio import field_error

# the fields that shape a random split; under the standard split they must keep their defaults
_RANDOM_SPLIT_FIELDS = ("train_per_class", "val_size", "test_size")


class SplitConfig(BaseModel):
    """The ``[data]`` section of an experiment: which train/validation/test split a run uses."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    split: Literal["standard", "random", "fraction"] = Field(
        "standard",
        description="standard: the dataset's own split (Planetoid public split, ACM train20/test20, Wiki 20 per "
        "class drawn with the seed); random: train_per_class per class, val_size and test_size from the rest, "
        "drawn with the run's seed (the FedGL paper's Table 3); fraction: the labelled nodes shuffled with the "
        "run's seed and cut at `fractions` (Fed²GNN's 40/30/30)",
    )
    fractions: tuple[float, float, float] = Field(
        (0.4, 0.3, 0.3), description="split = 'fraction': train, validation and test shares of the labelled nodes"
    )
    train_per_class: int = Field(
        20, ge=1, description="random split: training labels per class (at most half of a class's nodes)"
    )
    val_size: int = Field(500, ge=1, description="random split: validation nodes")
    test_size: int = Field(1000, ge=1, description="random split: test nodes")

    @model_validator(mode="after")
    def _sizes_need_the_random_split(self) -> SplitConfig:
        # Refused rather than ignored: `--set data.train_per_class=5` without `data.split=random`
        # would otherwise run on the standard split and be reported as a 5-label experiment.
        if self.split != "random":
            for name in _RANDOM_SPLIT_FIELDS:
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise field_error(name, f"applies only to split = 'random', not {self.split!r}")
        if self.split != "fraction" and self.fractions != type(self).model_fields["fractions"].default:
            raise field_error("fractions", f"applies only to split = 'fraction', not {self.split!r}")
        if any(f < 0 for f in self.fractions) or not 0 < sum(self.fractions) <= 1 + 1e-9 or self.fractions[0] <= 0:
            raise field_error(
                "fractions", f"need a positive train share and shares summing to at most 1: {self.fractions}"
            )
        return self


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


def capped_train_per_class(class_counts: np.ndarray, requested: int) -> np.ndarray:
    """Training nodes per class: ``min(requested, count // 2)``.

    A class never gives more than half of its nodes to training, so that every class keeps nodes
    for validation and test (Wiki has classes of 9-11 nodes).
    """
    return np.minimum(int(requested), np.asarray(class_counts, dtype=np.int64) // 2)


def random_split(
    labels: np.ndarray,
    seed: int,
    *,
    train_per_class: int,
    num_val: int,
    num_test: int,
    dataset: str = "dataset",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The paper's Table 3 split: ``train_per_class`` labels per class, then validation and test from the rest.

    Per class ``c`` with ``n_c`` labelled nodes, ``min(train_per_class, n_c // 2)`` training nodes
    (:func:`capped_train_per_class`; a capped class is logged as a warning); then ``num_val``
    validation and ``num_test`` test nodes uniformly from the remaining labelled nodes. The draw
    comes from the run seed's own "split" stream (:func:`fedgl_secure.seeding.numpy_stream`), so it
    is the same on every machine and independent of client sampling and model initialisation.

    Raises:
        ConfigError: too few labelled nodes remain for ``num_val + num_test``; names
            ``data.val_size`` / ``data.test_size``.
    """
    labels = np.asarray(labels)
    labelled = labels[labels >= 0]
    num_classes = int(labels.max()) + 1 if labelled.size else 0
    counts = np.bincount(labelled, minlength=num_classes)
    per_class = capped_train_per_class(counts, train_per_class)
    capped = np.flatnonzero(per_class < train_per_class)
    if capped.size:
        get_logger(dataset=dataset).warning(
            "split.train_per_class_capped",
            requested=int(train_per_class),
            classes={int(c): {"nodes": int(counts[c]), "train": int(per_class[c])} for c in capped},
            reason="a class gives at most half of its nodes to training",
        )
    left = int(labelled.size - per_class.sum())
    if left < num_val + num_test:
        raise ConfigError(
            f"invalid configuration: data.val_size / data.test_size: {dataset} has {labelled.size} labelled nodes; "
            f"{int(per_class.sum())} go to training (data.train_per_class = {train_per_class}), which leaves {left}, "
            f"fewer than data.val_size + data.test_size = {num_val} + {num_test}; lower them"
        )
    return sample_split(
        labels,
        numpy_stream(seed, "split", "random"),
        train_per_class=per_class,
        num_val=num_val,
        num_test=num_test,
        dataset=dataset,
    )


def fraction_split(
    labels: np.ndarray, seed: int, fractions: tuple[float, float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train/val/test masks from the labelled nodes shuffled with the seed's "split"/"fraction" stream and cut
    at ``round(f · n)`` (Fed²GNN's random 40/30/30 split; no per-class quota)."""
    labels = np.asarray(labels)
    labelled = np.flatnonzero(labels >= 0)
    order = numpy_stream(seed, "split", "fraction").permutation(labelled)
    n_train, n_val = int(round(fractions[0] * order.size)), int(round(fractions[1] * order.size))
    n_test = min(int(round(fractions[2] * order.size)), order.size - n_train - n_val)
    cuts = np.cumsum([n_train, n_val, n_test])
    parts = (order[: cuts[0]], order[cuts[0] : cuts[1]], order[cuts[1] : cuts[2]])
    return tuple(index_mask(labels.shape[0], part) for part in parts)


def apply_split(dataset: GraphDataset, split: SplitConfig, seed: int) -> GraphDataset:
    """``dataset`` with the split ``split`` asks for: unchanged for ``standard``, redrawn for ``random``."""
    if split.split == "standard":
        return dataset
    if split.split == "fraction":
        train, val, test = fraction_split(dataset.labels, seed, split.fractions)
        return dataclasses.replace(dataset, train_mask=train, val_mask=val, test_mask=test)
    train, val, test = random_split(
        dataset.labels,
        seed,
        train_per_class=split.train_per_class,
        num_val=split.val_size,
        num_test=split.test_size,
        dataset=dataset.name,
    )
    return dataclasses.replace(dataset, train_mask=train, val_mask=val, test_mask=test)
