"""``SecureSummation``: the engine's summation step with real CKKS and real key-authority rules.

One process plays every party, but each keeps to its own keys and its own view (DESIGN §5.1):

* **banks** (one per client id) hold an Ed25519 signing key and the *public* context; each
  encrypts every kind of its pre-weighted contribution and signs a receipt per kind;
* the **aggregator** holds the public context only; it verifies receipts and digests, adds
  ciphertexts per kind (never decrypting), asks the key authority and ``t`` banks for partial
  decryptions of each sum and fuses them;
* the **key authority** (:class:`KeyAuthority`) holds its key share ``s_0`` and enforces its rules;
  each bank holds a Shamir share of the banks' part and its own :class:`BankDecryptor` rules.

The key is made without a dealer when the summation is created (``key_ceremony.py``): the key
authority and every bank of the roster (``banks``, default the policy's ``he.max_banks``; client ``k``
is bank ``k + 1``) announce public shares, deal Shamir shares through the key authority's relay, and
the collective public context is what banks encrypt under. No object here holds the secret key.

It implements :class:`fedgl_secure.engine.aggregation.Summation`, so ``run_experiment`` runs
unchanged; the multi-process services reuse the same upload, check and decryption code.

**Concurrency.** On separate machines every bank encrypts at the same time, so a round waits for the
slowest bank, not for all of them in turn. The banks' encryption of a round therefore runs on a pool of
worker *processes* (:class:`~fedgl_secure.crypto.encryption_pool.EncryptionPool`, ``encrypt_workers``,
default the CPU count: TenSEAL holds the GIL, so threads would take turns), one job per (bank, kind); each
bank signs its receipts in this process, so signing keys stay here. ``encrypt_workers = 1`` is the serial
baseline, and a round of fewer than ``pool_min_chunks`` ciphertexts is encrypted serially here too, until the
pool has started (its start, about a second once, is not repaid by rounds of a few milliseconds). Banks
upload a kind as soon as it is encrypted, so the aggregator (a thread of its own for the checks, one per kind for
the fusion) checks, adds and has each kind decrypted while the banks still encrypt the next one: the key
authority's work (much of it waiting for its ledger and audit log to reach the disk) overlaps the banks' instead
of following it. ``seconds`` counts each party's own time, so with that overlap its phases add up to more than
the round.

:class:`QuantisedSummation` is the plaintext twin: the same quantisation and exact integer sums as the
packed CKKS path, without encryption, so a plaintext simulation can be compared value for value.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks, packing, residue_sum, threshold
from fedgl_secure.crypto.bank_encryption import BankEncryption, EncryptedTerms
from fedgl_secure.crypto.centring import bank_term, restore_sum, wire_reference
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.encryption_pool import POOL_MIN_CHUNKS, EncryptionPool, term_chunks
from fedgl_secure.crypto.key_authority import AGGREGATOR, KeyAuthority
from fedgl_secure.crypto.key_ceremony import BankCeremony
from fedgl_secure.crypto.partial_decryption import BankDecryptor, fused_values
from fedgl_secure.crypto.receipts import Receipt, public_key_bytes
from fedgl_secure.crypto.residue_sum import ChunkedCiphertext
from fedgl_secure.crypto.upload import (
    RoundTicket,
    Upload,
    check_upload,
    finite_term,
    make_upload,
    read_checked,
    sign_upload,
)
from fedgl_secure.data.sampling import bank_name
from fedgl_secure.errors import CiphertextError, PolicyError
from fedgl_secure.log import get_logger
from fedgl_secure.policy.schema import Policy


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
class DecryptionTraffic:
    """Bytes of the threshold decryptions over all rounds, as the services send them (residues, 8 bytes each; the
    frames' few bytes of length aside): ``verification`` — each decryptor's download of the receipted uploads' ``c1``
    (the key authority's request, each decrypting bank's fetch); ``partials`` — the partial decryptions sent back
    (the key authority's and each bank's); ``values`` — the values decrypted (unpacked), ``sums`` — the sums."""

    verification: int = 0
    partials: int = 0
    values: int = 0
    sums: int = 0

    def add(self, uploads: int, chunks: int, shape: tuple[int, int], decryptors: int, values: int) -> None:
        residues = chunks * shape[0] * shape[1] * 8  # one (chunks, k, N) array of uint64
        self.verification += decryptors * uploads * residues
        self.partials += decryptors * residues
        self.values += values
        self.sums += 1

    def bytes_per_value(self) -> float:
        return (self.verification + self.partials) / self.values if self.values else float("nan")


@dataclass
class PhaseTimes:
    """Seconds spent per party over all rounds: banks encrypting and signing (wall time of the
    round's encryption phase, and the busiest bank's own time, which is what separate machines would
    wait for), the aggregator checking, adding and fusing, the decryptors' partial decryptions
    (``decrypt``: the wall time of each sum's decryptions, the key authority's and the t banks' at once on
    threads; ``decrypt_banks``: every decryptor's own seconds added up)."""

    encrypt: float = 0.0
    encrypt_slowest_bank: float = 0.0
    aggregate: float = 0.0
    decrypt: float = 0.0
    decrypt_banks: float = 0.0


def local_key_ceremony(
    authority: KeyAuthority, signing_keys: Mapping[str, Ed25519PrivateKey], state_root: Path
) -> dict[str, BankDecryptor]:
    """Every bank's side of the dealer-free key generation in this process, relayed by ``authority`` as the services
    relay it (each bank with its own ceremony object, checking every announcement it receives); returns each bank's
    partial decryptor, its ledger under ``state_root/<bank>``. The banks must be registered with the authority."""
    policy, rings = authority.policy, authority.rings
    crp = threshold.common_random_polynomial(rings, authority.roster.digest())
    public = {name: key.public_key() for name, key in signing_keys.items()}
    ceremonies = {name: BankCeremony(rings, authority.roster, name, key, crp) for name, key in signing_keys.items()}
    for name, ceremony in ceremonies.items():
        authority.accept_announcement(name, ceremony.announcement())
    announcements = authority.announcements()
    for name, ceremony in ceremonies.items():
        authority.accept_envelopes(name, ceremony.deal(announcements, public))
    decryptors = {}
    for name, ceremony in ceremonies.items():
        held = ceremony.finish(authority.envelopes_for(name), authority.authority_share)
        decryptors[name] = BankDecryptor(state_root / name, policy, rings, held, public)
    return decryptors


@dataclass(frozen=True)
class _Bank:
    name: str
    signing_key: Ed25519PrivateKey


class SecureSummation:
    """CKKS-encrypted, receipt-checked, threshold-decrypted summation of one federation.

    ``state_dir`` holds the key authority's sealed share, ledger and audit log, and each bank's partial-decryption
    ledger under ``banks/`` (a temporary directory, removed with this object, when not given). ``banks`` is the
    roster's size (default ``he.max_banks``): its signing keys and key shares are made here, as provisioning and the
    key ceremony would. ``seconds`` splits the time spent between the parties.

    For the audit: ``accepted_receipts`` keeps every receipt of every sum the key authority
    decrypted, and :meth:`bank_public_keys` the banks' receipt-signing keys. Central DP noise is the
    key authority's own (:meth:`~fedgl_secure.crypto.key_authority.KeyAuthority.decrypt_sum` adds it
    to its partial decryption), so this summation never adds any itself (``adds_central_noise``).
    """

    adds_central_noise = True  # its key authority applies the policy's central channels

    def __init__(
        self,
        policy: Policy,
        state_dir: str | Path | None = None,
        operator_secret: bytes | str | None = None,
        federation: str | None = None,
        encrypt_workers: int | None = None,
        pool_min_chunks: int = POOL_MIN_CHUNKS,
        banks: int | None = None,
    ) -> None:
        self.policy = policy
        self.encrypt_workers = max(1, encrypt_workers or os.cpu_count() or 1)
        self._layouts = {kind: policy.upload_layout(kind) for kind in policy.allowed_kinds}
        self._temporary = tempfile.TemporaryDirectory(prefix="fedgl-ka-") if state_dir is None else None
        self.state_dir = Path(self._temporary.name if self._temporary else state_dir)
        self.federation = federation or f"fed-{secrets.token_hex(8)}"
        count = policy.he.max_banks if banks is None else banks
        self._banks = {
            client_id: _Bank(bank_name(client_id), Ed25519PrivateKey.generate()) for client_id in range(count)
        }
        self.roster = Roster(
            self.federation, tuple(bank.name for bank in self._banks.values()), policy.he.threshold, policy.digest
        )
        self.authority = KeyAuthority(self.state_dir, policy, operator_secret or secrets.token_bytes(32), self.roster)
        try:
            for bank in self._banks.values():
                self.authority.register_bank(bank.name, bank.signing_key.public_key())
            signing = {bank.name: bank.signing_key for bank in self._banks.values()}
            self.decryptors = local_key_ceremony(self.authority, signing, self.state_dir / "banks")
        except Exception:
            self.authority.close()
            raise
        # what banks and the aggregator receive: the public context, checked to carry no secret
        self.public_context = ckks.load_public_context(self.authority.public_context)
        # the banks' encryption of a round: on worker processes once a round is large enough (module doc)
        self.encryption = EncryptionPool(
            self.authority.public_context, policy.he, self.encrypt_workers, min_chunks=pool_min_chunks
        )
        self.fingerprint = ckks.fingerprint(self.authority.public_context)
        # the decryptors' threads: the key authority's and the t banks' partial decryptions of a sum run at once, and
        # the sums of different kinds side by side (each decryptor takes one request at a time, under its lock)
        self._decryptions = ThreadPoolExecutor(
            (policy.he.threshold + 1) * len(policy.allowed_kinds), thread_name_prefix="decryptor"
        )
        self.wire = WireStats()
        self.decryption = DecryptionTraffic()
        self.seconds = PhaseTimes()
        self._timing = threading.Lock()
        self.accepted_receipts: list[Receipt] = []
        self.log = get_logger(role="secure-summation", federation=self.federation)

    def close(self) -> None:
        self._decryptions.shutdown()
        self.encryption.close()
        for decryptor in self.decryptors.values():
            decryptor.close()
        self.authority.close()
        if self._temporary is not None:
            self._temporary.cleanup()

    def _bank(self, client_id: int) -> _Bank:
        if client_id not in self._banks:
            raise PolicyError(
                f"client {client_id} is not in this federation's key ceremony ({len(self._banks)} banks: clients "
                f"0..{len(self._banks) - 1}); create the summation with banks >= the number of clients"
            )
        return self._banks[client_id]

    def bank_public_keys(self) -> dict[str, str]:
        """Each roster bank's name → its Ed25519 receipt-signing public key (32 raw bytes, hex), as the key authority
        registered them."""
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
        return self._check_shapes(shapes)

    def _check_shapes(self, shapes: dict[str, torch.Size]) -> dict[str, torch.Size]:
        """``shapes``, once its kinds are all ones the policy lets leave a bank."""
        refused = sorted(set(shapes) - set(self.policy.allowed_kinds))
        if refused:
            raise PolicyError(
                f"policy: kinds {refused} may not leave a bank (allowed_kinds = {list(self.policy.allowed_kinds)})"
            )
        return shapes

    def open_round(
        self, round_number: int, participants: Sequence[int], reference: torch.Tensor | None = None
    ) -> SecureRound:
        """Round ``round_number`` of ``participants`` (client ids), summed as each bank contributes
        (:class:`SecureRound`); ``reference`` the broadcast W̄ the weights kind is centred on."""
        return SecureRound(self, round_number, participants, reference)

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        if not contributions:
            raise PolicyError("secure summation: no client contributed to this round")
        self._check_kinds(contributions)  # before the key authority opens a round nobody could finish
        with self.open_round(round_number, sorted(contributions), reference) as round_sum:
            for client_id in sorted(contributions):
                round_sum.add(client_id, contributions[client_id])
            return round_sum.result()

    def _largest_first(self, shapes: Mapping[str, torch.Size]) -> list[str]:
        """Kinds by the CKKS slots they take, largest first: the kind fused after the last encryption, which
        nothing overlaps, is then the smallest."""
        return sorted(shapes, key=lambda kind: (-packing.slot_length(self._layouts[kind], shapes[kind].numel()), kind))

    def _fuse(
        self,
        ticket: RoundTicket,
        kind: str,
        banks: Mapping[int, _Bank],
        checked: list[tuple[Upload, ChunkedCiphertext]],
    ) -> tuple[np.ndarray, list[Upload]]:
        """The aggregator's and the decryptors' part for one kind, its uploads checked (:meth:`_check`): add, have the
        key authority and the first ``t`` contributing banks decrypt their share of the sum, fuse and decode. Runs on
        the aggregator's thread; times each party's share."""
        started = time.perf_counter()
        uploads = [upload for upload, _ in checked]
        layout, length = self._layouts[kind], uploads[0].length
        slots = packing.slot_length(layout, length)
        summed = residue_sum.add(self.public_context, [ciphertext for _, ciphertext in checked])
        c1s = [ciphertext.c1 for _, ciphertext in checked]
        receipts = [upload.receipt for upload in uploads]
        decrypting = self._decrypting_set(banks)

        def timed(call, *args) -> tuple[np.ndarray, float]:
            begun = time.perf_counter()
            return call(*args), time.perf_counter() - begun

        # the key authority and the t banks decrypt at once, as on their own machines
        begun = time.perf_counter()
        authority_job = self._decryptions.submit(
            timed,
            self.authority.decrypt_sum,
            AGGREGATOR,
            self.federation,
            ticket.round,
            kind,
            receipts,
            self.fingerprint,
            slots,
            c1s,
        )
        bank_jobs = [
            self._decryptions.submit(
                timed, self.decryptors[name].partial, ticket.round, kind, receipts, c1s, decrypting
            )
            for name in decrypting
        ]
        authority, authority_seconds = authority_job.result()
        answered = [job.result() for job in bank_jobs]
        decryption_seconds = time.perf_counter() - begun
        partials = [authority, *(partial for partial, _ in answered)]
        banks_seconds = sum(seconds for _, seconds in answered)
        values = fused_values(self.public_context, summed, partials, length, layout, len(uploads))
        with self._timing:  # kinds are fused on threads of their own
            self.decryption.add(len(uploads), len(authority), self.authority.level.shape, len(partials), length)
            self.seconds.aggregate += time.perf_counter() - started - decryption_seconds
            self.seconds.decrypt += decryption_seconds
            self.seconds.decrypt_banks += banks_seconds + authority_seconds
        return values, uploads

    def _decrypting_set(self, contributors: Mapping[int, _Bank]) -> list[str]:
        """The ``t`` banks that decrypt a sum: the round's contributors first (they are up), then the roster's."""
        names = [bank.name for bank in contributors.values()]
        names += [name for name in self.roster.banks if name not in names]
        return names[: self.policy.he.threshold]

    def _check(self, ticket: RoundTicket, bank: _Bank, upload: Upload) -> ChunkedCiphertext:
        """The aggregator's check of one upload as it arrives: receipt, binding and digests, its chunks read once
        (what it adds; their c1 what the decryptors are sent). No secret key."""
        started = time.perf_counter()
        check_upload(upload, bank.signing_key.public_key(), ticket, bank.name)
        slots = packing.slot_length(self._layouts[upload.kind], upload.length)
        read = read_checked(self.public_context, upload, bank.name, slots)
        with self._timing:  # the aggregator's checking and fusing threads both count here
            self.seconds.aggregate += time.perf_counter() - started
        return read


class SecureRound:
    """One round of a :class:`SecureSummation`, summed as its banks contribute.

    Each contribution is encrypted as soon as it is added — on the encryption pool's workers once the round is large
    enough, so while the next bank still trains, as banks on their own machines encrypt right after their own
    training — and :meth:`result` waits for the last ciphertexts, has the aggregator check, add and have each kind
    decrypted once every participant has uploaded it, and returns the sums. The key authority opens the round with
    its participants when the round is opened here. Used as a context manager, a round left before its result
    cancels the encryptions nobody will fuse."""

    def __init__(
        self,
        summation: SecureSummation,
        round_number: int,
        participants: Sequence[int],
        reference: torch.Tensor | None,
    ) -> None:
        if not participants:
            raise PolicyError("secure summation: no client takes part in this round")
        self._summation = summation
        self._centre = wire_reference(reference)
        self._banks = {client_id: summation._bank(client_id) for client_id in sorted(set(participants))}
        names = tuple(bank.name for bank in self._banks.values())
        nonce, digest = secrets.token_hex(16), summation.policy.digest
        self.ticket = RoundTicket(summation.federation, round_number, nonce, names, summation.fingerprint, digest)
        summation.authority.open_round(summation.federation, round_number, nonce, list(names), digest)
        self._shapes: dict[str, torch.Size] = {}
        self._kinds: list[str] = []
        self._on_pool = False
        self._jobs: dict[str, dict[int, Future]] = defaultdict(dict)  # encryptions running on the pool
        self._uploads: dict[str, dict[int, Upload]] = defaultdict(dict)  # uploads made in this process
        # the aggregator's checks, one thread of its own taking each upload as it arrives, as the service does on
        # upload; and its fusion of each kind, on a thread per kind, as soon as that kind's checks are done
        self._checker = ThreadPoolExecutor(1, thread_name_prefix="aggregator-checks")
        self._fuser = ThreadPoolExecutor(len(summation.policy.allowed_kinds), thread_name_prefix="aggregator")
        self._checks: dict[str, dict[int, Future]] = defaultdict(dict)
        self._contributed: set[int] = set()
        self._busy: dict[int, float] = defaultdict(float)  # each bank's own encryption seconds
        self._encrypting = 0.0  # seconds of this round's encryption phase outside the pool's overlap
        self._log = summation.log.bind(round=round_number)

    def __enter__(self) -> SecureRound:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the encryptions and checks not started yet (a failed or abandoned round); wait for the aggregator's
        threads."""
        for jobs in self._jobs.values():
            for job in jobs.values():
                job.cancel()
        self._checker.shutdown(wait=True, cancel_futures=True)
        self._fuser.shutdown(wait=True, cancel_futures=True)

    def bank_encryption(self) -> BankEncryption:
        """What a bank needs to encrypt its terms of this round where it runs
        (:mod:`~fedgl_secure.crypto.bank_encryption`), handed back to :meth:`add` as :class:`EncryptedTerms`."""
        summation = self._summation
        layouts = {kind: summation._layouts[kind] for kind in summation.policy.allowed_kinds}
        return BankEncryption(
            summation.authority.public_context,
            summation.fingerprint,
            summation.policy.he,
            layouts,
            len(self.ticket.participants),
            self._centre,
        )

    def add(self, client_id: int, contribution: Mapping[str, torch.Tensor] | EncryptedTerms) -> None:
        """Bank ``client_id``'s pre-weighted terms: encrypted now (on the pool) or at once here, kind by kind, the
        largest first — or already encrypted where the bank runs (:meth:`bank_encryption`), then only signed here."""
        summation = self._summation
        if client_id not in self._banks:
            raise PolicyError(f"{bank_name(client_id)} is not a participant of round {self.ticket.round}")
        if client_id in self._contributed:
            raise PolicyError(f"{bank_name(client_id)} already contributed to round {self.ticket.round}")
        encrypted = isinstance(contribution, EncryptedTerms)
        shapes = summation._check_shapes(
            {kind: torch.Size(shape) for kind, shape in contribution.shapes.items()}
            if encrypted
            else {kind: tensor.shape for kind, tensor in contribution.items()}
        )
        if not self._shapes:
            self._shapes, self._kinds = shapes, summation._largest_first(shapes)
            he, layouts = summation.policy.he, summation._layouts
            per_bank = sum(term_chunks(he, layouts[kind], shapes[kind].numel()) for kind in self._kinds)
            self._on_pool = not encrypted and summation.encryption.use_for(per_bank * len(self._banks))
        elif shapes != self._shapes:
            raise CiphertextError(f"{bank_name(client_id)} uploads other kinds or shapes than the others")
        self._contributed.add(client_id)
        if encrypted:
            for kind in self._kinds:  # signed and checked by _checked_upload, as an encryption pool's result is
                done: Future = Future()
                done.set_result(contribution.terms[kind])
                self._jobs[kind][client_id] = done
        else:
            self._encrypt_here(client_id, contribution)
        for kind in self._kinds:  # checked as each arrives: what is left for result() is the last bank's
            self._checks[kind][client_id] = self._checker.submit(self._checked_upload, client_id, kind)

    def _encrypt_here(self, client_id: int, contribution: Mapping[str, torch.Tensor]) -> None:
        """Bank ``client_id``'s terms encrypted in this process: on the pool's workers, or at once here."""
        summation = self._summation
        participants = len(self.ticket.participants)
        for kind in self._kinds:
            term = finite_term(kind, bank_term(kind, contribution[kind], self._centre))
            layout = summation._layouts[kind]
            if self._on_pool:
                self._jobs[kind][client_id] = summation.encryption.submit(kind, term, layout, participants)
                continue
            begun = time.perf_counter()
            bank = self._banks[client_id]
            self._uploads[kind][client_id] = make_upload(
                summation.public_context,
                summation.policy.he,
                self.ticket,
                bank.name,
                bank.signing_key,
                kind,
                term,
                layout=layout,
            )
            spent = time.perf_counter() - begun
            self._busy[client_id] += spent
            self._encrypting += spent

    def result(self) -> dict[str, torch.Tensor]:
        """The round's sums, kind by kind, once every participant has contributed: the aggregator fuses each kind on
        a thread of its own as soon as every bank's upload of it is checked, the kinds side by side."""
        summation = self._summation
        missing = [bank.name for client_id, bank in self._banks.items() if client_id not in self._contributed]
        if missing:
            raise PolicyError(f"round {self.ticket.round}: no contribution from {missing}")
        started = time.perf_counter()
        fusing = {kind: self._fuser.submit(self._fuse, kind) for kind in self._kinds}
        for checks in self._checks.values():
            wait(checks.values())
        summation.seconds.encrypt += self._encrypting + time.perf_counter() - started
        summation.seconds.encrypt_slowest_bank += max(self._busy.values(), default=0.0)
        fused = {kind: future.result() for kind, future in fusing.items()}
        sums = {}
        for kind, (values, uploads) in fused.items():
            summation.accepted_receipts.extend(upload.receipt for upload in uploads)
            values = restore_sum(kind, values, self._centre)
            sums[kind] = torch.from_numpy(values.astype(np.float32)).reshape(self._shapes[kind])
            self._log.debug("kind.fused", kind=kind, banks=len(uploads), bytes=sum(u.wire_bytes for u in uploads))
        return sums

    def _fuse(self, kind: str) -> tuple[np.ndarray, list[Upload]]:
        """The aggregator's thread: ``kind`` once every bank's upload of it is checked."""
        checked = [self._checks[kind][client_id].result() for client_id in self._banks]
        return self._summation._fuse(self.ticket, kind, self._banks, checked)

    def _checked_upload(self, client_id: int, kind: str) -> tuple[Upload, ChunkedCiphertext]:
        """Bank ``client_id``'s upload of ``kind`` (made here already, or its encryption awaited and signed here:
        signing keys stay in this process), checked and read by the aggregator."""
        summation, bank = self._summation, self._banks[client_id]
        upload = self._uploads[kind].get(client_id)
        if upload is None:
            encrypted = self._jobs[kind][client_id].result()
            self._busy[client_id] += encrypted.seconds
            length = self._shapes[kind].numel()
            upload = sign_upload(
                summation.public_context,
                self.ticket,
                bank.name,
                bank.signing_key,
                kind,
                encrypted.chunks,
                length,
                encrypted.c1_sha256,
            )
        summation.wire.add(upload)
        return upload, summation._check(self.ticket, bank, upload)


class QuantisedSummation:
    """Plaintext summation with the packed path's quantisation: each client's term of a packed kind is
    quantised exactly as a bank quantises it (``packing.quantise``) and the integers are summed, so the
    result equals what the CKKS path decodes (its encryption noise is rounded away); unpacked kinds are
    summed in float64 as :class:`~fedgl_secure.engine.aggregation.PlaintextSummation` does."""

    def __init__(self, policy: Policy) -> None:
        self.layouts = {kind: policy.upload_layout(kind) for kind in policy.allowed_kinds}

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        if not contributions:
            raise PolicyError("quantised summation: no client contributed to this round")
        centre = wire_reference(reference)
        ordered = [contributions[k] for k in sorted(contributions)]
        sums = {}
        for kind in sorted(ordered[0]):
            terms = [bank_term(kind, c[kind], centre) for c in ordered]
            layout = self.layouts.get(kind)
            if layout is None:
                total = np.sum(terms, axis=0)
            else:
                digits = np.sum([packing.quantise(term, layout) for term in terms], axis=0)
                total = packing.decode_sum(packing.pack(digits, layout), layout, terms[0].size, len(terms))
            total = restore_sum(kind, total, centre)
            sums[kind] = torch.from_numpy(total.astype(np.float32)).reshape(ordered[0][kind].shape)
        return sums
