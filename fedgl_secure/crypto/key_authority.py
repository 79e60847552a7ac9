"""The key authority (DESIGN §5.3 step 4): one share of the federation's CKKS key, partial decryptions under rules.

No party holds the secret key. The key authority holds ``s_0``; the banks hold Shamir shares of their own part
(``threshold.py``), and a sum decrypts only with the key authority's partial decryption **and** ``t`` banks'. The key
authority also relays the key ceremony (``key_ceremony.py``; its messages in ``ceremony_messages.py`` and
``share_envelopes.py``): the banks' signed public shares and their Shamir shares, each sealed to its recipient, which
it can neither read nor forge.

It gives its partial decryption of a sum only if

1. the caller's role is ``aggregator``;
2. the kind may leave a bank under the policy;
3. the request's context fingerprint is the federation's collective context;
4. the round is the federation's open round (right number and nonce);
5. the receipts verify against the registered bank keys, are bound to this (federation, round, nonce, kind,
   context, policy), come from distinct participating banks, and are at least the policy's quorum (never below 2);
6. each receipted upload's ``c1`` (sent beside the receipts) is the one its receipt signed, and the request holds
   as many chunks as the receipts' values make; the authority multiplies its share by **their sum, which it computes
   itself** (``partial_decryption.py``), so it never applies its share to a ``c1`` the aggregator chose;
7. this (federation, round, kind) was never decrypted before, and no summed ``c1`` was ever decrypted before in the
   federation — the SQLite ledger survives restarts, which blocks differencing across re-submissions;
8. the ciphertexts decrypted under this share stay within the policy's ``he.max_decryptions``, the query budget
   the noise flooding is sized for.

Each reply is ``c1·s_0 + E`` (NTT-form residues, uint64), ``E`` fresh noise flooding
(:func:`~fedgl_secure.policy.packing_layout.flooding_std`): an exact ``c1·s_0`` of a ``c1`` the aggregator knows
would hand it ``s_0``, and a small fresh error averages away over repeated replies (Li–Micciancio). The reply
reveals nothing of the sum without ``t`` banks' partials, and nothing of ``s_0`` within the query budget.

**Central DP noise.** When the policy's channel for the kind says ``noise = "central"``, the authority draws Gaussian
noise N(0, σ²) from the OS CSPRNG (:func:`~fedgl_secure.privacy.calibration.central_noise`), σ =
:func:`~fedgl_secure.privacy.calibration.noise_std` (normalised scale), CKKS-encodes it at the kind's scale and adds
it to its partial decryption: the fused result is then ``s + n + e``, never ``s`` — the same as noising the sum, which
it never sees. The last entry of ``weights`` (Σ ŵ_k, public) gets none. The allowed decision's audit record names it
(``central_noise_std``, ``central_noise_values``). Banks add no share for a central channel and account for it as
such (:mod:`fedgl_secure.privacy.dp_round`). The noise shares the sum's range with the banks' terms
(``upload.TERMS_SHARE``): σ too large for it is refused when the authority starts.

Every decision, allowed or refused, is appended to the hash-chained audit log. ``s_0`` is only ever on disk sealed
under the operator secret (``held_share.seal_held_share``). The HTTP service is a thin shell over this.

What it cannot stop alone: the aggregator learns every fused sum by design, and a sum over the quorum with
quorum − 1 colluding banks tells it the remaining bank's term (the quorum bounds that; docs/threat-model.md).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedgl_secure.crypto import ceremony_messages, ckks, held_share, key_ceremony, residues, seal_residues, threshold
from fedgl_secure.crypto.audit_log import AuditLog, ChainReport, verify_audit_chain
from fedgl_secure.crypto.ceremony_messages import Announcement, Roster
from fedgl_secure.crypto.flooding_reserve import FloodingReserve
from fedgl_secure.crypto.held_share import HeldShare
from fedgl_secure.crypto.ledger import Ledger, OpenRound
from fedgl_secure.crypto.partial_decryption import (
    Refusal,
    check_receipts,
    chunk_digests,
    expected_slots,
    partial_residues,
    summed_c1,
)
from fedgl_secure.crypto.receipts import Receipt, load_public_key, public_key_bytes
from fedgl_secure.crypto.share_envelopes import ShareEnvelope
from fedgl_secure.crypto.upload import TERMS_SHARE
from fedgl_secure.errors import (
    ContextError,
    CryptoError,
    DecryptionRefused,
    PolicyError,
    ProtocolConflict,
    ReceiptError,
)
from fedgl_secure.fileio import PRIVATE_FILE_MODE, write_atomically
from fedgl_secure.log import get_logger
from fedgl_secure.policy.ckks_params import sum_bound
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.calibration import central_noise, central_noise_count, central_noise_stds

__all__ = ["AGGREGATOR", "KeyAuthority", "Refusal"]

AGGREGATOR = "aggregator"
SEALED_FILE = "authority_share.sealed"
AUTHORITY_SHARE_FILE = "authority_public_share.bin"
PUBLIC_FILE = "public_context.bin"
CEREMONY_DIR = "ceremony"
LEDGER_FILE = "ledger.sqlite3"
AUDIT_FILE = "audit.jsonl"
AUDIT_HEAD = "audit_head"
HE_PARAMETERS = "he_parameters"
ROSTER = "roster_sha256"
POLICY = "policy_sha256"  # the policy the key share was made under: bound into the key
AUTHORITY_SHARE_SHA256 = "authority_public_share_sha256"
NOISE_SIGMAS = 8.0  # central noise must fit the sum's spare range this many standard deviations out


def _without_retired(recorded: str) -> dict:
    """Recorded HE parameters minus ``mask_bits``: the retired slot mask never shaped the keys."""
    parameters = json.loads(recorded)
    parameters.pop("mask_bits", None)
    return parameters


class KeyAuthority:
    """In-process key authority over a state directory (sealed key share, ceremony messages, public context, ledger,
    audit log) for the federation and banks of ``roster``.

    Creating it on an empty directory samples its key share ``s_0`` and publishes ``p_0``; the collective public
    context exists once every bank of the roster has announced its public share (:meth:`accept_announcement`).
    Creating it again on the same directory (a restart) unseals the same share and keeps the ceremony, the ledger and
    the audit chain.
    """

    def __init__(self, state_dir: str | Path, policy: Policy, operator_secret: bytes | str, roster: Roster) -> None:
        # the range left to central noise by the banks' terms, in value units (unpacked, at the global scale);
        # checked before any key or ledger exists
        self._noise_room = sum_bound(policy.he.coeff_mod_bit_sizes, policy.he.global_scale_bits) * (1 - TERMS_SHARE)
        too_wide = {k: s for k, s in central_noise_stds(policy).items() if NOISE_SIGMAS * s >= self._noise_room}
        if too_wide:
            raise PolicyError(
                f"central noise σ {too_wide} does not fit the range the HE parameters leave it ({self._noise_room:g} "
                f"at {NOISE_SIGMAS:g} σ); enlarge he.coeff_mod_bit_sizes or lower he.global_scale_bits"
            )
        if roster.threshold != policy.he.threshold:
            raise PolicyError(f"the roster's threshold {roster.threshold} is not the policy's he.threshold")
        if roster.policy_sha256 != policy.digest:
            raise PolicyError(
                f"the roster binds policy {roster.policy_sha256[:12]}…, this key authority runs {policy.digest[:12]}…; "
                "every node must run the same policy file"
            )
        self.state_dir = Path(state_dir)
        self.roster = roster
        self.federation = roster.federation  # every other federation id is refused
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / CEREMONY_DIR).mkdir(exist_ok=True)
        self.policy = policy
        self.log = get_logger(role="key-authority", state_dir=str(self.state_dir), federation=self.federation)
        self._lock = threading.Lock()
        self.ledger = Ledger(self.state_dir / LEDGER_FILE)
        self._operator_secret = operator_secret
        try:
            self._check_he_parameters()
            self.rings = threshold.rings_for(policy.he)
            self._crp = threshold.common_random_polynomial(self.rings, self.roster.digest())
            held, self.authority_share = self._load_or_create_share()
            self._hold(held)
            self.audit = AuditLog(self.state_dir / AUDIT_FILE, self.ledger.get_meta(AUDIT_HEAD))
        except Exception:
            self.ledger.close()
            raise
        self.central_noise_std = central_noise_stds(policy)
        self.flooding_std = policy.he.flooding_std()
        self.policy_digest = policy.digest
        self.level = self.rings.data
        self._flooding = FloodingReserve(self.rings.context, self.level, self.flooding_std)
        self._record({"event": "start", "decision": "allowed", "roster": roster.digest()})
        self._complete_ceremony()

    def _check_he_parameters(self) -> None:
        """The key share was made for some HE parameters and roster; a policy or consortium asking for others must
        not run on it."""
        wanted = self.policy.he.model_dump_json()
        recorded = self.ledger.get_meta(HE_PARAMETERS)
        if recorded is None:
            self.ledger.set_meta(HE_PARAMETERS, wanted)
        elif _without_retired(recorded) != json.loads(wanted):
            raise ContextError(
                f"{self.state_dir}: the key share was made for HE parameters {recorded}, the policy asks for {wanted}; "
                "use a fresh state directory to generate keys for the new parameters"
            )
        made_under = self.ledger.get_meta(POLICY)
        if made_under is None:
            self.ledger.set_meta(POLICY, self.policy.digest)
        elif made_under != self.policy.digest:
            raise ContextError(
                f"{self.state_dir}: the key share was made under policy {made_under[:12]}…, this key authority runs "
                f"{self.policy.digest[:12]}…; the policy is bound into the key (one policy for all): run the policy "
                "the federation was made under, or make a new key in a fresh state directory"
            )
        roster = self.ledger.get_meta(ROSTER)
        if roster is None:
            self.ledger.set_meta(ROSTER, self.roster.digest())
        elif roster != self.roster.digest():
            raise ContextError(
                f"{self.state_dir}: the key share was made for another federation or bank list (roster "
                f"{roster[:12]}…, now {self.roster.digest()[:12]}…: {self.roster.federation!r}, banks "
                f"{list(self.roster.banks)}, t = {self.roster.threshold}, policy "
                f"{self.roster.policy_sha256[:12]}…); a new key needs a fresh state directory"
            )

    def _load_or_create_share(self) -> tuple[HeldShare, np.ndarray]:
        sealed_path, share_path = self.state_dir / SEALED_FILE, self.state_dir / AUTHORITY_SHARE_FILE
        if sealed_path.exists():
            held = held_share.unseal_held_share(sealed_path.read_bytes(), self._operator_secret, self.rings)
            if held.party != threshold.AUTHORITY or held.roster.digest() != self.roster.digest():
                raise CryptoError(f"{sealed_path}: not this federation's key authority share")
            raw = share_path.read_bytes() if share_path.exists() else b""
            if _share_digest(raw) != self.ledger.get_meta(AUTHORITY_SHARE_SHA256):
                raise CryptoError(f"{share_path}: missing, or not the public share of the sealed key share (altered)")
            self.log.info("key_share.unsealed")
            return held, ceremony_messages.parse_residues(raw, self.rings.key.shape, str(share_path))
        key_share = threshold.generate_key_share(self.rings, threshold.AUTHORITY, self._crp)
        held = HeldShare(threshold.AUTHORITY, self.roster, key_share.secret, b"")
        raw = ceremony_messages.residue_bytes(key_share.public)
        write_atomically(share_path, raw)
        self.ledger.set_meta(AUTHORITY_SHARE_SHA256, _share_digest(raw))
        write_atomically(sealed_path, held_share.seal_held_share(held, self._operator_secret), PRIVATE_FILE_MODE)
        self.log.info("key_share.created", he=self.policy.he.model_dump(), banks=len(self.roster.banks))
        return held, key_share.public

    # --- the key ceremony (relayed here; ceremony_messages.py, share_envelopes.py) ---------------------

    @property
    def ceremony_complete(self) -> bool:
        return bool(self._held.public_context)

    @property
    def public_context(self) -> bytes:
        """The federation's collective public context; :class:`ProtocolConflict` ``not-ready`` before the ceremony."""
        if not self.ceremony_complete:
            missing = sorted(set(self.roster.banks) - {a.bank for a in self.announcements()})
            raise ProtocolConflict("not-ready", f"the key ceremony waits for the public shares of {missing}")
        return self._held.public_context

    def _hold(self, held: HeldShare) -> None:
        """Keep ``held``, and what every decryption reads of it: the context's fingerprint (None while the ceremony
        is pending) and ``s_0``'s data-level residues."""
        self._held = held
        self.fingerprint = ckks.fingerprint(held.public_context) if held.public_context else None
        self._data_secret = np.ascontiguousarray(held.secret[: len(self.rings.data.moduli)])

    def _signing_keys(self) -> dict[str, Ed25519PublicKey]:
        return {name: load_public_key(raw) for name, raw in self.ledger.banks().items()}

    def accept_announcement(self, caller: str, announcement: Announcement) -> None:
        """Keep a bank's signed public share for the ceremony (``caller``: the bank's authenticated name). The same
        announcement again is a no-op; another one for a bank that has announced is refused (a key share is for
        the federation's lifetime)."""
        with self._lock:
            if announcement.bank != caller:
                raise ProtocolConflict("not-your-share", f"{caller!r} cannot announce for {announcement.bank!r}")
            try:
                ceremony_messages.verify_announcement(self.rings, self.roster, announcement, self._signing_keys())
            except CryptoError as error:  # a well-formed message the ceremony refuses: a conflict, not a bad body
                self._record({"event": "announce", "decision": "refused", "bank": caller, "reason": str(error)})
                raise ProtocolConflict("bad-announcement", str(error)) from None
            path = self.state_dir / CEREMONY_DIR / f"announcement-{announcement.party}.json"
            if path.exists():
                if Announcement.from_json(path.read_bytes()) != announcement:
                    raise ProtocolConflict(
                        "already-announced", f"{caller!r} already announced another key share for this federation"
                    )
                return
            write_atomically(path, announcement.to_json().encode("utf-8"))
            self._record({"event": "announce", "decision": "allowed", "bank": caller})
            self._complete_ceremony()

    def announcements(self) -> list[Announcement]:
        """The banks' announcements received so far, by party."""
        directory = self.state_dir / CEREMONY_DIR
        return [Announcement.from_json(path.read_bytes()) for path in sorted(directory.glob("announcement-*.json"))]

    def accept_envelopes(self, caller: str, envelopes: Sequence[ShareEnvelope]) -> None:
        """Keep the Shamir shares a bank dealt, sealed to their recipients (relayed; unreadable here). Every envelope
        is checked before any is written: a refused batch changes nothing."""
        if caller not in self.roster.banks:
            raise ProtocolConflict("not-in-roster", f"{caller!r} is not a bank of federation {self.federation!r}")
        dealer = self.roster.party(caller)
        with self._lock:
            directory = self.state_dir / CEREMONY_DIR
            for envelope in envelopes:
                if envelope.dealer != dealer or envelope.roster_sha256 != self.roster.digest():
                    problem = ("not-your-share", f"{caller!r} sent a share envelope it did not deal")
                elif not 1 <= envelope.recipient <= len(self.roster.banks) or envelope.recipient == dealer:
                    problem = ("bad-envelope", f"{caller!r}: no other bank {envelope.recipient} to deal to")
                else:
                    path = directory / f"envelope-{dealer}-{envelope.recipient}.json"
                    if not path.exists() or ShareEnvelope.from_json(path.read_bytes()) == envelope:
                        continue
                    problem = ("already-dealt", f"{caller!r} already dealt another share to bank {envelope.recipient}")
                self._record({"event": "deal", "decision": "refused", "bank": caller, "reason": problem[1]})
                raise ProtocolConflict(*problem)
            for envelope in envelopes:
                path = directory / f"envelope-{dealer}-{envelope.recipient}.json"
                write_atomically(path, envelope.to_json().encode("utf-8"))
            self._record({"event": "deal", "decision": "allowed", "bank": caller, "envelopes": len(envelopes)})

    def envelopes_for(self, caller: str) -> list[ShareEnvelope]:
        """The envelopes dealt to bank ``caller`` so far."""
        recipient = self.roster.party(caller)
        directory = self.state_dir / CEREMONY_DIR
        return [
            ShareEnvelope.from_json(path.read_bytes())
            for path in sorted(directory.glob(f"envelope-*-{recipient}.json"))
        ]

    def _complete_ceremony(self) -> None:
        """Once every bank has announced: the collective public context, written and sealed with ``s_0``."""
        if self.ceremony_complete:
            return
        announcements = self.announcements()
        if len(announcements) < len(self.roster.banks):
            return
        shares = ceremony_messages.verify_announcements(self.rings, self.roster, announcements, self._signing_keys())
        context = key_ceremony.collective_context(self.rings, self.roster, self._crp, self.authority_share, shares)
        held = HeldShare(threshold.AUTHORITY, self.roster, self._held.secret, context)
        write_atomically(self.state_dir / PUBLIC_FILE, context)
        write_atomically(
            self.state_dir / SEALED_FILE, held_share.seal_held_share(held, self._operator_secret), PRIVATE_FILE_MODE
        )
        self._hold(held)
        self._record({"event": "ceremony-complete", "decision": "allowed", "fingerprint": self.fingerprint})
        self.log.info("ceremony.complete", fingerprint=self.fingerprint[:12])

    def close(self) -> None:
        self._flooding.close()
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
            elif federation != self.federation:
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

    def check_decryption(
        self,
        caller_role: str,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt | dict | str | bytes],
        fingerprint: str,
        length: int,
    ) -> None:
        """Every rule of :meth:`decrypt_sum` that needs no ``c1``, so that the service refuses a request before it
        reads the body (a refusal is audited like :meth:`decrypt_sum`'s); :meth:`decrypt_sum` checks them again."""
        with self._lock:
            try:
                self._admit(caller_role, federation, round_number, kind, receipts, fingerprint, length)
            except DecryptionRefused as refusal:
                event = self._event(caller_role, federation, round_number, kind)
                self._record({**event, "decision": "refused", "reason": refusal.reason, "detail": refusal.detail})
                self.log.warning("decrypt.refused", reason=refusal.reason, detail=refusal.detail, round=round_number)
                raise

    @staticmethod
    def _event(caller_role: str, federation: str, round_number: int, kind: str) -> dict:
        return {
            "event": "decrypt",
            "caller": caller_role,
            "federation": federation,
            "round": round_number,
            "kind": kind,
        }

    def _admit(
        self,
        caller_role: str,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt | dict | str | bytes],
        fingerprint: str,
        length: int,
    ) -> tuple[OpenRound, list[Receipt], int]:
        """The request's rules before any ``c1`` (caller, round, kind, receipts, once per (round, kind), size):
        (the open round, the checked receipts, the slot values) or :class:`DecryptionRefused`. Under the lock."""
        open_round = self._check_request(caller_role, federation, round_number, kind, fingerprint)
        expected = {
            "federation": open_round.federation,
            "round": open_round.round,
            "nonce": open_round.nonce,
            "kind": kind,
            "context_fingerprint": self.fingerprint,
        }
        checked = check_receipts(
            receipts, self._signing_keys(), expected, self.policy_digest, self._quorum(), open_round.participants
        )
        if self.ledger.was_decrypted(federation, round_number, kind):
            raise DecryptionRefused(
                Refusal.ALREADY_DECRYPTED.value, f"{kind!r} of round {round_number} was already decrypted"
            )
        slots = expected_slots(self.policy, kind, checked)
        if length != slots:
            raise DecryptionRefused(
                Refusal.WRONG_SHAPE.value,
                f"the request announces {length} slot values; the receipted uploads hold {slots}",
            )
        return open_round, checked, slots

    def decrypt_sum(
        self,
        caller_role: str,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt | dict | str | bytes],
        fingerprint: str,
        length: int,
        upload_c1: Sequence[np.ndarray],
    ) -> np.ndarray:
        """The key authority's partial decryption of the sum of ``length`` slot values of the receipted uploads, if
        every rule holds; otherwise :class:`DecryptionRefused`. ``upload_c1`` holds, for each receipt in order, the
        ``c1`` polynomials of that bank's upload (chunks, data primes, N). Returns ``c1_sum·s_0 + E`` (+ encoded central
        noise), shape (chunks, data primes, N), uint64, NTT form."""
        log = self.log.bind(caller=caller_role, federation=federation, round=round_number, kind=kind)
        event = self._event(caller_role, federation, round_number, kind)
        with self._lock:
            try:
                open_round, checked, slots = self._admit(
                    caller_role, federation, round_number, kind, receipts, fingerprint, length
                )
                senders = tuple(sorted(receipt.sender for receipt in checked))
                total = summed_c1(self.level, checked, upload_c1, ckks.chunk_count(slots, self.level.degree // 2))
                digests = chunk_digests(total)
                self._check_fresh(federation, digests)
                noise = self._central_noise(kind, length)  # drawn before the decryption is consumed
                flooding = self._flooding.take(len(total))
                view = partial_residues(self.rings, total, self._data_secret, self.flooding_std, flooding)
                if noise is not None:
                    view = self._add_noise(kind, view, noise)
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

    def _check_fresh(self, federation: str, digests: Sequence[str]) -> None:
        """Refuse a summed ciphertext already decrypted in this federation, and a request beyond the decryption
        budget the flooding was sized for."""
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
                f"{spent} ciphertexts decrypted under this share; {len(digests)} more exceed he.max_decryptions = "
                f"{budget}, the query budget the noise flooding holds for (a fresh key is needed)",
            )

    def _add_noise(self, kind: str, view: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """``view + Encode(n)`` chunk by chunk at the kind's scale: decryption is linear, so the fused result is the
        noised sum."""
        layout = self.policy.upload_layout(kind)  # None: a central channel travels unpacked
        scale = 2.0 ** (layout.scale_bits if layout is not None else self.policy.he.global_scale_bits)
        slots = self.level.degree // 2
        noised = view.copy()
        for index in range(len(view)):
            part = noise[index * slots : (index + 1) * slots]
            encoded = seal_residues.encode(self.rings.context, self.level, part, scale)
            noised[index] = residues.add_mod(view[index], encoded, self.level)
        return noised

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
        if federation != self.federation:
            raise DecryptionRefused(
                Refusal.FOREIGN_FEDERATION.value, f"this key authority serves federation {self.federation!r} only"
            )
        if kind not in self.policy.allowed_kinds:
            raise DecryptionRefused(Refusal.KIND_NOT_ALLOWED.value, f"the policy does not let {kind!r} leave a bank")
        if not self.ceremony_complete:
            raise DecryptionRefused(Refusal.FOREIGN_CONTEXT.value, "the key ceremony has not completed")
        if fingerprint != self.fingerprint:
            raise DecryptionRefused(
                Refusal.FOREIGN_CONTEXT.value,
                f"context {str(fingerprint)[:12]}… is not this federation's {self.fingerprint[:12]}…",
            )
        current = self.ledger.current_round(federation)
        if current is None:
            raise DecryptionRefused(Refusal.NO_OPEN_ROUND.value, f"federation {federation!r} has no open round")
        if round_number != current.round:
            raise DecryptionRefused(
                Refusal.STALE_ROUND.value, f"round {round_number} is not the open round {current.round}"
            )
        return current


def _share_digest(raw: bytes) -> str:
    """SHA-256 (hex) of a public share's bytes, kept in the ledger so an altered share file is noticed."""
    return hashlib.sha256(raw).hexdigest()
