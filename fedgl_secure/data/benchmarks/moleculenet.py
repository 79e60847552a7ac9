"""MoleculeNet graph-classification sets (BBBP, BACE, ClinTox, SIDER, Tox21) as lists of molecular graphs.

Each CSV row is one molecule: a SMILES string and one binary column per task (empty = missing label).
RDKit parses the SMILES; atoms become nodes, bonds undirected edges (bond order is dropped: the GCN and
the edge-DP views see a 0/1 adjacency). Node features are one-hot blocks (:data:`FEATURE_BLOCKS`):
element (the 15 commonest in these sets + other), heavy-atom degree (0..5+), formal charge (−2..+2,
clipped), attached hydrogens (0..4+), aromatic, in a ring — 34 values per atom. SMILES that RDKit
cannot parse are skipped and counted (:attr:`MoleculeSet.unparsed`), never silently dropped.

Splits: a seeded random 80/10/10 train/validation/test split (or Bemis–Murcko scaffold groups
assigned in a seeded order), then the training molecules dealt to ``K`` clients in equal random
shares. The FGCL paper's split and client count were not found offline; these are this repository's
choices (docs/privacy.md §6.12).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedgl_secure.data.benchmarks.rawfiles import check, parsing, require_files
from fedgl_secure.errors import DatasetError
from fedgl_secure.seeding import numpy_stream

__all__ = [
    "FILES",
    "Molecule",
    "MoleculeSet",
    "MoleculeSplit",
    "atom_features",
    "deal_to_clients",
    "load_moleculenet",
    "molecule_from_smiles",
    "split_molecules",
]

# dataset -> (file name, SMILES column); every other column except those in _NOT_TASKS is a task.
FILES: dict[str, tuple[str, str]] = {
    "bbbp": ("BBBP.csv", "smiles"),
    "bace": ("bace.csv", "mol"),
    "clintox": ("clintox.csv", "smiles"),
    "sider": ("sider.csv", "smiles"),
    "tox21": ("tox21.csv", "smiles"),
}
# non-task columns of these CSVs (ids, names, BACE's regression target and model-generated descriptors)
_NOT_TASKS = frozenset({"num", "name", "mol_id", "CID", "pIC50", "Model"})
# bace.csv's task is "Class"; its other numeric columns are descriptors, not labels
_TASKS: dict[str, tuple[str, ...]] = {"bace": ("Class",), "bbbp": ("p_np",)}

ELEMENTS = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se", "Na", "K", "H")
FEATURE_BLOCKS = {
    "element": len(ELEMENTS) + 1,
    "degree": 6,
    "formal_charge": 5,
    "hydrogens": 5,
    "aromatic": 1,
    "in_ring": 1,
}
NUM_FEATURES = sum(FEATURE_BLOCKS.values())


@dataclass(frozen=True)
class Molecule:
    """One molecular graph: ``features`` (n × F, float32), ``edges`` (m × 2, i < j, each bond once) and ``labels``
    (T, float32, NaN = missing)."""

    features: np.ndarray
    edges: np.ndarray
    labels: np.ndarray

    @property
    def num_atoms(self) -> int:
        return int(self.features.shape[0])


@dataclass(frozen=True)
class MoleculeSet:
    """A parsed MoleculeNet file: its molecules, task names, SMILES kept, and how many rows failed to parse."""

    name: str
    molecules: list[Molecule]
    tasks: tuple[str, ...]
    smiles: list[str]
    rows: int
    unparsed: int


@dataclass(frozen=True)
class MoleculeSplit:
    """Indices into ``MoleculeSet.molecules``: each client's training molecules, validation and test."""

    clients: list[np.ndarray]
    val: np.ndarray
    test: np.ndarray


def _one_hot(index: int, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.float32)
    out[min(max(index, 0), size - 1)] = 1.0
    return out


def atom_features(atom) -> np.ndarray:
    """The one-hot blocks of :data:`FEATURE_BLOCKS` for one RDKit atom (out-of-range values go to the last slot)."""
    symbol = atom.GetSymbol()
    element = ELEMENTS.index(symbol) if symbol in ELEMENTS else len(ELEMENTS)
    return np.concatenate(
        [
            _one_hot(element, FEATURE_BLOCKS["element"]),
            _one_hot(atom.GetDegree(), FEATURE_BLOCKS["degree"]),
            _one_hot(atom.GetFormalCharge() + 2, FEATURE_BLOCKS["formal_charge"]),
            _one_hot(atom.GetTotalNumHs(), FEATURE_BLOCKS["hydrogens"]),
            np.array([atom.GetIsAromatic(), atom.IsInRing()], dtype=np.float32),
        ]
    )


def molecule_from_smiles(smiles: str, labels: np.ndarray) -> Molecule | None:
    """The graph of one SMILES (hydrogens implicit), or ``None`` when RDKit cannot parse it or it has no atom."""
    from rdkit import Chem, RDLogger  # here: only graph classification needs RDKit

    RDLogger.DisableLog("rdApp.*")  # unparsable SMILES are counted and reported by the loader, not logged per row
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    features = np.stack([atom_features(atom) for atom in mol.GetAtoms()])
    pairs = sorted(
        (min(b.GetBeginAtomIdx(), b.GetEndAtomIdx()), max(b.GetBeginAtomIdx(), b.GetEndAtomIdx()))
        for b in mol.GetBonds()
    )
    edges = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return Molecule(features, edges, np.asarray(labels, dtype=np.float32))


def _label(value: str) -> float:
    value = value.strip()
    if value == "":
        return float("nan")
    number = float(value)
    if number not in (0.0, 1.0):
        raise ValueError(f"label {value!r} is not 0, 1 or empty")
    return number


def load_moleculenet(name: str, root: str | Path) -> MoleculeSet:
    """Parse ``<root>/moleculenet/raw/<file>`` for ``name`` (bbbp, bace, clintox, sider, tox21).

    Raises:
        DatasetError: unknown name, missing file, or a file that is not the expected CSV (the path is named).
    """
    key = name.lower()
    if key not in FILES:
        raise DatasetError(f"moleculenet: unknown dataset {name!r}; choose one of {', '.join(FILES)}")
    file_name, smiles_column = FILES[key]
    path = require_files(Path(root) / "moleculenet" / "raw", [file_name], f"moleculenet/{key}")[file_name]
    molecules, kept, rows, unparsed = [], [], 0, 0
    with parsing(path, f"moleculenet/{key}"):
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            if smiles_column not in header:
                raise ValueError(f"no {smiles_column!r} column in the header {header}")
            tasks = _TASKS.get(key) or tuple(c for c in header if c != smiles_column and c not in _NOT_TASKS)
            if not tasks or any(t not in header for t in tasks):
                raise ValueError(f"task columns {tasks} not in the header {header}")
            for row in reader:
                rows += 1
                labels = np.array([_label(row[t] or "") for t in tasks], dtype=np.float32)
                molecule = molecule_from_smiles(row[smiles_column], labels)
                if molecule is None:
                    unparsed += 1
                    continue
                molecules.append(molecule)
                kept.append(row[smiles_column])
    check(bool(molecules), f"moleculenet/{key}", f"no molecule of {path} could be parsed")
    return MoleculeSet(key, molecules, tasks, kept, rows, unparsed)


def _scaffold_order(smiles: list[str], rng: np.random.Generator) -> np.ndarray:
    """Molecules grouped by Bemis–Murcko scaffold, groups in a seeded random order (a seeded scaffold split)."""
    from rdkit.Chem.Scaffolds import MurckoScaffold

    groups: dict[str, list[int]] = {}
    for index, s in enumerate(smiles):
        groups.setdefault(MurckoScaffold.MurckoScaffoldSmiles(smiles=s, includeChirality=False), []).append(index)
    ordered = [groups[key] for key in sorted(groups)]
    return np.concatenate([np.array(ordered[g]) for g in rng.permutation(len(ordered))])


def split_molecules(
    data: MoleculeSet,
    seed: int,
    num_clients: int,
    method: str = "random",
    fractions: tuple[float, float] = (0.8, 0.1),
) -> MoleculeSplit:
    """Seeded train/validation/test split (``fractions`` = train, validation; the rest is test), then the
    training molecules dealt to ``num_clients`` clients (:func:`deal_to_clients`)."""
    rng = numpy_stream(seed, "moleculenet-split", data.name, method)
    n = len(data.molecules)
    if method == "random":
        order = rng.permutation(n)
    elif method == "scaffold":
        order = _scaffold_order(data.smiles, rng)
    else:
        raise DatasetError(f"moleculenet: unknown split {method!r}; choose 'random' or 'scaffold'")
    n_train, n_val = int(round(fractions[0] * n)), int(round(fractions[1] * n))
    train, val, test = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]
    clients = deal_to_clients(train, num_clients, numpy_stream(seed, "moleculenet-clients", data.name))
    return MoleculeSplit(clients, np.sort(val), np.sort(test))


def deal_to_clients(train: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The training molecules in ``num_clients`` random shares of equal size (± 1), IID."""
    if not 1 <= num_clients <= len(train):
        raise DatasetError(f"moleculenet: cannot deal {len(train)} training molecules to {num_clients} clients")
    shuffled = rng.permutation(train)
    return [np.sort(part) for part in np.array_split(shuffled, num_clients)]
