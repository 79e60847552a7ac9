"""What a bank keeps of a release it drew once at the source: its arrays and the settings they were made under.

A restarted bank takes a kept release back instead of drawing (and paying for) it again — but only under the
settings it was made under: under others it would not be the release its ledger paid for. Used for the edge
release (the prepared graph, ``privacy-graph.npz``), the label release (``privacy-labels.npz``), the label release in
progress of the consortium prior (``privacy-labels-staged.npz``) and a method's own release (GAP's hops,
``privacy-method-release.npz``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedgl_secure.errors import ConfigError
from fedgl_secure.fileio import write_arrays_atomically

SETTINGS = "settings"


def keep_release(path: Path, settings: dict, **arrays: np.ndarray) -> None:
    """Write ``arrays`` and ``settings`` (JSON) atomically: a torn file would fail the next start."""
    write_arrays_atomically(path, **arrays, **{SETTINGS: np.array(json.dumps(settings))})


def take_back_release(path: Path, settings: dict, what: str, section: str) -> dict[str, np.ndarray]:
    """The arrays :func:`keep_release` kept, refused (naming the file, ``what`` it holds and both ``section``
    settings) when they were made under other settings."""
    with np.load(path, allow_pickle=False) as archive:
        made_under = json.loads(str(archive[SETTINGS]))
        arrays = {name: archive[name] for name in archive.files if name != SETTINGS}
    if made_under != settings:
        raise ConfigError(
            f"{path}: {what} made under {section} = {made_under}, but the policy now has {section} = {settings}; "
            "start the bank with a new state directory (and a new budget) to release under new settings"
        )
    return arrays
