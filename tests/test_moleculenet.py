"""MoleculeNet graph classification: parsing, the masked loss, the edge-RR views, and a secure FedAvg round."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgl_secure.crypto.secure_summation import SecureSummation
from fedgl_secure.data.benchmarks.moleculenet import (
    FEATURE_BLOCKS,
    NUM_FEATURES,
    load_moleculenet,
    molecule_from_smiles,
    split_molecules,
)
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.errors import DatasetError
from fedgl_secure.methods.base import WEIGHTS, split_weights_sum
from fedgl_secure.methods.fgcl_graphs import GraphFederationConfig, run_graph_federation
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.graph_classifier import GCNGraphClassifier, make_batch, masked_bce
from fedgl_secure.privacy.edge_mechanisms import flip_probability
from fedgl_secure.privacy.molecule_views import randomized_response_molecule

SMILES = ["CCO", "c1ccccc1", "CC(=O)O", "[NH4+]", "C1CCCCC1N", "CCN(CC)CC", "OC(=O)c1ccccc1O", "CCCCCl"]


def _write_set(root: Path, rows: list[str], header: str = "smiles,p_np") -> Path:
    raw = root / "moleculenet" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "BBBP.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    return root


@pytest.mark.parametrize(
    ("smiles", "atoms", "bonds"),
    [("CCO", 3, 2), ("c1ccccc1", 6, 6), ("CC(=O)O", 4, 3), ("OC(=O)c1ccccc1O", 10, 10), ("[NH4+]", 1, 0)],
)
def test_smiles_become_graphs_with_the_right_atoms_and_bonds(smiles, atoms, bonds):
    molecule = molecule_from_smiles(smiles, np.array([1.0]))
    assert molecule.num_atoms == atoms and len(molecule.edges) == bonds
    assert molecule.features.shape == (atoms, NUM_FEATURES)
    assert np.all(molecule.edges[:, 0] < molecule.edges[:, 1]) if bonds else True
    # one hot per block (element, degree, charge, hydrogens) plus the aromatic and ring bits
    assert np.all(molecule.features[:, : NUM_FEATURES - 2].sum(axis=1) == 4)


def test_features_say_aromatic_and_charge():
    benzene = molecule_from_smiles("c1ccccc1", np.array([0.0]))
    assert np.all(benzene.features[:, -2] == 1) and np.all(benzene.features[:, -1] == 1)
    ammonium = molecule_from_smiles("[NH4+]", np.array([0.0]))
    charge_start = FEATURE_BLOCKS["element"] + FEATURE_BLOCKS["degree"]
    assert ammonium.features[0, charge_start + 3] == 1  # formal charge +1 (slot = charge + 2)


def test_loader_counts_unparsable_smiles_and_keeps_missing_labels(tmp_path):
    root = _write_set(tmp_path, ["CCO,1", "not_a_smiles,0", "c1ccccc1,", "CC(=O)O,0"])
    data = load_moleculenet("bbbp", root)
    assert (data.rows, data.unparsed, len(data.molecules)) == (4, 1, 3)
    assert data.tasks == ("p_np",)
    assert [float(m.labels[0]) if not math.isnan(m.labels[0]) else None for m in data.molecules] == [1.0, None, 0.0]


def test_loader_errors_name_the_file(tmp_path):
    with pytest.raises(DatasetError, match=r"BBBP\.csv"):
        load_moleculenet("bbbp", tmp_path)
    root = _write_set(tmp_path, ["CCO,yes"])
    with pytest.raises(DatasetError, match=r"BBBP\.csv.*'yes'"):
        load_moleculenet("bbbp", root)
    root = _write_set(tmp_path, ["CCO,1"], header="molecule,p_np")
    with pytest.raises(DatasetError, match=r"BBBP\.csv.*'smiles'"):
        load_moleculenet("bbbp", root)


def test_missing_labels_are_masked_in_the_loss():
    logits = torch.tensor([[2.0, -1.0], [0.5, 3.0]], requires_grad=True)
    labels = torch.tensor([[1.0, float("nan")], [float("nan"), 0.0]])
    loss = masked_bce(logits, labels)
    expected = (torch.nn.functional.softplus(torch.tensor(-2.0)) + torch.nn.functional.softplus(torch.tensor(3.0))) / 2
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    loss.backward()
    assert logits.grad[0, 1] == 0 and logits.grad[1, 0] == 0 and logits.grad[0, 0] != 0


def test_randomised_response_flips_each_pair_with_the_stated_probability():
    n = 220  # 24,090 atom pairs
    rng = np.random.default_rng(0)
    i, j = np.triu_indices(n, k=1)
    chosen = rng.choice(i.size, size=3000, replace=False)
    edges = np.stack([i[chosen], j[chosen]], axis=1)
    for epsilon in (0.5, 2.0):
        p = flip_probability(epsilon)
        released = randomized_response_molecule(n, edges, epsilon)
        before = np.zeros((n, n), dtype=bool)
        after = np.zeros((n, n), dtype=bool)
        before[edges[:, 0], edges[:, 1]] = True
        after[released[:, 0], released[:, 1]] = True
        flipped = (before ^ after)[i, j]
        on_edges, on_non_edges = flipped[before[i, j]], flipped[~before[i, j]]
        for sample in (on_edges, on_non_edges):  # both directions flip with p, within 5 standard errors
            assert abs(sample.mean() - p) < 5 * math.sqrt(p * (1 - p) / sample.size)
        assert np.all(released[:, 0] < released[:, 1])


def test_fgcl_views_compose_and_fed_noise_needs_epsilon():
    assert GraphFederationConfig(method="fgcl_noise", view_epsilons=(0.5, 1.5)).epsilon_spent() == 2.0
    assert GraphFederationConfig(method="fed_noise", epsilon=1.0).epsilon_spent() == 1.0
    with pytest.raises(ValueError, match="needs epsilon"):
        GraphFederationConfig(method="fed_noise")


def test_the_classifier_pools_each_molecule_separately():
    molecules = [molecule_from_smiles(s, np.array([1.0])) for s in SMILES[:3]]
    model = GCNGraphClassifier(NUM_FEATURES, 8, 1)
    together = model(
        make_batch([m.features for m in molecules], [m.edges for m in molecules], [m.labels for m in molecules])
    )[0]
    alone = [model(make_batch([m.features], [m.edges], [m.labels]))[0] for m in molecules]
    assert torch.allclose(together, torch.cat(alone), atol=1e-6)


class _Both:
    """Sums each round through CKKS and in plaintext, returns the CKKS sums, and keeps both."""

    def __init__(self, secure):
        self.secure, self.plain, self.rounds = secure, PlaintextSummation(), []

    def __call__(self, round_number, contributions, reference=None):
        secure = self.secure(round_number, contributions, reference=reference)
        self.rounds.append((secure, self.plain(round_number, contributions, reference=reference)))
        return secure


def test_one_federated_round_under_secure_summation_equals_plaintext(tmp_path, small_policy):
    rows = [f"{s},{k % 2}" for k, s in enumerate(SMILES * 3)]
    data = load_moleculenet("bbbp", _write_set(tmp_path, rows))
    split = split_molecules(data, seed=0, num_clients=3)
    config = GraphFederationConfig(
        method="fgcl_noise", view_epsilons=(1.0, 1.0), rounds=1, hidden=4, num_layers=2, batch_size=4
    )
    summation = SecureSummation(small_policy)
    both = _Both(summation)
    try:
        run_graph_federation(data, split, config, both)
    finally:
        summation.close()
    ((secure, plain),) = both.rounds
    assert set(secure) == set(plain) == {WEIGHTS}
    scale = max(1.0, float(plain[WEIGHTS].abs().max()))
    assert float((secure[WEIGHTS] - plain[WEIGHTS]).abs().max()) <= 1e-6 * scale
    w_secure, w_plain = (fedavg(*split_weights_sum(s[WEIGHTS].double())) for s in (secure, plain))
    assert float((w_secure - w_plain).abs().max()) <= 1e-6
    assert split_weights_sum(plain[WEIGHTS])[1] == pytest.approx(
        sum(len(c) for c in split.clients) / max(len(c) for c in split.clients)
    )


def test_split_deals_disjoint_clients_and_is_seeded(tmp_path):
    data = load_moleculenet("bbbp", _write_set(tmp_path, [f"{s},1" for s in SMILES * 5]))
    split = split_molecules(data, seed=3, num_clients=4)
    everything = np.concatenate([*split.clients, split.val, split.test])
    assert sorted(everything.tolist()) == list(range(len(data.molecules)))
    assert [len(c) for c in split.clients] == [8, 8, 8, 8]
    again = split_molecules(data, seed=3, num_clients=4)
    assert all(np.array_equal(a, b) for a, b in zip(split.clients, again.clients, strict=True))
