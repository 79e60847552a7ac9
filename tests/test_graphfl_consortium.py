"""GraphFL in the secure consortium (five real processes, real TLS): each round runs its two stages (the meta step
from the banks' query-loss gradients, then fine-tuning and FedAvg) and equals the in-process simulation."""

from __future__ import annotations

import numpy as np
import pytest
from consortium_harness import BANKS, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

from fedgl_secure.methods.base import META_GRADIENTS, WEIGHTS

pytestmark = pytest.mark.slow


def test_graphfl_consortium_matches_the_plaintext_simulation(tmp_path):
    # unpacked, as test_consortium's comparison at 1e-4 (packed sums round float-order differences)
    unpacked = SMALL_HE.model_copy(update={"packing": "none"})
    # three banks: the quorum (it must exceed the decryption threshold t = 2), so every round takes every bank
    banks = BANKS
    consortium = write_consortium(
        tmp_path,
        max_rounds=2,
        method="graphfl",
        he=unpacked,
        experiment_extra={"graphfl": {"inner_steps": 3}},
        banks=banks,
    )
    consortium.start("key-authority", "aggregator", *banks)
    try:
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "two rounds", timeout=300)
        rounds = applied_rounds(status)
        assert [row["base_version"] for row in rounds] == [0, 1]
        assert all(sorted(row["contributors"]) == list(banks) for row in rounds)
        weights = final_weights(consortium, 2)
        expected = simulated_weights(consortium, 2)
        assert weights.shape == expected.shape
        # Adam's meta step divides by √v̂ + 1e-8, so on an entry whose summed query gradient is ~0 the CKKS noise
        # of the decrypted sum is amplified: in-process, noise of std 1e-9 on the sums moved one of the 1,684
        # entries by 7e-6 under Adam and none by more than 1e-8 under plain SGD; here such entries measured up to
        # 1.3e-4 and 4.6e-4 in two runs while 99 % stayed within 2.5e-6
        difference = np.abs(weights - expected)
        assert np.quantile(difference, 0.99) <= 1e-5 and difference.max() <= 2e-3
        assert not np.allclose(weights, final_weights(consortium, 1))  # the rounds did move the model
    finally:
        consortium.stop_all()
    # the key authority decrypted each stage's one kind once per round, and nothing else
    decrypted = [
        (entry["round"], entry["kind"])
        for entry in consortium.events("key-authority")
        if entry.get("event") == "decrypt.allowed"
    ]
    assert decrypted == [(1, META_GRADIENTS), (1, WEIGHTS), (2, META_GRADIENTS), (2, WEIGHTS)]
