"""Arrow string columns built from numpy without a Python object per string: person keys, customer ids, codes.

Shared by :mod:`.population` (every person's customer key) and :mod:`.tables` (each bank's customer
ids, the coded label/split/segment/region columns), so it sits below both.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _hex_keys(index: np.ndarray, salt: np.uint64) -> pa.StringArray:
    """16 hex digits per person: the splitmix64 finaliser (a bijection) of ``index · φ + salt``.

    A bijection, so two persons never share a key; the salt (drawn from the seed) makes two seeds' keys
    unrelated.
    """
    with np.errstate(over="ignore"):
        z = index * np.uint64(0x9E3779B97F4A7C15) + salt
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    octets = z.astype(">u8").view(np.uint8).reshape(-1, 8)
    text = np.stack([digits[octets >> 4], digits[octets & 15]], axis=2).reshape(-1, 16)
    return _fixed_width_strings(text)


def _customer_ids(prefix: str, count: int) -> pa.StringArray:
    """``<PREFIX>-<number>`` for 0 ... count - 1, zero-padded to one width (at least 7 digits)."""
    width = max(7, len(str(count - 1)))
    head = f"{prefix}-".encode()
    text = np.empty((count, len(head) + width), dtype=np.uint8)
    text[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    number = np.arange(count, dtype=np.int64)
    for position in range(width - 1, -1, -1):
        number, digit = np.divmod(number, 10)
        text[:, len(head) + position] = digit + ord("0")
    return _fixed_width_strings(text)


def _fixed_width_strings(text: np.ndarray) -> pa.StringArray:
    """A string array from an ``(n, width)`` uint8 matrix of ASCII, without a Python object per string."""
    count, width = text.shape
    offsets = np.arange(0, (count + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text)))


def _coded_strings(codes: np.ndarray, values: tuple[str, ...]) -> pa.Array:
    """Strings ``values[codes]``, null where ``codes < 0``."""
    indices = pa.array(codes.astype(np.int8), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array(values)).dictionary_decode()
