"""GraphFL in the secure consortium (five real processes, real TLS): each round runs its two stages (the meta step
from the banks' query-loss gradients, then fine-tuning and FedAvg) and equals the in-process simulation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from consortium_harness import BANKS, NODES, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

from fedgl_secure.methods.base import META_GRADIENTS, WEIGHTS

pytestmark = pytest.mark.slow


def test_graphfl_consortium_matches_the_plaintext_simulation(tmp_path):
    # unpacked, as test_consortium's comparison at 1e-4 (packed sums round float-order differences)
    unpacked = SMALL_HE.model_copy(update={"packing": "none"})
    consortium = write_consortium(
        tmp_path, max_rounds=2, method="graphfl", he=unpacked, experiment_extra={"graphfl": {"inner_steps": 3}}
    )
    consortium.start(*NODES)
    try:
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "two rounds", timeout=300)
        rounds = applied_rounds(status)
        assert [row["base_version"] for row in rounds] == [0, 1]
        assert all(sorted(row["contributors"]) == list(BANKS) for row in rounds)
        weights = final_weights(consortium, 2)
        expected = simulated_weights(consortium, 2)
        assert weights.shape == expected.shape
        assert np.max(np.abs(weights - expected)) <= 1e-4
        assert not np.allclose(weights, final_weights(consortium, 1))  # the rounds did move the model
    finally:
        consortium.stop_all()
    # the key authority decrypted each stage's one kind once per round, and nothing else
    decrypted = [
        (entry["round"], entry["kind"])
        for entry in map(json.loads, consortium.logs("key-authority").splitlines())
        if entry.get("event") == "decrypt.allowed"
    ]
    assert decrypted == [(1, META_GRADIENTS), (1, WEIGHTS), (2, META_GRADIENTS), (2, WEIGHTS)]
