"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Directory with the raw datasets: ``$FEDGL_DATA``, else ``<repo>/../shared/datasets``.

    Tests that need real data are skipped when it is absent (the package must not depend on it).
    """
    root = Path(os.environ.get("FEDGL_DATA", REPO.parent / "shared" / "datasets"))
    if not root.is_dir():
        pytest.skip(f"raw datasets not found at {root} (set FEDGL_DATA)")
    return root
