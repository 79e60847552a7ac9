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


class PolicyError(ConfigError):
    """A privacy policy file is missing, malformed, or asks for something unsafe."""


class CryptoError(FedGLError):
    """Base class of the cryptographic layer's errors (contexts, ciphertexts, receipts, sealing)."""


class ContextError(CryptoError):
    """An HE context could not be created or loaded, or holds keys it must not hold."""


class CiphertextError(CryptoError):
    """A ciphertext is malformed, truncated, from a foreign context, or does not fit the others."""


class ReceiptError(CryptoError):
    """An upload receipt is malformed, forged, or bound to something else."""


class SealError(CryptoError):
    """A sealed secret could not be opened (wrong operator secret, or the file was altered)."""


class DecryptionRefused(CryptoError):
    """The key authority refused to decrypt; ``reason`` is a stable, machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"decryption refused ({reason}): {detail}")
        self.reason = reason
        self.detail = detail


class ProtocolConflict(FedGLError):
    """A request that is well formed but does not fit the protocol's state (HTTP 409).

    ``code`` is stable and machine-readable (e.g. ``stale-round``, ``not-ready``); it is the error code
    on the wire, and the client raises this exception again from it.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ServiceError(FedGLError):
    """A service answered with an error that has no more specific exception on this side."""

    def __init__(self, status: int | None, error: str, detail: str, url: str = "") -> None:
        where = f" from {url}" if url else ""
        status_text = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"{status_text}{where} ({error}): {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class DataSourceError(FedGLError):
    """A bank's tables are missing, unreadable, or do not match the consortium's schema.

    The message names the file or table, and where it can the (1-based) data row and the column.
    """


class PackingOverflow(CiphertextError):
    """A packed CKKS sum cannot be decoded safely: more contributors than its digits have headroom for,
    or decrypted slots that are not packed sums (see ``crypto/packing.py``)."""
