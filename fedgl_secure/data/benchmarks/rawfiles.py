"""Finding and parsing a dataset's raw files, with errors a user can act on.

Every loader follows the same two steps: first check that the dataset directory and *every*
expected file exist (so a user who copied half a dataset learns about all missing files at once,
before any slow parsing), then parse each file inside :func:`parsing`, which turns whatever the
parser raises (a truncated pickle, a non-numeric token, a bad MATLAB header ...) into a
:class:`~fedgl_secure.errors.DatasetError` that names the file and the cause.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedgl_secure.errors import DatasetError


def require_files(directory: Path, names: Sequence[str], dataset: str) -> dict[str, Path]:
    """Return ``{name: directory / name}`` after checking that the directory and each file exist.

    Raises:
        DatasetError: the directory is missing, or some files are missing (all of them are named,
            together with the directory that was searched).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DatasetError(
            f"{dataset}: dataset directory {directory} does not exist; expected it to contain {', '.join(names)}"
        )
    paths = {name: directory / name for name in names}
    missing = [name for name, path in paths.items() if not path.is_file()]
    if missing:
        raise DatasetError(f"{dataset}: missing file(s) {', '.join(missing)} in {directory}")
    return paths


@contextmanager
def parsing(path: Path, dataset: str) -> Iterator[None]:
    """Re-raise any parsing failure inside the block as a DatasetError naming ``path``.

    A ``DatasetError`` raised inside the block (e.g. a shape check) passes through unchanged.
    """
    try:
        yield
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure means a corrupt file
        raise DatasetError(
            f"{dataset}: cannot parse {path} ({type(exc).__name__}: {exc}); "
            "the file is corrupt or not in the expected format"
        ) from exc


def check(condition: bool, dataset: str, message: str) -> None:
    """Raise a DatasetError ``"<dataset>: <message>"`` unless ``condition`` holds.

    Used for consistency checks between files (row counts, id ranges), which parsers cannot see.
    """
    if not condition:
        raise DatasetError(f"{dataset}: {message}")


def read_int_table(path: Path, dataset: str, columns: int) -> np.ndarray:
    """Whitespace-separated integers (any mix of spaces, tabs, newlines) as ``(rows, columns)`` int64.

    Raises:
        DatasetError: a token is not an integer, or the count is not a multiple of ``columns``.
    """
    with parsing(path, dataset):
        values = np.array(path.read_bytes().split(), dtype=np.int64)
        if values.shape[0] % columns:
            raise ValueError(f"{values.shape[0]} integers cannot form rows of {columns} columns")
        return values.reshape(-1, columns)
