"""Named random streams derived from one run seed.

Every source of randomness (client sampling, participation, model initialisation, each
client's dropout) gets its own stream keyed by a purpose, so that a multi-process run where
each bank owns only its own stream reproduces an in-process run exactly, whatever order the
parties run in.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def _entropy(seed: int, purpose: tuple[object, ...]) -> list[int]:
    # SeedSequence wants integers; hash the purpose so that any printable key works and
    # different purposes never collide by accident (e.g. ("client", 1) vs ("client1",)).
    digest = hashlib.sha256(repr((int(seed),) + tuple(purpose)).encode()).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


def numpy_stream(seed: int, *purpose: object) -> np.random.Generator:
    """A NumPy generator for ``purpose`` under ``seed``; independent of every other purpose."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, purpose)))


def torch_stream(seed: int, *purpose: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator for ``purpose`` under ``seed`` on ``device``."""
    import torch  # here: the key authority reads the run config (and so this module) but never trains

    generator = torch.Generator(device=device)
    generator.manual_seed(int(np.random.SeedSequence(_entropy(seed, purpose)).generate_state(1, np.uint64)[0]))
    return generator
