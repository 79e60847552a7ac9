"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# ci_no_skips: in CI a skip is a failure; pytester: tests/test_ci_no_skips.py runs that plugin in an inner session
pytest_plugins = ("ci_no_skips", "pytester")


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs one worker per core) each worker computes on one thread: torch's
    own pool per worker would oversubscribe the cores, and its spinning threads slow small GCN steps badly.
    The consortium processes a test starts inherit it (they use one thread on a shared host anyway).

    ``--dist loadfile`` hands out whole files in collection order (:data:`LONGEST_FIRST`) only without xdist's
    ``--loadscope-reorder``, its default, which queues the files by number of tests, most first: the files that
    start consortia (one to seven tests, minutes each) then came last, and a worker ran the last of them while the
    other had nothing left (measured: both workers still on consortium files at 98 % of the tests)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


# The slowest files, longest first (CPU seconds of the whole machine per file, the test process, the node processes
# and Ray's, in a one-worker run: docs/results/test_suite_wall.json's "per_file_busy", measured before dd0d223 and
# 5c0eb1d; test_fuzz_services.py, test_fed2gnn_consortium.py and test_pyg_consortium.py are placed by their estimated
# cost after those changes, not re-measured): loadfile hands whole files to the workers in this order (see
# pytest_configure), so the long ones start first and the many short ones fill the gaps at the end.
LONGEST_FIRST = (
    "test_ray_executor.py",
    "test_consortium_faults.py",
    "test_fed2gnn_consortium.py",
    "test_bank_consortium.py",
    "test_fuzz_services.py",
    "test_consortium_privacy.py",
    "test_consortium_label_dp.py",
    "test_pyg_consortium.py",
    "test_key_authority_service.py",
    "test_key_authority.py",
    "test_fgcl_consortium.py",
    "test_gap_consortium.py",
    "test_cli.py",
    "test_simulation.py",
    "test_consortium.py",
    "test_backbones.py",
    "test_dp_round.py",
    "test_board.py",
    "test_aggregator.py",
    "test_secure_simulation.py",
    "test_metrics.py",
    "test_audit.py",
    "test_splits.py",
    "test_decryption_attacks.py",
    "test_fused_knn.py",
    "test_faiss_ivf.py",
    "test_consortium_centroids.py",
    "test_graphfl_consortium.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Directory with the raw datasets: ``$FEDGL_DATA``, else ``<repo>/../shared/datasets``.

    Tests that need real data are skipped when it is absent (the package must not depend on it).
    """
    root = Path(os.environ.get("FEDGL_DATA", REPO.parent / "shared" / "datasets")).resolve()
    if not root.is_dir():
        pytest.skip(f"raw datasets not found at {root} (set FEDGL_DATA)")
    return root


@pytest.fixture(scope="session")
def small_he():
    """Small but 128-bit-secure CKKS parameters (N = 4096, 109 of 109 bits) to keep unit tests fast; one float
    per slot (``packing = "none"``), so the key authority's and aggregator's rules are tested on plain sums. A
    short run's query budget (4,096 decrypted ciphertexts) keeps the decryption's noise flooding small.
    Packing has its own tests (``test_packing.py``) and the consortium tests run the default, packed."""
    from fedgl_secure.policy.he import HEParameters

    return HEParameters(
        poly_modulus_degree=4096,
        coeff_mod_bit_sizes=(36, 36, 37),
        global_scale_bits=62,
        packing="none",
        max_decryptions=4096,
    )


@pytest.fixture(scope="session")
def small_policy(small_he):
    from fedgl_secure.policy.schema import Policy

    return Policy(he=small_he, quorum=3)


@pytest.fixture(scope="session")
def small_context(small_he):
    """A secret CKKS context (key authority side) with the small parameters."""
    from fedgl_secure.crypto.ckks import create_secret_context

    return create_secret_context(small_he)
