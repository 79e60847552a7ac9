"""A three-bank consortium (five real processes over mutual TLS) training FedGL on a PyG model a bank declared:
``training.backbone = "pyg_user_models:GraphConvHead"``, a class of a module of this folder that every node
imports at start."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from consortium_harness import BANKS, NODES, UNPACKED_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
ROUNDS = 3


def test_three_banks_train_fedgl_on_a_declared_pyg_model_as_the_simulation_does(tmp_path):
    """FedGL with its pseudo graph (β = 0.3, fused into Â' from round 2) reaches the declared PyG model as edge
    weights in every bank; W̄ after the rounds is the in-process simulation's up to the decryption's noise (each
    bank's dropout from its own stream), and the banks' validation accuracy beats chance (4 classes)."""
    consortium = write_consortium(
        tmp_path,
        max_rounds=ROUNDS,
        he=UNPACKED_HE,  # one float per slot: no packing steps in the comparison with the simulation
        experiment_extra={"training": {"backbone": "pyg_user_models:GraphConvHead"}},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        consortium.start(*NODES)
        try:
            status = consortium.wait_for(lambda s: s["phase"] == "finished", f"{ROUNDS} rounds", timeout=300)
            weights = final_weights(consortium, ROUNDS)
        finally:
            consortium.stop_all()
    rounds = applied_rounds(status)
    assert len(rounds) == ROUNDS and all(sorted(row["contributors"]) == list(BANKS) for row in rounds)
    expected = simulated_weights(consortium, ROUNDS)
    # GraphConv (100 -> 16: lin_rel with bias, lin_root) and the linear head (16 -> 4)
    assert weights.shape == expected.shape == (100 * 16 + 16 + 100 * 16 + 16 * 4 + 4,)
    # The threshold decryption's noise flooding moves W̄ by ~1e-7 a round against the plaintext sum, and Adam turns
    # that into steps of up to ~lr on the few parameters whose gradient is near zero (measured here: median 1e-6,
    # max 1.1e-3 after 3 rounds); the median holds the bulk of the parameters to the simulation's.
    difference = np.abs(weights - expected)
    assert np.median(difference) <= 1e-5 and np.max(difference) <= 1e-2, (np.median(difference), difference.max())
    assert status["best_val_accuracy"] > 0.25 + 0.1, status["best_val_accuracy"]
