"""Small file helpers shared by the parties' state (keys, privacy ledgers)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

PRIVATE_FILE_MODE = 0o600
"""Owner read/write only: private keys and anything else a secret can be read from."""


def write_atomically(path: str | Path, data: bytes, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename, so a crash never leaves half a file.

    ``mode`` (less the umask) is the file's permission from its creation on: ``0o600`` keeps a secret
    unreadable to others at every moment, which a ``chmod`` after the write would not. A temporary file
    left by a crash is removed first, because ``O_CREAT`` would keep its old permission.
    """
    path = Path(path)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.unlink(missing_ok=True)
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def write_arrays_atomically(path: str | Path, **arrays: np.ndarray) -> None:
    """An ``.npz`` archive of ``arrays`` at ``path``, written as :func:`write_atomically` writes (a bank's kept
    state: a torn file would fail its next start)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomically(path, buffer.getvalue())
