"""FGCL in the secure consortium (five real processes) equals the in-process simulation, round for round."""

from __future__ import annotations

import numpy as np
import pytest
from consortium_harness import NODES, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

pytestmark = pytest.mark.slow


def test_fgcl_consortium_matches_the_plaintext_simulation(tmp_path):
    # unpacked, as test_consortium's comparison at 1e-4 (packed sums round float-order differences)
    unpacked = SMALL_HE.model_copy(update={"packing": "none"})
    consortium = write_consortium(tmp_path, max_rounds=2, method="fgcl", he=unpacked)
    consortium.start(*NODES)
    try:
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "two rounds", timeout=300)
        assert [row["base_version"] for row in applied_rounds(status)] == [0, 1]
        weights = final_weights(consortium, 2)
        expected = simulated_weights(consortium, 2)
        assert weights.shape == expected.shape
        assert np.max(np.abs(weights - expected)) <= 1e-4
    finally:
        consortium.stop_all()
