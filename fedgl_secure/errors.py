"""Typed, actionable errors shared by the whole package.

Every error names what is wrong and, where possible, what the user can do about it.
The CLI turns these into a one-line message and a non-zero exit code.
"""

from __future__ import annotations


class FedGLError(Exception):
    """Base class of every error this package raises on purpose."""


class DatasetError(FedGLError):
    """A dataset directory is missing, incomplete or corrupt."""


class ConfigError(FedGLError):
    """A configuration value (flag, file, option) is invalid."""
