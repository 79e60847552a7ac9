"""The key authority (DESIGN §5.3 step 4): holds the CKKS secret key, decrypts sums under rules.

It decrypts a summed ciphertext only if

1. the caller's role is ``aggregator``;
2. the kind may leave a bank under the policy;
3. the request's context fingerprint is this authority's;
4. the round is the federation's open round (right number and nonce);
5. the receipts verify against the registered bank keys, are bound to this (federation, round,
   nonce, kind, context), come from distinct participating banks, and are at least the policy's
   quorum (never fewer than 2);
6. the request holds exactly as many ciphertexts as the receipted uploads (the receipts bind their
   number of values), and each is exactly their sum: its ``c1`` equals the sum of the uploads' ``c1``,
   which the aggregator sends beside it and the receipts bind by digest (``c1`` carries only encryption
   randomness, so the authority learns nothing of a single upload from it). A malicious aggregator can
   therefore neither choose the ``c1`` a reply reveals a combination of the key for, nor drop a bank
   from a sum; what it adds to ``c0`` (its pad) only shifts the plaintext it will learn;
7. this (federation, round, kind) was never decrypted before, and no ciphertext (``c1``) was ever
   decrypted before in the federation — the SQLite ledger survives restarts, which blocks differencing
   attacks across re-submissions;
8. the ciphertexts decrypted under this key stay within the policy's ``he.max_decryptions``, the query
   budget the noise flooding is sized for.

**What it decrypts.** The aggregator pads every summed ciphertext with a fresh uniform element r of
the plaintext ring (``crypto/masking.py``); the authority decrypts ``m + e + r mod q`` and returns those
residues (NTT form, uint64, one vector of N per data prime), never decoded to slots — a view that has
the same distribution whatever the sum is. Each reply carries noise flooding
(:func:`~fedgl_secure.crypto.ring_mask.decrypt_flooded`, σ from
:func:`~fedgl_secure.policy.packing_layout.flooding_std`): an exact decryption ``c0 + c1·s`` of a
ciphertext the aggregator knows would hand it the secret key, and a small fresh error averages away over
repeated replies (Li–Micciancio); the flooding is sized so the policy's query budget reveals at most
``2^−statistical_security`` about the key. The ciphertexts must be SEAL
ciphertexts of this context at the data level, at the scale the policy gives the kind
(``Policy.upload_layout``); anything else is ``bad-ciphertext``.

**Central DP noise.** When the policy's channel for the kind says ``noise = "central"``, the
authority draws Gaussian noise N(0, σ²) from the OS CSPRNG
(:func:`~fedgl_secure.privacy.guarantees.central_noise`), σ =
:func:`~fedgl_secure.privacy.guarantees.noise_std` (normalised scale), CKKS-encodes it at the
ciphertext's scale and adds it to what it decrypted, ``m + e + r + Encode(n)`` — the same as
adding the plaintext to the ciphertext before decrypting, and the same as noising the sum, which it
never sees; the aggregator then removes its pad and decodes s + n + e, never s. The last entry of
``weights`` (Σ ŵ_k, public) gets none. The allowed decision's audit record names it
(``central_noise_std``, ``central_noise_values``). Banks add no share for a central channel and
account for it as such (:mod:`fedgl_secure.privacy.dp_round`). The noise shares the sum's range with
the banks' terms (``upload.TERMS_SHARE``): σ too large for it is refused when the authority starts.

Every decision, allowed or refused, is appended to the hash-chained audit log. The secret key is
only ever on disk sealed under the operator secret. The HTTP service is a thin shell over this.

What it cannot stop alone: it holds the whole secret key, so the key authority itself (or anyone with its
state and operator secret) can decrypt any upload it is shown; threshold decryption (issue 27, part 2) removes
that single point.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from enum import Enum
from pathlib import Path

import numpy as np
import tenseal as ts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedgl_secure.crypto import ckks, packing, ring_mask
from fedgl_secure.crypto.audit import AuditLog, ChainReport, verify_audit_chain
from fedgl_secure.crypto.ledger import Ledger, OpenRound
from fedgl_secure.crypto.receipts import (
    Receipt,
    c1_digest,
    load_public_key,
    parse_receipt,
    public_key_bytes,
    verify_receipt,
)
from fedgl_secure.crypto.sealing import seal_secret_context, unseal_secret_context
from fedgl_secure.crypto.upload import TERMS_SHARE
from fedgl_secure.errors import (
    CiphertextError,
    ContextError,
    CryptoError,
    DecryptionRefused,
    PolicyError,
    ReceiptError,
)
from fedgl_secure.fileio import PRIVATE_FILE_MODE, write_atomically
from fedgl_secure.log import get_logger
from fedgl_secure.policy.ckks_params import sum_bound
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.guarantees import central_noise, central_noise_count, central_noise_stds

AGGREGATOR = "aggregator"
SEALED_FILE = "secret_context.sealed"
PUBLIC_FILE = "public_context.bin"
LEDGER_FILE = "ledger.sqlite3"
AUDIT_FILE = "audit.jsonl"
AUDIT_HEAD = "audit_head"
HE_PARAMETERS = "he_parameters"
NOISE_SIGMAS = 8.0  # central noise must fit the sum's spare range this many standard deviations out


def _without_retired(recorded: str) -> dict:
    """Recorded HE parameters minus ``mask_bits``: the retired slot mask never shaped the keys."""
    parameters = json.loads(recorded)
    parameters.pop("mask_bits", None)
    return parameters


class Refusal(str, Enum):
    """Stable reason codes of :class:`DecryptionRefused` (also written to the audit log)."""

    NOT_AGGREGATOR = "not-aggregator"
    KIND_NOT_ALLOWED = "kind-not-allowed"
    FOREIGN_CONTEXT = "foreign-context"
    NO_OPEN_ROUND = "no-open-round"
    STALE_ROUND = "stale-round"
    UNKNOWN_SENDER = "unknown-sender"
    NOT_PARTICIPANT = "not-participant"
    BAD_RECEIPT = "bad-receipt"
    RECEIPT_MISMATCH = "receipt-mismatch"
    DUPLICATE_SENDER = "duplicate-sender"
    BELOW_QUORUM = "below-quorum"
    ALREADY_DECRYPTED = "already-decrypted"
    BAD_CIPHERTEXT = "bad-ciphertext"
    FOREIGN_FEDERATION = "foreign-federation"
    WRONG_SHAPE = "wrong-shape"  # more or fewer ciphertexts or values than the receipted uploads hold
    NOT_A_SUM = "not-a-sum"  # a ciphertext that is not exactly the sum of the receipted uploads
    REPEATED_CIPHERTEXT = "repeated-ciphertext"  # sent twice, or already decrypted in this federation
    BUDGET_EXHAUSTED = "budget-exhausted"  # beyond the query budget the noise flooding holds for
    POLICY_MISMATCH = "policy-mismatch"  # a receipt signed under another policy than the authority's


class KeyAuthority:
    """In-process key authority over a state directory (sealed key, public context, ledger, audit log).

    Creating it on an empty directory generates the CKKS key pair; creating it again on the same
    directory (a restart) unseals the same key and keeps the ledger and the audit chain.
    """

    def __init__(
        self, state_dir: str | Path, policy: Policy, operator_secret: bytes | str, federation: str | None = None
    ) -> None:
        # the range left to central noise by the banks' terms, in value units (unpacked, at the global scale);
        # checked before any key or ledger exists
        self._noise_room = sum_bound(policy.he.coeff_mod_bit_sizes, policy.he.global_scale_bits) * (1 - TERMS_SHARE)
        too_wide = {k: s for k, s in central_noise_stds(policy).items() if NOISE_SIGMAS * s >= self._noise_room}
        if too_wide:
            raise PolicyError(
                f"central noise σ {too_wide} does not fit the range the HE parameters leave it ({self._noise_room:g} "
                f"at {NOISE_SIGMAS:g} σ); enlarge he.coeff_mod_bit_sizes or lower he.global_scale_bits"
            )
        self.state_dir = Path(state_dir)
        self.federation = federation  # when set, every other federation id is refused
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.policy = policy
        self.log = get_logger(role="key-authority", state_dir=str(self.state_dir))
        self._lock = threading.Lock()
        self.ledger = Ledger(self.state_dir / LEDGER_FILE)
        try:
            self._secret_context, self.public_context = self._load_or_create_keys(operator_secret)
            self._check_he_parameters()
            self.audit = AuditLog(self.state_dir / AUDIT_FILE, self.ledger.get_meta(AUDIT_HEAD))
        except Exception:
            self.ledger.close()
            raise
        self.fingerprint = ckks.fingerprint(self.public_context)
        self.central_noise_std = central_noise_stds(policy)
        self.flooding_std = policy.he.flooding_std()
        self.policy_digest = policy.digest
        self.level = ring_mask.data_level(self._secret_context)
        self.log = self.log.bind(fingerprint=self.fingerprint[:12])
        self._record({"event": "start", "decision": "allowed", "fingerprint": self.fingerprint})

    def _check_he_parameters(self) -> None:
        """The key pair was made for some HE parameters; a policy asking for others must not run on it."""
        wanted = self.policy.he.model_dump_json()
        recorded = self.ledger.get_meta(HE_PARAMETERS)
        if recorded is None:
            self.ledger.set_meta(HE_PARAMETERS, wanted)
        elif _without_retired(recorded) != json.loads(wanted):
            raise ContextError(
                f"{self.state_dir}: the key pair was made for HE parameters {recorded}, the policy asks for {wanted}; "
                "use a fresh state directory to generate keys for the new parameters"
            )

    def _load_or_create_keys(self, operator_secret: bytes | str) -> tuple[ts.Context, bytes]:
        sealed_path, public_path = self.state_dir / SEALED_FILE, self.state_dir / PUBLIC_FILE
        if sealed_path.exists():
            context = ckks.load_context(unseal_secret_context(sealed_path.read_bytes(), operator_secret))
            if not ckks.has_secret_key(context):
                raise CryptoError(f"{sealed_path}: the sealed context holds no secret key")
            public = ckks.public_context_bytes(context)  # deterministic: the same bytes as at creation
            if public_path.exists() and public_path.read_bytes() != public:
                raise CryptoError(f"{public_path}: does not belong to the sealed secret key (replaced or altered)")
            self.log.info("keys.unsealed")
            return context, public
        context = ckks.create_secret_context(self.policy.he)
        public = ckks.public_context_bytes(context)
        write_atomically(
            sealed_path, seal_secret_context(ckks.secret_context_bytes(context), operator_secret), PRIVATE_FILE_MODE
        )
        write_atomically(public_path, public)
        self.log.info("keys.created", he=self.policy.he.model_dump())
        return context, public

    def close(self) -> None:
        self.ledger.close()

    def verify_audit(self) -> ChainReport:
        """Check the hash-chained audit log against the head the ledger recorded (no append runs meanwhile)."""
        with self._lock:
            return verify_audit_chain(self.audit.path, self.ledger.get_meta(AUDIT_HEAD))

    def _record(self, event: dict) -> None:
        record = self.audit.append(event)
        self.ledger.set_meta(AUDIT_HEAD, record["hash"])

    # --- banks and rounds -------------------------------------------------------------------

    def register_bank(self, name: str, public_key: Ed25519PublicKey) -> None:
        """Enrol a bank's receipt-signing key (from provisioning); a name keeps its first key forever."""
        raw = public_key_bytes(public_key)
        on_record = self.ledger.register_bank(name, raw)
        if on_record != raw:
            self._record({"event": "register", "decision": "refused", "reason": "key-mismatch", "bank": name})
            raise ReceiptError(f"bank {name!r} is already registered with a different signing key")
        self._record({"event": "register", "decision": "allowed", "bank": name})

    def open_round(
        self, federation: str, round_number: int, nonce: str, participants: Sequence[str], policy_sha256: str
    ) -> None:
        """Open (or reopen with a fresh nonce) round ``round_number``; earlier rounds become stale. The aggregator's
        policy digest must be this authority's: one policy for every node."""
        names = tuple(sorted(set(participants)))
        with self._lock:
            current = self.ledger.current_round(federation)
            problem = None
            if policy_sha256 != self.policy_digest:
                problem = (
                    f"the aggregator runs policy {policy_sha256[:12]}…, this key authority {self.policy_digest[:12]}…; "
                    "every node must run the same policy file"
                )
            elif self.federation is not None and federation != self.federation:
                problem = f"this key authority serves federation {self.federation!r} only"
            elif current is not None and round_number < current.round:
                problem = f"round {round_number} is older than the open round {current.round}"
            elif current is not None and round_number == current.round and nonce == current.nonce:
                problem = f"round {round_number} is already open with this nonce"
            elif unknown := [name for name in names if name not in self.ledger.banks()]:
                problem = f"participants {unknown} are not registered banks"
            elif len(names) < self._quorum():
                problem = f"{len(names)} participants cannot reach the quorum of {self._quorum()}"
            event = {
                "event": "open-round",
                "federation": federation,
                "round": round_number,
                "participants": list(names),
            }
            if problem is not None:
                self._record({**event, "decision": "refused", "reason": problem})
                raise PolicyError(f"cannot open round {round_number} of {federation}: {problem}")
            self.ledger.open_round(federation, round_number, nonce, names)
            self._record({**event, "decision": "allowed"})
        self.log.info("round.opened", federation=federation, round=round_number, participants=len(names))

    def _quorum(self) -> int:
        return self.policy.quorum  # the policy validator enforces quorum >= 2

    # --- decryption -------------------------------------------------------------------------

    def decrypt_sum(
        self,
        caller_role: str,
        federation: str,
        round_number: int,
        kind: str,
        summed_chunks: Sequence[bytes],
        receipts: Sequence[Receipt | dict | str | bytes],
        fingerprint: str,
        length: int,
        upload_c1: Sequence[np.ndarray],
    ) -> np.ndarray:
        """Decrypt one padded fused sum of ``length`` slot values if every rule holds; otherwise raise
        :class:`DecryptionRefused`. ``upload_c1`` holds, for each receipt in order, the ``c1`` polynomials of that
        bank's upload (chunks, data primes, N): the sum is decrypted only if each summed chunk's ``c1`` is exactly
        their sum. Returns the plaintext residues, shape (chunks, data primes, N), uint64, flooded."""
        log = self.log.bind(caller=caller_role, federation=federation, round=round_number, kind=kind)
        event = {
            "event": "decrypt",
            "caller": caller_role,
            "federation": federation,
            "round": round_number,
            "kind": kind,
        }
        with self._lock:
            try:
                open_round = self._check_request(caller_role, federation, round_number, kind, fingerprint)
                checked = self._check_receipts(receipts, open_round, kind)
                senders = tuple(sorted(receipt.sender for receipt in checked))
                if self.ledger.was_decrypted(federation, round_number, kind):
                    raise DecryptionRefused(
                        Refusal.ALREADY_DECRYPTED.value, f"{kind!r} of round {round_number} was already decrypted"
                    )
                ciphertexts, summed_c1 = self._verified_sum(kind, summed_chunks, length, checked, upload_c1)
                digests = [c1_digest(c1) for c1 in summed_c1]
                self._check_fresh(federation, digests)
                noise = self._central_noise(kind, length)  # drawn before the decryption is consumed
                view = self._decrypt_padded(ciphertexts, noise)
                if not self.ledger.record_decryption(
                    federation, round_number, kind, open_round.nonce, senders, digests
                ):
                    raise DecryptionRefused(
                        Refusal.ALREADY_DECRYPTED.value, f"{kind!r} of round {round_number}, or one of its ciphertexts"
                    )
            except DecryptionRefused as refusal:
                self._record({**event, "decision": "refused", "reason": refusal.reason, "detail": refusal.detail})
                log.warning("decrypt.refused", reason=refusal.reason, detail=refusal.detail)
                raise
            allowed = {
                **event,
                "decision": "allowed",
                "senders": list(senders),
                "values": length,
                "ciphertexts": len(digests),
                "flooding_std": self.flooding_std,
            }
            if noise is not None:
                noised = central_noise_count(kind, length)
                allowed |= {"central_noise_std": self.central_noise_std[kind], "central_noise_values": noised}
            self._record(allowed)
        log.info(
            "decrypt.allowed",
            senders=len(senders),
            values=length,
            central_noise_std=self.central_noise_std.get(kind),
        )
        return view

    def _verified_sum(
        self,
        kind: str,
        chunks: Sequence[bytes],
        length: int,
        receipts: Sequence[Receipt],
        upload_c1: Sequence[np.ndarray],
    ) -> tuple[list, np.ndarray]:
        """The summed chunks as SEAL ciphertexts, once they are exactly the sum of the receipted uploads, and their
        ``c1`` (chunks, data primes, N).

        The receipts fix how many values (hence chunks) the kind has and each upload's ``c1`` digest; the
        aggregator's ``c1`` polynomials must match those digests, and every summed chunk's ``c1`` must be their
        sum modulo the data primes. ``c1`` is what decides which combination of the key a reply reveals, so the
        aggregator can neither choose it (a crafted or repeated ciphertext) nor drop a bank from a sum; what it
        adds to ``c0`` (its pad) only shifts the plaintext it will learn."""
        values = {receipt.values for receipt in receipts}
        if len(values) != 1:
            raise DecryptionRefused(
                Refusal.RECEIPT_MISMATCH.value, f"the receipts disagree on the upload's size: {sorted(values)} values"
            )
        layout = self.policy.upload_layout(kind)
        expected_slots = packing.slot_length(layout, values.pop())
        per_chunk = self.level.degree // 2
        expected_chunks = ckks.chunk_count(expected_slots, per_chunk)
        if length != expected_slots:
            raise DecryptionRefused(
                Refusal.WRONG_SHAPE.value,
                f"the request announces {length} slot values; the receipted uploads hold {expected_slots}",
            )
        if len(chunks) != expected_chunks:
            raise DecryptionRefused(
                Refusal.WRONG_SHAPE.value,
                f"{len(chunks)} ciphertexts sent; the receipted uploads of {kind!r} have {expected_chunks}",
            )
        if len(upload_c1) != len(receipts):
            raise DecryptionRefused(
                Refusal.NOT_A_SUM.value,
                f"c1 polynomials of {len(upload_c1)} uploads sent for {len(receipts)} receipts",
            )
        total = np.zeros((expected_chunks, *self.level.shape), dtype=np.uint64)
        for receipt, c1 in zip(receipts, upload_c1, strict=True):
            try:
                residues = ring_mask.check_residues(self.level, c1, expected_chunks, f"c1 of {receipt.sender!r}")
            except CiphertextError as error:
                raise DecryptionRefused(Refusal.NOT_A_SUM.value, str(error)) from None
            if c1_digest(residues) != receipt.c1_sha256:
                raise DecryptionRefused(
                    Refusal.NOT_A_SUM.value,
                    f"the c1 polynomials given for {receipt.sender!r} are not the ones it signed",
                )
            total = ring_mask.add_mod(total, residues, self.level)
        scale = 2.0 ** (layout.scale_bits if layout is not None else self.policy.he.global_scale_bits)
        ciphertexts = []
        for index, data in enumerate(chunks):
            try:
                ciphertext = ring_mask.load_ciphertext(self._secret_context, data, self.level, f"chunk {index}")
                polys = ring_mask.ciphertext_polys(ciphertext, self.level)
            except CryptoError as error:
                raise DecryptionRefused(Refusal.BAD_CIPHERTEXT.value, str(error)) from None
            if ciphertext.scale != scale:
                raise DecryptionRefused(
                    Refusal.BAD_CIPHERTEXT.value,
                    f"chunk {index}: scale 2^{np.log2(ciphertext.scale):.4g}, but {kind!r} is encrypted at "
                    f"2^{np.log2(scale):.4g} under the policy",
                )
            if not np.array_equal(polys[1], total[index]):
                raise DecryptionRefused(
                    Refusal.NOT_A_SUM.value,
                    f"chunk {index} is not the sum of the {len(receipts)} receipted uploads (its c1 differs)",
                )
            ciphertexts.append(ciphertext)
        return ciphertexts, total

    def _check_fresh(self, federation: str, digests: Sequence[str]) -> None:
        """Refuse a ciphertext sent twice, or one already decrypted in this federation, and a request beyond the
        decryption budget the flooding was sized for."""
        if len(set(digests)) != len(digests):
            raise DecryptionRefused(Refusal.REPEATED_CIPHERTEXT.value, "the request repeats a ciphertext (same c1)")
        seen = self.ledger.decrypted_ciphertexts(federation, digests)
        if seen:
            raise DecryptionRefused(
                Refusal.REPEATED_CIPHERTEXT.value,
                f"{len(seen)} of the ciphertexts were already decrypted in federation {federation!r}",
            )
        spent = self.ledger.decryption_count()
        budget = self.policy.he.max_decryptions
        if spent + len(digests) > budget:
            raise DecryptionRefused(
                Refusal.BUDGET_EXHAUSTED.value,
                f"{spent} ciphertexts decrypted under this key; {len(digests)} more exceed he.max_decryptions = "
                f"{budget}, the query budget the noise flooding holds for (a fresh key is needed)",
            )

    def _decrypt_padded(self, ciphertexts: Sequence, noise: np.ndarray | None) -> np.ndarray:
        """The flooded residues of every padded chunk's plaintext, plus the encoded central noise when there is
        any."""
        slots = self.level.degree // 2
        view = np.empty((len(ciphertexts), *self.level.shape), dtype=np.uint64)
        for index, ciphertext in enumerate(ciphertexts):
            view[index] = ring_mask.decrypt_flooded(self._secret_context, ciphertext, self.level, self.flooding_std)
            if noise is not None:  # Dec(ct) + Encode(n) = Dec(ct + Encode(n)): decryption is linear
                part = noise[index * slots : (index + 1) * slots]
                encoded = ring_mask.encode(self._secret_context, self.level, part, ciphertext.scale)
                view[index] = ring_mask.add_mod(view[index], encoded, self.level)
        return view

    def _central_noise(self, kind: str, length: int) -> np.ndarray | None:
        """N(0, σ²) for every value of a kind whose DP channel is central (the weights' last entry: 0), else None."""
        std = self.central_noise_std.get(kind)
        if std is None or length == 0:
            return None
        noise = central_noise(kind, length, std)
        if float(np.abs(noise).max()) >= self._noise_room:  # beyond NOISE_SIGMAS σ: never in practice, never wrap
            raise DecryptionRefused(Refusal.BAD_CIPHERTEXT.value, "central noise draw beyond the sum's spare range")
        return noise

    def _check_request(
        self, caller_role: str, federation: str, round_number: int, kind: str, fingerprint: str
    ) -> OpenRound:
        if caller_role != AGGREGATOR:
            raise DecryptionRefused(Refusal.NOT_AGGREGATOR.value, f"role {caller_role!r} may not request decryption")
        if self.federation is not None and federation != self.federation:
            raise DecryptionRefused(
                Refusal.FOREIGN_FEDERATION.value, f"this key authority serves federation {self.federation!r} only"
            )
        if kind not in self.policy.allowed_kinds:
            raise DecryptionRefused(Refusal.KIND_NOT_ALLOWED.value, f"the policy does not let {kind!r} leave a bank")
        if fingerprint != self.fingerprint:
            raise DecryptionRefused(
                Refusal.FOREIGN_CONTEXT.value,
                f"context {fingerprint[:12]}… is not this authority's {self.fingerprint[:12]}…",
            )
        current = self.ledger.current_round(federation)
        if current is None:
            raise DecryptionRefused(Refusal.NO_OPEN_ROUND.value, f"federation {federation!r} has no open round")
        if round_number != current.round:
            raise DecryptionRefused(
                Refusal.STALE_ROUND.value, f"round {round_number} is not the open round {current.round}"
            )
        return current

    def _check_receipts(self, receipts: Sequence, open_round: OpenRound, kind: str) -> list[Receipt]:
        banks = self.ledger.banks()
        expected = {
            "federation": open_round.federation,
            "round": open_round.round,
            "nonce": open_round.nonce,
            "kind": kind,
            "context_fingerprint": self.fingerprint,
        }
        checked: list[Receipt] = []
        for position, raw in enumerate(receipts):
            try:
                receipt = raw if isinstance(raw, Receipt) else parse_receipt(raw)
            except ReceiptError as error:
                raise DecryptionRefused(Refusal.BAD_RECEIPT.value, f"receipt {position}: {error}") from None
            if receipt.sender not in banks:
                raise DecryptionRefused(Refusal.UNKNOWN_SENDER.value, f"receipt {position}: {receipt.sender!r}")
            try:
                verify_receipt(load_public_key(banks[receipt.sender]), receipt)
            except ReceiptError as error:
                raise DecryptionRefused(Refusal.BAD_RECEIPT.value, f"receipt {position}: {error}") from None
            if receipt.policy_sha256 != self.policy_digest:
                raise DecryptionRefused(
                    Refusal.POLICY_MISMATCH.value,
                    f"receipt {position} from {receipt.sender!r} was signed under policy "
                    f"{receipt.policy_sha256[:12]}…, this key authority runs {self.policy_digest[:12]}…",
                )
            wrong = [name for name, value in expected.items() if getattr(receipt, name) != value]
            if wrong:
                raise DecryptionRefused(
                    Refusal.RECEIPT_MISMATCH.value,
                    f"receipt {position} from {receipt.sender!r} is bound to another {', '.join(wrong)}",
                )
            if receipt.sender not in open_round.participants:
                raise DecryptionRefused(
                    Refusal.NOT_PARTICIPANT.value,
                    f"{receipt.sender!r} is not a participant of round {open_round.round}",
                )
            if any(receipt.sender == other.sender for other in checked):
                raise DecryptionRefused(Refusal.DUPLICATE_SENDER.value, f"two receipts from {receipt.sender!r}")
            checked.append(receipt)
        if len(checked) < self._quorum():
            raise DecryptionRefused(
                Refusal.BELOW_QUORUM.value, f"{len(checked)} valid receipts, the quorum is {self._quorum()}"
            )
        return checked
