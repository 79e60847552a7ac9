"""``SecureSummation``: the engine's summation step with real CKKS and real key-authority rules.

One process plays every party, but each keeps to its own keys and its own view (DESIGN §5.1):

* **banks** (one per client id) hold an Ed25519 signing key and the *public* context; each
  encrypts every kind of its pre-weighted contribution and signs a receipt per kind;
* the **aggregator** holds the public context only; it verifies receipts and digests, adds
  ciphertexts per kind (never decrypting) and asks the key authority to decrypt each sum;
* the **key authority** (:class:`KeyAuthority`) holds the secret context and enforces its rules.

It implements :class:`fedgl_secure.fedgl.aggregation.Summation`, so ``run_experiment`` runs
unchanged; the multi-process services reuse the same upload, check and decryption code.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.key_authority import AGGREGATOR, KeyAuthority
from fedgl_secure.crypto.masking import mask_bound, mask_sum, unmask
from fedgl_secure.crypto.receipts import Receipt, public_key_bytes
from fedgl_secure.crypto.upload import RoundTicket, Upload, check_upload, make_upload
from fedgl_secure.errors import CiphertextError, PolicyError
from fedgl_secure.log import get_logger
from fedgl_secure.privacy.policy import Policy


def bank_name(client_id: int) -> str:
    """The consortium name of simulated client ``client_id``."""
    return f"bank-{client_id}"


@dataclass
class WireStats:
    """Ciphertext bytes and values sent by banks, per kind, summed over rounds."""

    bytes_by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    values_by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, upload: Upload) -> None:
        self.bytes_by_kind[upload.kind] += upload.wire_bytes
        self.values_by_kind[upload.kind] += upload.length

    def bytes_per_value(self) -> float:
        values = sum(self.values_by_kind.values())
        return sum(self.bytes_by_kind.values()) / values if values else float("nan")


@dataclass
class PhaseTimes:
    """Seconds spent per party over all rounds: banks encrypting and signing, the aggregator
    checking and adding, the key authority decrypting."""

    encrypt: float = 0.0
    aggregate: float = 0.0
    decrypt: float = 0.0


@dataclass(frozen=True)
class _Bank:
    name: str
    signing_key: Ed25519PrivateKey


class SecureSummation:
    """CKKS-encrypted, receipt-checked, key-authority-decrypted summation of one federation.

    ``state_dir`` holds the key authority's sealed key, ledger and audit log (a temporary
    directory, removed with this object, when not given). Bank keys are generated on a client's
    first contribution (or by :meth:`enrol`) and enrolled with the key authority, as provisioning
    would. ``seconds`` splits the time spent between the parties.

    For the audit: ``accepted_receipts`` keeps every receipt of every sum the key authority
    decrypted, and :meth:`bank_public_keys` the banks' receipt-signing keys. Central DP noise is the
    key authority's own (:meth:`~fedgl_secure.crypto.key_authority.KeyAuthority.decrypt_sum` adds it
    to the masked sum s + r), so this summation never adds any itself (``adds_central_noise``).
    """

    adds_central_noise = True  # its key authority applies the policy's central channels

    def __init__(
        self,
        policy: Policy,
        state_dir: str | Path | None = None,
        operator_secret: bytes | str | None = None,
        federation: str | None = None,
    ) -> None:
        self.policy = policy
        self._temporary = tempfile.TemporaryDirectory(prefix="fedgl-ka-") if state_dir is None else None
        self.state_dir = Path(self._temporary.name if self._temporary else state_dir)
        self.authority = KeyAuthority(self.state_dir, policy, operator_secret or secrets.token_bytes(32))
        self.federation = federation or f"fed-{secrets.token_hex(8)}"
        # what banks and the aggregator receive: the public context, checked to carry no secret
        self.public_context = ckks.load_public_context(self.authority.public_context)
        self.fingerprint = ckks.fingerprint(self.authority.public_context)
        self._mask_bound = mask_bound(policy.he.coeff_mod_bit_sizes, policy.he.global_scale_bits)
        self._banks: dict[int, _Bank] = {}
        self.wire = WireStats()
        self.seconds = PhaseTimes()
        self.accepted_receipts: list[Receipt] = []
        self.log = get_logger(role="secure-summation", federation=self.federation)

    def close(self) -> None:
        self.authority.close()
        if self._temporary is not None:
            self._temporary.cleanup()

    def _bank(self, client_id: int) -> _Bank:
        if client_id not in self._banks:
            bank = _Bank(bank_name(client_id), Ed25519PrivateKey.generate())
            self.authority.register_bank(bank.name, bank.signing_key.public_key())
            self._banks[client_id] = bank
        return self._banks[client_id]

    def enrol(self, client_ids: Iterable[int]) -> None:
        """Generate and register the signing keys of these clients now (provisioning, not a round's work)."""
        for client_id in client_ids:
            self._bank(client_id)

    def bank_public_keys(self) -> dict[str, str]:
        """Each enrolled bank's name → its Ed25519 receipt-signing public key (32 raw bytes, hex)."""
        return {
            bank.name: public_key_bytes(bank.signing_key.public_key()).hex()
            for bank in sorted(self._banks.values(), key=lambda b: b.name)
        }

    def _check_kinds(self, contributions: Mapping[int, Mapping[str, torch.Tensor]]) -> dict[str, torch.Size]:
        """The common kinds and shapes of the round; refuses kinds the policy keeps inside banks."""
        first = next(iter(contributions.values()))
        shapes = {kind: tensor.shape for kind, tensor in first.items()}
        for client_id, contribution in contributions.items():
            if {kind: tensor.shape for kind, tensor in contribution.items()} != shapes:
                raise CiphertextError(f"{bank_name(client_id)} uploads other kinds or shapes than the others")
        refused = sorted(set(shapes) - set(self.policy.allowed_kinds))
        if refused:
            raise PolicyError(
                f"policy: kinds {refused} may not leave a bank (allowed_kinds = {list(self.policy.allowed_kinds)})"
            )
        return shapes

    def __call__(
        self, round_number: int, contributions: Mapping[int, Mapping[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        if not contributions:
            raise PolicyError("secure summation: no client contributed to this round")
        shapes = self._check_kinds(contributions)
        banks = {client_id: self._bank(client_id) for client_id in sorted(contributions)}
        ticket = RoundTicket(self.federation, round_number, secrets.token_hex(16), len(banks), self.fingerprint)
        self.authority.open_round(self.federation, round_number, ticket.nonce, [b.name for b in banks.values()])
        log = self.log.bind(round=round_number)
        sums = {}
        for kind in sorted(shapes):
            uploads = []
            started = time.perf_counter()
            for client_id, bank in banks.items():  # bank side: encrypt and sign
                values = contributions[client_id][kind].detach().to(torch.float64).cpu().numpy()
                upload = make_upload(
                    self.public_context, self.policy.he, ticket, bank.name, bank.signing_key, kind, values
                )
                self.wire.add(upload)
                uploads.append(upload)
            encrypted = time.perf_counter()
            summed = self._aggregate(ticket, kind, banks, uploads)
            masked, mask = mask_sum(self.public_context, summed, uploads[0].length, self._mask_bound)
            aggregated = time.perf_counter()
            masked_values = self.authority.decrypt_sum(
                AGGREGATOR,
                self.federation,
                round_number,
                kind,
                masked,
                [upload.receipt for upload in uploads],
                self.fingerprint,
                uploads[0].length,
            )
            values = unmask(masked_values, mask)  # the key authority saw s + r only
            self.accepted_receipts.extend(upload.receipt for upload in uploads)
            self.seconds.encrypt += encrypted - started
            self.seconds.aggregate += aggregated - encrypted
            self.seconds.decrypt += time.perf_counter() - aggregated
            sums[kind] = torch.from_numpy(values.astype(np.float32)).reshape(shapes[kind])
            log.debug("kind.fused", kind=kind, banks=len(uploads), bytes=sum(u.wire_bytes for u in uploads))
        return sums

    def _aggregate(self, ticket: RoundTicket, kind: str, banks: Mapping[int, _Bank], uploads: list[Upload]) -> list:
        """The aggregator's part: check every receipt and digest, then add ciphertexts (no secret key)."""
        for bank, upload in zip(banks.values(), uploads, strict=True):
            check_upload(upload, bank.signing_key.public_key(), ticket, bank.name)
        return ckks.add_serialized(self.public_context, [upload.chunks for upload in uploads])
