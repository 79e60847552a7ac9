"""A bank's state directory: what it keeps between starts and after the run, and how each file is read back.

The privacy ledger (``privacy-ledger.json``), the graph after its edge release and the label release (kept with the
settings they were made under, :mod:`~fedgl_secure.consortium.kept_release`: a restart reuses them instead of drawing
and paying for them again), a method's own release (GAP's hops), the union index (M and this bank's positions, for
scoring after the run), Fed²GNN's exchange sums, and the federation's final model for ``predict``. Each reader
refuses, naming the file, what does not fit the bank's graph or the policy's settings.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.consortium.kept_release import SETTINGS, keep_release, take_back_release
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError
from fedgl_secure.fileio import write_arrays_atomically, write_atomically
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.label_release import LabelRelease

LEDGER_FILE = "privacy-ledger.json"
PREPARED_GRAPH_FILE = "privacy-graph.npz"  # the graph after edge DP, kept so a restart does not re-draw it
LABEL_RELEASE_FILE = "privacy-labels.npz"  # the labels after label DP (and their likelihood rows), likewise
METHOD_RELEASE_FILE = "privacy-method-release.npz"  # what a method released inside the bank once (GAP's hops)
INDEX_FILE = "union-index.npz"  # M and this bank's positions in the union index (for scoring after the run)
FINAL_MODEL_FILE = "final-model.npz"  # the federation's final model (the broadcast bytes), for predict
FINAL_META_FILE = "final-model.json"  # which version that is, and of which federation
EXCHANGE_FILE = "fed2gnn-exchange.npz"  # Fed²GNN: the sums the set-up exchange gave this bank (a restart reuses them)
EXCHANGE_KEY_FILE = "fed2gnn-exchange.key"  # and its key for the exchange under way (a restart republishes it)


def save_union_index(state_dir: Path, size: int, positions: np.ndarray) -> None:
    write_arrays_atomically(state_dir / INDEX_FILE, num_global_nodes=size, positions=positions)


def bank_graph_tensors(
    state_dir: Path, graph: GraphDataset, device: torch.device, normalize_features: bool
) -> GraphTensors:
    """The bank's graph with its rows at their union-index positions (saved at enrolment), as the federation
    placed them: what ``predict`` scores and the audit's bank view attacks. Refused (naming the directory) when
    the bank's tables no longer hold the customers the federation ran with."""
    size, positions = load_union_index(state_dir)
    if positions.shape != (graph.num_nodes,):
        raise ConfigError(
            f"{state_dir}: the union index holds {positions.size} positions, but the bank's tables now hold "
            f"{graph.num_nodes} customers; the data changed since the federation ran"
        )
    return GraphTensors.from_graph(graph, positions, size, device, normalize_features)


def load_union_index(state_dir: Path) -> tuple[int, np.ndarray]:
    path = state_dir / INDEX_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: no union index; this bank has not enrolled in the federation yet")
    with np.load(path, allow_pickle=False) as archive:
        return int(archive["num_global_nodes"]), archive["positions"].astype(np.int64)


RELEASE_FIELDS = frozenset({"mechanism", "epsilon", "stages", "stage_order", "prior", "prior_temperature"})
"""The ``[dp.labels]`` fields a label release depends on; the others (``correction``...) only change how the bank
trains on it. A new field that changes the release belongs here."""


def release_settings(policy: Policy) -> dict:
    """The ``[dp.labels]`` settings a label release depends on (:data:`RELEASE_FIELDS`): a kept release is reused
    only under the same ones, and a field added later that only changes training leaves kept releases valid."""
    return policy.dp.labels.model_dump(mode="json", include=set(RELEASE_FIELDS))


def edge_release_settings(policy: Policy) -> dict:
    """What a bank's prepared graph depends on: ``[dp.edges]`` (mechanism, ε, weighting) and the degree bound it
    was cut to, if any. A kept graph is reused only under the same ones."""
    bound = policy.dp.graph.max_degree if policy.dp.needs_degree_bound else None
    return {"edges": policy.dp.edges.model_dump(mode="json"), "max_degree": bound}


def save_prepared_graph(path: Path, graph: sp.spmatrix, settings: dict) -> None:
    """A bank's graph after its edge release (CSR arrays) and the settings it was made under, atomically
    (:func:`~fedgl_secure.consortium.kept_release.keep_release`)."""
    graph = sp.csr_matrix(graph, dtype=np.float64)
    keep_release(
        path,
        settings,
        data=graph.data,
        indices=graph.indices.astype(np.int64),
        indptr=graph.indptr.astype(np.int64),
        shape=np.asarray(graph.shape, dtype=np.int64),
    )


def load_prepared_graph(path: Path, settings: dict, num_nodes: int, log) -> sp.csr_matrix:
    """The graph :func:`save_prepared_graph` kept, refused (naming the file and both settings) when it was made
    under other edge settings — it would not be the release the ledger paid for — or for a graph of another size.
    A file of an earlier version (no settings kept) is reused as it is, with a warning."""
    with np.load(path, allow_pickle=False) as archive:
        legacy = SETTINGS not in archive.files
    if legacy:
        log.warning("privacy.graph_without_settings", path=str(path), reused="as is")
        graph = sp.csr_matrix(sp.load_npz(path), dtype=np.float64)
    else:
        arrays = take_back_release(path, settings, "a graph released", "the edge settings")
        shape = tuple(int(n) for n in arrays["shape"])
        graph = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)
    if graph.shape != (num_nodes, num_nodes):
        raise ConfigError(f"{path}: a graph of {graph.shape[0]} nodes, but this bank's graph has {num_nodes}")
    return graph


def save_label_release(path: Path, release: LabelRelease, settings: dict) -> None:
    """A bank's label release (labels; the likelihood rows when the mechanism keeps them) and the ``[dp.labels]``
    settings it was made under (:func:`~fedgl_secure.consortium.kept_release.keep_release`)."""
    arrays = {"labels": np.asarray(release.labels, dtype=np.int64)}
    if release.likelihood is not None:
        arrays["likelihood"] = np.asarray(release.likelihood, dtype=np.float64)
    keep_release(path, settings, **arrays)


def load_label_release(path: Path, settings: dict, num_nodes: int) -> LabelRelease:
    """The release :func:`save_label_release` kept, refused (naming the file) when it was made under other
    ``[dp.labels]`` settings or for a graph of another size: it would not be the release the ledger paid for."""
    arrays = take_back_release(path, settings, "a label release", "dp.labels")
    labels, likelihood = arrays["labels"].astype(np.int64), arrays.get("likelihood")
    if labels.shape != (num_nodes,) or (likelihood is not None and likelihood.shape[0] != num_nodes):
        raise ConfigError(f"{path}: a label release of {labels.shape[0]} nodes, but this bank's graph has {num_nodes}")
    return LabelRelease(labels, likelihood)


def load_exchange_sums(state_dir: Path, hops: int) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """Fed²GNN: the boundary and E_1..E_K this bank's exchange gave it (None before the exchange finished)."""
    path = state_dir / EXCHANGE_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as archive:
        return archive["boundary"], [archive[f"level_{k}"] for k in range(1, hops + 1)]


def save_final_model(state_dir: Path, federation: str, version: int, data: bytes) -> None:
    """The final broadcast's bytes, then the note naming it (a torn pair is never read as final)."""
    write_atomically(state_dir / FINAL_MODEL_FILE, data)
    meta = {"federation": federation, "version": version, "sha256": hashlib.sha256(data).hexdigest()}
    write_atomically(state_dir / FINAL_META_FILE, json.dumps(meta).encode())


def load_final_model(state_dir: Path, federation: str) -> tuple[int, bytes] | None:
    """(version, bytes) of the saved final model, or None when this bank has none (or a damaged one)."""
    meta_path, model_path = state_dir / FINAL_META_FILE, state_dir / FINAL_MODEL_FILE
    if not meta_path.is_file() or not model_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        data = model_path.read_bytes()
        if meta.get("federation") != federation or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return None
        return int(meta["version"]), data
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # unreadable or damaged: fetch it again
        return None
