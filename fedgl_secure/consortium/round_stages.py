"""A round's stages at the aggregator: the round opened at the key authority, each stage's receipted uploads
collected until its deadline, and its sums threshold-decrypted (DESIGN §5.3 steps 1–3).

:class:`RoundStages` holds the stage open for uploads (:class:`OpenStage`: its participants, kinds, deadline and
each upload read and checked) and whether its sums are being aggregated — what a bank's poll is told. Each sum is
decrypted by the key authority (:class:`Decryptor`) and ``t`` banks through the decryption board
(``consortium/decryption_board.py``), and fused here (``crypto/partial_decryption.fused_values``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import tenseal as ts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.decryption_board import DecryptionBoard
from fedgl_secure.consortium.enrolment import UnionIndex
from fedgl_secure.consortium.participant_choice import Participation
from fedgl_secure.crypto import packing, residue_sum
from fedgl_secure.crypto.centring import restore_sum
from fedgl_secure.crypto.partial_decryption import fused_values
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.crypto.residue_sum import ChunkedCiphertext
from fedgl_secure.crypto.upload import RoundTicket, Upload, check_upload, read_checked
from fedgl_secure.errors import CiphertextError, FedGLError, ProtocolConflict
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy


class Decryptor(Protocol):
    """The key authority as the aggregator sees it (HTTP client, or the in-process library)."""

    def open_round(
        self, federation: str, round_number: int, nonce: str, participants: Sequence[str], policy_sha256: str
    ) -> None: ...

    def decrypt(
        self,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt],
        fingerprint: str,
        length: int,
        upload_c1: Sequence[np.ndarray],
    ) -> np.ndarray: ...  # the key authority's partial decryption's residues (uint64), not values


@dataclass
class OpenStage:
    """One stage of an open round (a single-stage method's round is one): its participants (the round's in
    the first stage, afterwards the banks whose uploads the previous stage's sums hold) and its kinds."""

    round: int
    base_version: int
    nonce: str
    participants: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    deadline: float
    stage: str
    uploads: dict[str, dict[str, Upload]] = field(default_factory=dict)
    # each upload read and checked: what the aggregator adds; its c1 what the decryptors are sent
    ciphertexts: dict[str, dict[str, ChunkedCiphertext]] = field(default_factory=dict)

    def complete_banks(self) -> tuple[str, ...]:
        return tuple(b for b in self.participants if set(self.uploads.get(b, {})) == set(self.shapes))


class RoundStages:
    """Opening rounds, collecting and decrypting their stages (module doc). ``changed`` is the coordinator's
    condition: an upload notifies it, and a stage waits on it for the last upload."""

    def __init__(
        self,
        *,
        federation: str,
        policy: Policy,
        policy_digest: str,
        context: ts.Context,
        fingerprint: str,
        signing_keys: Mapping[str, Ed25519PublicKey],
        stages: tuple[str, ...],
        store: AggregatorStore,
        decryptor: Decryptor,
        board: DecryptionBoard,
        index: UnionIndex,
        participation: Participation,
        changed: threading.Condition,
        log,
    ) -> None:
        self.federation = federation
        self.policy = policy
        self.policy_digest = policy_digest
        self.context = context
        self.fingerprint = fingerprint
        self.signing_keys = signing_keys
        self.stages = stages  # the method's stages: a round's detail names the stage when there are several
        self.store = store
        self.decryptor = decryptor
        self.board = board
        self.index = index
        self.participation = participation
        self.changed = changed
        self.log = log
        self.layouts = {kind: policy.upload_layout(kind) for kind in policy.allowed_kinds}
        self.open: OpenStage | None = None
        self.aggregating = False

    def accept_upload(self, bank: str, round_number: int, kind: str, chunks: list[bytes], receipt: Receipt) -> bool:
        """Check and keep one upload; True when it is new, False when it repeats an accepted one."""
        self.participation.bank_index(bank)
        withdrawn = self.participation.withdrawn
        with self.changed:
            if bank in withdrawn:
                raise ProtocolConflict("withdrawn", f"{bank} withdrew ({withdrawn[bank].reason}); it uploads no more")
            current = self.open
            if current is None or current.round != round_number:
                open_number = current.round if current else None
                raise ProtocolConflict("stale-round", f"round {round_number} is not open (open: {open_number})")
            if receipt.nonce != current.nonce:
                raise ProtocolConflict("stale-round", f"round {round_number} was reopened with a fresh nonce; retrain")
            if bank not in current.participants:
                raise ProtocolConflict("not-participant", f"{bank} is not a participant of round {round_number}")
            if kind not in current.shapes:
                raise CiphertextError(
                    f"round {round_number} (stage {current.stage!r}) expects kinds {sorted(current.shapes)}, "
                    f"not {kind!r}"
                )
            length = int(np.prod(current.shapes[kind]))
            ticket = RoundTicket(
                self.federation,
                current.round,
                current.nonce,
                current.participants,
                self.fingerprint,
                self.policy_digest,
            )
            upload = Upload(kind, list(chunks), length, receipt)
            check_upload(upload, self.signing_keys[bank], ticket, bank)
            previous = current.uploads.get(bank, {}).get(kind)
            if previous is not None:
                if previous.receipt.ciphertext_sha256 == receipt.ciphertext_sha256:
                    return False
                raise ProtocolConflict("already-uploaded", f"{bank} already uploaded other {kind!r} for this round")
        # parsing ciphertexts is the slow part: outside the lock, then re-check the round
        ciphertext = read_checked(self.context, upload, bank, packing.slot_length(self.layouts.get(kind), length))
        with self.changed:
            if self.open is not current:
                raise ProtocolConflict("stale-round", f"round {round_number} closed while the upload was checked")
            self.store.save_receipt(receipt)  # durable before the upload can count towards a decryption
            current.uploads.setdefault(bank, {})[kind] = upload
            current.ciphertexts.setdefault(bank, {})[kind] = ciphertext
            self.participation.seen[bank] = time.monotonic()
            self.changed.notify_all()
        return True

    def open_at_key_authority(self, stop: threading.Event, round_number: int, participants: tuple[str, ...]) -> str:
        """Open the round at the key authority (fresh nonce); waits out an unreachable or refusing one."""
        attempt = 0
        while True:
            nonce = secrets.token_hex(16)
            try:
                self.decryptor.open_round(self.federation, round_number, nonce, participants, self.policy_digest)
                return nonce
            except FedGLError as error:
                attempt += 1
                if attempt == 1 or attempt % 30 == 0:
                    self.log.error("round.open_failed", round=round_number, error=str(error)[:300], attempt=attempt)
                if stop.wait(1.0):
                    raise

    def run_stage(
        self,
        stop: threading.Event,
        round_number: int,
        version: int,
        nonce: str,
        stage: str,
        participants: tuple[str, ...],
        timer: PhaseTimer,
        reference: np.ndarray,
        *,
        first: bool,
        shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[str, tuple[str, ...], dict[str, np.ndarray]]:
        """Collect ``stage``'s uploads until its deadline (or every expected bank's), then decrypt its sums
        (the weights restored from their centring on ``reference``, the W̄ the stage's banks trained from).
        Returns ("decrypted", the banks whose uploads the sums hold, the sums), or the round's outcome with
        nothing: "stopped", "aborted" (a participant missing in the first stage: nothing was decrypted, the
        round reopens without it) or "abandoned" (a later stage, or a refused decryption: the next round number
        retries).
        ``shapes``: the stage's kinds and shapes when it is not one of the method's (the label prior's)."""
        log = self.log.bind(round=round_number, stage=stage)
        timeouts = self.policy.timeouts
        deadline = time.monotonic() + min(timeouts.upload_seconds, timeouts.round_seconds)
        shapes = self.index.stage_shapes(stage) if shapes is None else shapes
        current = OpenStage(round_number, version, nonce, participants, shapes, deadline, stage)
        withdrawn = self.participation.withdrawn
        with self.changed:
            self.open = current
            self.changed.notify_all()
        with self.changed:
            while time.monotonic() < deadline:
                if stop.is_set():
                    self.open = None
                    return "stopped", (), {}
                # banks that withdrew during the round are not waited for
                complete = current.complete_banks()
                expected = [b for b in participants if b in complete or b not in withdrawn]
                if len(complete) == len(expected) or len(expected) < len(participants):  # done, or never complete
                    break
                self.changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            complete = current.complete_banks()
            withdrew = sorted(b for b in participants if b in withdrawn and b not in complete)
            self.open = None
            self.aggregating = len(complete) == len(participants)
        if len(complete) < len(participants):  # every decryptor refuses a sum without all the participants (R13)
            missing = sorted(set(participants) - set(complete) - set(withdrew))
            detail = f"{len(complete)} of {len(participants)} banks uploaded every kind; each participant is needed"
            if not withdrew:  # the deadline passed: the reopened round goes without the late banks
                self.participation.missed.setdefault(version, set()).update(missing)
                detail += f"; late: {', '.join(missing)}"
            if len(self.stages) > 1:
                detail = f"stage {stage!r}: {detail}"
            if withdrew:
                detail += f"; withdrawn: {', '.join(withdrew)}"
            # after a first stage nothing was decrypted (reopen with a fresh nonce); after a later one the
            # round's earlier sums were, and the key authority never decrypts a (round, kind) twice
            status = "aborted" if first else "abandoned"
            self.store.close_round(round_number, status, detail)
            log.warning(f"round.{status}", complete=list(complete), missing=missing, withdrawn=withdrew, detail=detail)
            return status, (), {}
        try:
            sums = self.decrypt_sums(stop, current, complete, timer, reference)
        except FedGLError as error:  # DecryptionRefused included
            self.store.close_round(round_number, "abandoned", str(error))
            log.error("round.abandoned", error=str(error))
            return "abandoned", (), {}
        finally:
            with self.changed:
                self.aggregating = False
        return "decrypted", complete, sums

    def decrypt_sums(
        self,
        stop: threading.Event,
        current: OpenStage,
        complete: tuple[str, ...],
        timer: PhaseTimer,
        reference: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Each kind's sum, threshold-decrypted: the key authority's partial decryption, then ``t`` banks' from the
        board (contributors first, then any bank alive), fused here (``crypto/partial_decryption.py``)."""
        sums = {}
        threshold = self.policy.he.threshold
        alive = self.participation.alive
        left_out: set[str] = set()  # banks that failed a decryption of this round are not asked for its next sums
        for kind, shape in current.shapes.items():
            uploads = [current.uploads[bank][kind] for bank in complete]
            length = int(np.prod(shape))
            layout = self.layouts.get(kind)
            slots = packing.slot_length(layout, length)
            receipts = [upload.receipt for upload in uploads]
            read = [current.ciphertexts[bank][kind] for bank in complete]
            c1s = [ciphertext.c1 for ciphertext in read]  # every decryptor sums them itself
            with timer.phase("aggregation"):
                summed = residue_sum.add(self.context, read)
            with timer.phase("decryption"):  # the key authority's share, then t banks' (on their machines)
                authority = self.decryptor.decrypt(
                    self.federation, current.round, kind, receipts, self.fingerprint, slots, c1s
                )
                others = sorted(b for b in self.participation.banks if b not in complete and alive(b))
                candidates = [*complete, *others]
                candidates = [bank for bank in candidates if bank not in left_out]
                _, partials = self.board.gather(
                    current.round,
                    kind,
                    receipts,
                    c1s,
                    candidates,
                    threshold,
                    self.policy.timeouts.decryption_seconds,
                    alive,
                    stop,
                    left_out,
                )
            with timer.phase("aggregation"):  # fusing and decoding
                values = fused_values(self.context, summed, [authority, *partials], length, layout, len(uploads))
                values = restore_sum(kind, values, reference)
            self.log.info(  # the key authority's share of the decryption traffic (each bank logs its own)
                "sum.decrypted",
                round=current.round,
                kind=kind,
                values=length,
                uploads=len(uploads),
                authority_c1_bytes=sum(c1.nbytes for c1 in c1s),
                authority_partial_bytes=authority.nbytes,
            )
            self.store.save_sum(current.round, kind, current.nonce, values, complete)
            sums[kind] = values
        return sums
