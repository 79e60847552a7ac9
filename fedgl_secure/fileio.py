"""Small file helpers shared by the parties' state (keys, privacy ledgers)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename, so a crash never leaves half a file."""
    path = Path(path)
    temporary = path.with_suffix(path.suffix + ".tmp")
    with temporary.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
