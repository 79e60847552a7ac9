"""Threshold decryption of a round's sum (DESIGN §5.3 steps 3–5): what every decryptor checks, what it returns, and
how the aggregator fuses the replies.

No party holds the secret key (``threshold.py``): the key authority holds ``s_0``, bank ``j`` a Shamir share
``S_j`` of ``Σ_b s_b``. A sum ``(c0, c1)`` decrypts as ``c0 + c1·s_0 + Σ_{j∈T} c1·λ_j^T·S_j`` over a decrypting set
``T`` of exactly ``t`` banks, each term a *partial decryption* carrying its own noise flooding.

**Every decryptor recomputes what it decrypts.** A request names receipts and, for each, the ``c1`` polynomials of
that bank's upload (encryption randomness only, bound by digest in the signed receipt). The decryptor checks the
receipts (signed by distinct banks of the federation, bound to one round, nonce, kind, context and policy, at
least the quorum), checks each ``c1`` against its receipt, and multiplies its share by **their sum, which it
computes itself** — so the only ``c1`` it ever applies its share to is that of a sum of ≥ quorum receipted uploads.
What the aggregator adds to ``c0`` only shifts the plaintext it learns; it cannot choose a ``c1`` (a single upload,
a crafted ciphertext) that would reveal one bank's term or a combination of a share. Each decryptor decrypts a
(round, kind) for one sum only, and each summed ``c1`` once, within the policy's query budget
(``he.max_decryptions``) the flooding is sized for (Li–Micciancio, EUROCRYPT 2021).

A bank checks the receipts against the federation's signing keys it holds from provisioning, not against anything
the aggregator or the key authority says; the key authority also checks the round is the one it opened
(``key_authority.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path

import numpy as np
import tenseal as ts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fedgl_secure.crypto import ckks, packing, seal_residues, shamir
from fedgl_secure.crypto.flooding_reserve import FloodingReserve
from fedgl_secure.crypto.held_share import HeldShare
from fedgl_secure.crypto.receipts import Receipt, c1_digest, parse_receipt, verify_receipt
from fedgl_secure.crypto.residue_sum import ChunkedCiphertext
from fedgl_secure.crypto.residues import RingLevel, add_mod, check_residues, constant_residues, data_level, sub_mod
from fedgl_secure.crypto.threshold import Rings, partial_residues
from fedgl_secure.errors import CiphertextError, CryptoError, DecryptionRefused, PolicyError, ReceiptError
from fedgl_secure.log import get_logger
from fedgl_secure.policy.schema import Policy

BANK_LEDGER_FILE = "partial_decryptions.sqlite3"


class Refusal(str, Enum):
    """Stable reason codes of :class:`DecryptionRefused` (also written to the key authority's audit log)."""

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
    WRONG_SHAPE = "wrong-shape"  # more or fewer c1 polynomials or values than the receipted uploads hold
    NOT_A_SUM = "not-a-sum"  # a c1 that is not the one its receipt signed
    REPEATED_CIPHERTEXT = "repeated-ciphertext"  # a summed c1 already decrypted in this federation
    BUDGET_EXHAUSTED = "budget-exhausted"  # beyond the query budget the noise flooding holds for
    POLICY_MISMATCH = "policy-mismatch"  # a receipt signed under another policy than the decryptor's
    BAD_DECRYPTING_SET = "bad-decrypting-set"  # not t distinct banks of the federation, or without this bank
    INCOMPLETE_SUM = "incomplete-sum"  # the sum does not hold exactly the participants its receipts name


def check_receipts(
    receipts: Sequence[Receipt | dict | str | bytes],
    signing_keys: Mapping[str, Ed25519PublicKey],
    expected: Mapping[str, object],
    policy_sha256: str,
    quorum: int,
    participants: Sequence[str] | None = None,
) -> list[Receipt]:
    """The receipts a sum is decrypted for: each parses, is from a bank in ``signing_keys`` and verifies under its
    key, was signed under policy ``policy_sha256``, matches every field of ``expected`` (federation, round, nonce,
    kind, context fingerprint — whichever are given), comes from ``participants`` when given; all from distinct
    banks, at least ``quorum`` of them, and **exactly the participants every receipt names** (so an honest bank's
    upload is in one decryptable sum of its round: no two sums over different sets to difference, R13).
    Otherwise :class:`DecryptionRefused` naming the first problem."""
    checked: list[Receipt] = []
    for position, raw in enumerate(receipts):
        try:
            receipt = raw if isinstance(raw, Receipt) else parse_receipt(raw)
        except ReceiptError as error:
            raise DecryptionRefused(Refusal.BAD_RECEIPT.value, f"receipt {position}: {error}") from None
        if receipt.sender not in signing_keys:
            raise DecryptionRefused(Refusal.UNKNOWN_SENDER.value, f"receipt {position}: {receipt.sender!r}")
        try:
            verify_receipt(signing_keys[receipt.sender], receipt)
        except ReceiptError as error:
            raise DecryptionRefused(Refusal.BAD_RECEIPT.value, f"receipt {position}: {error}") from None
        if receipt.policy_sha256 != policy_sha256:
            raise DecryptionRefused(
                Refusal.POLICY_MISMATCH.value,
                f"receipt {position} from {receipt.sender!r} was signed under policy {receipt.policy_sha256[:12]}…, "
                f"this decryptor runs {policy_sha256[:12]}…",
            )
        wrong = [name for name, value in expected.items() if getattr(receipt, name) != value]
        if wrong:
            raise DecryptionRefused(
                Refusal.RECEIPT_MISMATCH.value,
                f"receipt {position} from {receipt.sender!r} is bound to another {', '.join(wrong)}",
            )
        if participants is not None and receipt.sender not in participants:
            raise DecryptionRefused(
                Refusal.NOT_PARTICIPANT.value, f"{receipt.sender!r} is not a participant of round {receipt.round}"
            )
        if any(receipt.sender == other.sender for other in checked):
            raise DecryptionRefused(Refusal.DUPLICATE_SENDER.value, f"two receipts from {receipt.sender!r}")
        checked.append(receipt)
    if len(checked) < quorum:
        raise DecryptionRefused(Refusal.BELOW_QUORUM.value, f"{len(checked)} valid receipts, the quorum is {quorum}")
    if len({receipt.nonce for receipt in checked}) != 1:
        raise DecryptionRefused(Refusal.RECEIPT_MISMATCH.value, "the receipts are bound to different round nonces")
    check_exact_cover(checked)
    return checked


def check_exact_cover(receipts: Sequence[Receipt]) -> None:
    """Refuse (``incomplete-sum``) unless every receipt names the same participants and the receipts' senders are
    exactly them: a sum over a subset or a superset of the round's banks is not decrypted."""
    named = {receipt.participants for receipt in receipts}
    if len(named) != 1:
        raise DecryptionRefused(
            Refusal.INCOMPLETE_SUM.value, f"the receipts name {len(named)} different participant sets for one sum"
        )
    participants = set(named.pop())
    senders = {receipt.sender for receipt in receipts}
    if senders != participants:
        missing, foreign = sorted(participants - senders), sorted(senders - participants)
        detail = f"the sum holds {len(senders)} uploads, the round's participants are {sorted(participants)}"
        if missing:
            detail += f"; missing: {missing}"
        if foreign:
            detail += f"; not participants: {foreign}"
        raise DecryptionRefused(Refusal.INCOMPLETE_SUM.value, detail)


def expected_slots(policy: Policy, kind: str, receipts: Sequence[Receipt]) -> int:
    """The slot values of the kind's sum: fixed by the number of values the receipts bind (they must agree)."""
    values = {receipt.values for receipt in receipts}
    if len(values) != 1:
        raise DecryptionRefused(
            Refusal.RECEIPT_MISMATCH.value, f"the receipts disagree on the upload's size: {sorted(values)} values"
        )
    return packing.slot_length(policy.upload_layout(kind), values.pop())


def summed_c1(
    level: RingLevel, receipts: Sequence[Receipt], upload_c1: Sequence[np.ndarray], chunks: int
) -> np.ndarray:
    """``Σ c1`` over the receipted uploads, shape (chunks, k, N), once each upload's ``c1`` is the one its receipt
    signed (by digest) and of ``chunks`` ciphertexts."""
    if len(upload_c1) != len(receipts):
        raise DecryptionRefused(
            Refusal.WRONG_SHAPE.value, f"c1 polynomials of {len(upload_c1)} uploads sent for {len(receipts)} receipts"
        )
    total = np.zeros((chunks, *level.shape), dtype=np.uint64)
    for receipt, c1 in zip(receipts, upload_c1, strict=True):
        try:
            residues = check_residues(level, c1, chunks, f"c1 of {receipt.sender!r}")
        except CiphertextError as error:
            raise DecryptionRefused(Refusal.WRONG_SHAPE.value, str(error)) from None
        if c1_digest(residues) != receipt.c1_sha256:
            raise DecryptionRefused(
                Refusal.NOT_A_SUM.value, f"the c1 polynomials given for {receipt.sender!r} are not the ones it signed"
            )
        total = add_mod(total, residues, level)
    return total


def chunk_digests(c1_total: np.ndarray) -> list[str]:
    """The SHA-256 of each summed ciphertext's ``c1`` (chunk by chunk): the ledgers' names for ciphertexts."""
    return [c1_digest(c1) for c1 in c1_total]


def fused_values(
    context: ts.Context,
    summed: ChunkedCiphertext,
    partials: Sequence[np.ndarray],
    length: int,
    layout: packing.KindLayout | None,
    contributors: int,
) -> np.ndarray:
    """The aggregator's fusion of one kind: ``c0 + Σ partials`` chunk by chunk, decoded, unpacked to ``length`` values.

    ``summed``: the sum of the uploads (:func:`~fedgl_secure.crypto.residue_sum.add`); ``partials``: the key
    authority's and the decrypting set's partial decryptions, each (chunks, k, N). A packed kind's sum lies around
    the public centre of its range (``layout.centre``), subtracted in the ring before decoding and added back, so
    the decoder only meets centred real parts. A slot beyond the wrap-around bound means a partial made for another
    sum, a missing decryptor, or a sum that wrapped: refused, never decoded to garbage."""
    level = data_level(context)
    slots = packing.slot_length(layout, length)
    per_chunk = ckks.slot_count(context)
    chunks = len(summed.sizes)
    if chunks != ckks.chunk_count(slots, per_chunk):
        raise CiphertextError(f"{chunks} chunks cannot hold {slots} values ({per_chunk} per chunk)")
    replies = [check_residues(level, part, chunks, "a partial decryption") for part in partials]
    offset = layout.centre if layout is not None else 0.0
    complex_slots = layout is not None
    scale = summed.scale
    bound = math.prod(level.moduli) / (2.0 * scale)  # no sum decodes beyond it: it would have wrapped
    values = []
    for index, size in enumerate(summed.sizes):
        expected = min(per_chunk, slots - index * per_chunk)
        if size != expected:
            raise CiphertextError(f"chunk {index}: holds {size} values, expected {expected}")
        plain = summed.c0[index]
        for reply in replies:
            plain = add_mod(plain, reply[index], level)
        if offset:
            plain = sub_mod(plain, constant_residues(round(offset * scale), level), level)
        decoded = seal_residues.decode(context, level, plain, scale, complex_slots)[:size]
        reach = float(max(np.abs(decoded.real).max(), np.abs(decoded.imag).max())) if decoded.size else 0.0
        if not reach < bound:
            raise CiphertextError(
                f"chunk {index}: fused values reach {reach:.3g}, beyond the wrap-around bound {bound:.3g}: a partial "
                "decryption made for another sum, a missing decryptor, or a sum that wrapped"
            )
        values.append(decoded + offset)
    slot_values = np.concatenate(values) if values else np.zeros(0)
    return packing.decode_sum(slot_values, layout, length, contributors)


_BANK_SCHEMA = """
CREATE TABLE IF NOT EXISTS sums (
    federation TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL, sum_sha256 TEXT NOT NULL,
    PRIMARY KEY (federation, round, kind));
CREATE TABLE IF NOT EXISTS partials (
    federation TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL, decrypting_set TEXT NOT NULL,
    chunks INTEGER NOT NULL, PRIMARY KEY (federation, round, kind, decrypting_set));
CREATE TABLE IF NOT EXISTS ciphertexts (
    federation TEXT NOT NULL, c1_sha256 TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL,
    PRIMARY KEY (federation, c1_sha256));
"""


class BankDecryptor:
    """A bank's partial decryptions under its Shamir share, with the rules of the module doc and a durable ledger
    (SQLite in ``state_dir``) so that a restarted bank keeps refusing what it refused before.

    A (round, kind) is decrypted for one sum only; for that sum, a new decrypting set (the aggregator retrying
    without a bank that went down) gets a fresh partial, counted against the query budget like any other, and the
    same decrypting set never twice."""

    def __init__(
        self,
        state_dir: str | Path,
        policy: Policy,
        rings: Rings,
        held: HeldShare,
        signing_keys: Mapping[str, Ed25519PublicKey],
    ) -> None:
        self.policy = policy
        self.rings = rings
        self.held = held
        self.share = held.threshold_share(rings)
        self.roster = held.roster
        if self.roster.policy_sha256 != policy.digest:
            raise PolicyError(
                f"this bank's key share was made under policy {self.roster.policy_sha256[:12]}…, the bank runs "
                f"{policy.digest[:12]}…; the policy is bound into the key (one policy for all)"
            )
        self.bank = self.roster.bank(held.party)
        unknown = sorted(set(self.roster.banks) - set(signing_keys))
        if unknown:
            raise CryptoError(f"no receipt-signing key for banks {unknown} of the federation")
        self.signing_keys = {name: signing_keys[name] for name in self.roster.banks}
        self.fingerprint = ckks.fingerprint(held.public_context)
        self.policy_digest = policy.digest
        self.flooding_std = policy.he.flooding_std()
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self._flooding = FloodingReserve(rings.context, rings.data, self.flooding_std)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(Path(state_dir) / BANK_LEDGER_FILE, check_same_thread=False, isolation_level=None)
        # durable at every commit (FULL), one sync of the write-ahead log per commit instead of a journal's three
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_BANK_SCHEMA)
        self.log = get_logger(role="bank-decryptor", bank=self.bank, federation=self.roster.federation)

    def close(self) -> None:
        self._flooding.close()
        self._db.close()

    def decryption_count(self) -> int:
        """Ciphertexts this share has partially decrypted, over its lifetime."""
        return int(self._db.execute("SELECT COALESCE(SUM(chunks), 0) FROM partials").fetchone()[0])

    def partial(
        self,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt | dict | str | bytes],
        upload_c1: Sequence[np.ndarray],
        decrypting_set: Sequence[str],
    ) -> np.ndarray:
        """This bank's partial decryption ``c1·λ_j^T·S_j + E`` of the sum of the receipted uploads (chunks, k, N), or
        :class:`DecryptionRefused` naming the rule it breaks."""
        federation = self.roster.federation
        log = self.log.bind(round=round_number, kind=kind)
        with self._lock:
            try:
                if kind not in self.policy.allowed_kinds:
                    raise DecryptionRefused(
                        Refusal.KIND_NOT_ALLOWED.value, f"the policy does not let {kind!r} leave a bank"
                    )
                chosen = self._decrypting_set(decrypting_set)
                expected = {
                    "federation": federation,
                    "round": round_number,
                    "kind": kind,
                    "context_fingerprint": self.fingerprint,
                }
                checked = check_receipts(receipts, self.signing_keys, expected, self.policy_digest, self.policy.quorum)
                chunks = ckks.chunk_count(expected_slots(self.policy, kind, checked), self.rings.data.degree // 2)
                total = summed_c1(self.rings.data, checked, upload_c1, chunks)
                digests = chunk_digests(total)
                sum_digest = hashlib.sha256("".join(digests).encode("ascii")).hexdigest()
                label = json.dumps(list(chosen))
                self._check_fresh(federation, round_number, kind, sum_digest, label, digests)
                factors = shamir.lagrange_factors(self.rings.data, chosen)[self.held.party]
                weighted = shamir.scale_rows(self.rings.data, self.share.secret, factors)
                noise = self._flooding.take(len(total))
                reply = partial_residues(self.rings, total, weighted, self.flooding_std, noise)
                self._record(federation, round_number, kind, sum_digest, label, digests)
            except DecryptionRefused as refusal:
                log.warning("partial.refused", reason=refusal.reason, detail=refusal.detail)
                raise
        log.debug("partial.made", senders=len(checked), ciphertexts=len(digests), decrypting_set=list(chosen))
        return reply

    def _decrypting_set(self, names: Sequence[str]) -> tuple[int, ...]:
        try:
            parties = [self.roster.party(name) for name in names]
            chosen = shamir.check_indices(parties, self.share.threshold, self.share.banks)
        except CryptoError as error:
            raise DecryptionRefused(Refusal.BAD_DECRYPTING_SET.value, str(error)) from None
        if len(chosen) != self.share.threshold:
            raise DecryptionRefused(
                Refusal.BAD_DECRYPTING_SET.value,
                f"{len(chosen)} banks in the decrypting set; exactly t = {self.share.threshold} decrypt a sum",
            )
        if self.held.party not in chosen:
            raise DecryptionRefused(
                Refusal.BAD_DECRYPTING_SET.value, f"{self.bank!r} is not in the decrypting set {list(names)}"
            )
        return chosen

    def _check_fresh(
        self, federation: str, round_number: int, kind: str, sum_digest: str, label: str, digests: Sequence[str]
    ) -> None:
        row = self._db.execute(
            "SELECT sum_sha256 FROM sums WHERE federation = ? AND round = ? AND kind = ?",
            (federation, round_number, kind),
        ).fetchone()
        if row is not None and row[0] != sum_digest:
            raise DecryptionRefused(
                Refusal.ALREADY_DECRYPTED.value,
                f"{kind!r} of round {round_number} was decrypted for another sum; a (round, kind) is decrypted once",
            )
        if row is None:
            marks = ",".join("?" * len(digests))
            seen = self._db.execute(
                f"SELECT COUNT(*) FROM ciphertexts WHERE federation = ? AND c1_sha256 IN ({marks})",
                (federation, *digests),
            ).fetchone()[0]
            if seen or len(set(digests)) != len(digests):
                raise DecryptionRefused(
                    Refusal.REPEATED_CIPHERTEXT.value,
                    f"{seen or 'some'} of the summed ciphertexts were already decrypted in federation {federation!r}",
                )
        again = self._db.execute(
            "SELECT 1 FROM partials WHERE federation = ? AND round = ? AND kind = ? AND decrypting_set = ?",
            (federation, round_number, kind, label),
        ).fetchone()
        if again is not None:
            raise DecryptionRefused(
                Refusal.ALREADY_DECRYPTED.value,
                f"{kind!r} of round {round_number} was already decrypted for the decrypting set {label}",
            )
        spent, budget = self.decryption_count(), self.policy.he.max_decryptions
        if spent + len(digests) > budget:
            raise DecryptionRefused(
                Refusal.BUDGET_EXHAUSTED.value,
                f"{spent} ciphertexts decrypted under this share; {len(digests)} more exceed he.max_decryptions = "
                f"{budget}, the query budget the noise flooding holds for (a fresh key is needed)",
            )

    def _record(
        self, federation: str, round_number: int, kind: str, sum_digest: str, label: str, digests: Sequence[str]
    ) -> None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR IGNORE INTO sums VALUES (?, ?, ?, ?)", (federation, round_number, kind, sum_digest)
            )
            self._db.execute(
                "INSERT INTO partials VALUES (?, ?, ?, ?, ?)", (federation, round_number, kind, label, len(digests))
            )
            self._db.executemany(
                "INSERT OR IGNORE INTO ciphertexts VALUES (?, ?, ?, ?)",
                [(federation, digest, round_number, kind) for digest in digests],
            )
