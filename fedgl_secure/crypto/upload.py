"""One bank's encrypted upload of one kind, and the aggregator's check of it (DESIGN §5.3 steps 2-3).

The bank encrypts its pre-weighted term ``w_k · X_k`` under the public context and signs a receipt
over the ciphertext digest; the aggregator verifies the receipt and the digest before it adds
anything. Both halves live here so the in-process simulation and the services share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tenseal as ts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.crypto import ckks, packing, residue_sum, residues, tenseal_chunks
from fedgl_secure.crypto.receipts import (
    Receipt,
    ReceiptFields,
    c1_digest,
    ciphertext_digest,
    sign_receipt,
    verify_receipt,
)
from fedgl_secure.crypto.residue_sum import ChunkedCiphertext
from fedgl_secure.errors import CiphertextError, PackingOverflow, ReceiptError
from fedgl_secure.policy.ckks_params import sum_bound
from fedgl_secure.policy.he import HEParameters

# The round's sum of unpacked terms may use this share of the wrap-around bound; the rest is room for the key
# authority's central DP noise and the encryption and flooding noise.
TERMS_SHARE = 0.5


@dataclass(frozen=True)
class RoundTicket:
    """What a bank must know about the open round to upload into it."""

    federation: str
    round: int
    nonce: str
    participants: tuple[str, ...]  # the banks the round (stage) was opened for: every receipt binds them
    context_fingerprint: str
    policy_sha256: str  # the aggregator's policy (Policy.digest); a bank running another one does not upload

    def __post_init__(self) -> None:  # receipts bind the set, sorted: one canonical form for every signer
        object.__setattr__(self, "participants", tuple(sorted(set(self.participants))))


@dataclass(frozen=True)
class Upload:
    """A bank's ciphertext chunks for one kind, the number of values, and its signed receipt."""

    kind: str
    chunks: list[bytes]
    length: int
    receipt: Receipt

    @property
    def wire_bytes(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


def check_magnitude(values: np.ndarray, participants: int, params: HEParameters, kind: str) -> None:
    """Refuse a term that could make the round's sum wrap around modulo the data primes.

    A bank cannot see the others' terms, so it keeps its own below ``TERMS_SHARE · sum_bound /
    participants``: the sum then uses at most half the range, which leaves the other half for central
    DP noise, so any sum of the round decodes without wrapping (``ckks_params``).
    """
    bound = sum_bound(params.coeff_mod_bit_sizes, params.global_scale_bits) * TERMS_SHARE / max(1, participants)
    largest = float(np.abs(values).max()) if values.size else 0.0
    if largest >= bound:
        raise CiphertextError(
            f"{kind}: |value| up to {largest:.4g} ≥ {bound:.4g}, the per-bank bound for {participants} banks under "
            f"{params.coeff_mod_bit_sizes} bits at scale 2^{params.global_scale_bits}; enlarge the data prime or "
            "lower the scale in the policy"
        )


_FROM_PARAMS = object()  # make_upload's default layout: whatever ``params`` say for the kind


def encrypt_term(
    context: ts.Context, params: HEParameters, layout: packing.KindLayout | None, participants: int, kind: str, flat
) -> list[bytes]:
    """The ciphertext chunks of one pre-weighted term: packed (quantised, at the layout's guard scale) or one
    float per slot (magnitude-checked, at the global scale)."""
    if layout is None:
        check_magnitude(flat, participants, params, kind)
        return ckks.encrypt_vector(context, flat)
    if participants > layout.max_banks:  # the sum could carry across digits: refuse before encrypting
        raise PackingOverflow(
            f"{kind}: {participants} participants exceed he.max_banks = {layout.max_banks}, the headroom of the "
            "packed digits; raise he.max_banks in the policy"
        )
    return ckks.encrypt_vector(context, packing.encode(flat, layout), scale_bits=layout.scale_bits)


def make_upload(
    context: ts.Context,
    params: HEParameters,
    ticket: RoundTicket,
    sender: str,
    signing_key: Ed25519PrivateKey,
    kind: str,
    values: np.ndarray,
    layout: packing.KindLayout | None | object = _FROM_PARAMS,
) -> Upload:
    """Encrypt one pre-weighted term and sign its receipt (the bank side).

    ``layout`` is how the kind is packed (``Policy.upload_layout``: central-noise kinds travel unpacked);
    by default ``params.layout(kind)``."""
    flat = finite_term(kind, values)
    chosen = params.layout(kind) if layout is _FROM_PARAMS else layout
    chunks = encrypt_term(context, params, chosen, len(ticket.participants), kind, flat)  # type: ignore[arg-type]
    return sign_upload(context, ticket, sender, signing_key, kind, chunks, int(flat.size))


def finite_term(kind: str, values: np.ndarray) -> np.ndarray:
    """``values`` as a flat float64 vector; NaN or infinite values are refused before anything is encrypted."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(flat)):
        raise CiphertextError(f"{kind}: refusing to encrypt NaN or infinite values")
    return flat


def sign_upload(
    context: ts.Context,
    ticket: RoundTicket,
    sender: str,
    signing_key: Ed25519PrivateKey,
    kind: str,
    chunks: list[bytes],
    length: int,
    c1_sha256: str | None = None,
) -> Upload:
    """The bank's signed receipt over its ciphertext chunks of one kind, bound to the round (the signing half of
    :func:`make_upload`, for chunks encrypted elsewhere, e.g. on an encryption pool's worker). It binds the number
    of values and the digest of the chunks' ``c1`` polynomials, which decryptors check sums against: read from the
    chunks here, or ``c1_sha256`` as the bank's own encryption worker read it (``EncryptedTerm.c1_sha256``)."""
    fields = ReceiptFields(
        policy_sha256=ticket.policy_sha256,
        values=length,
        c1_sha256=c1_digest(upload_c1(context, chunks)) if c1_sha256 is None else c1_sha256,
        federation=ticket.federation,
        round=ticket.round,
        nonce=ticket.nonce,
        kind=kind,
        sender=sender,
        ciphertext_sha256=ciphertext_digest(chunks),
        context_fingerprint=ticket.context_fingerprint,
        participants=ticket.participants,
    )
    return Upload(kind, chunks, length, sign_receipt(signing_key, fields))


def upload_c1(context: ts.Context, chunks: list[bytes]) -> np.ndarray:
    """The ``c1`` polynomials of an upload's chunks, shape (chunks, data primes, N): what the key authority sees of
    one upload (encryption randomness only) to check that a sum it decrypts is the sum of the receipted uploads."""
    level = residues.data_level(context)
    return np.stack([tenseal_chunks.c1_residues(chunk, level, f"chunk {i}") for i, chunk in enumerate(chunks)])


def check_upload(upload: Upload, public_key: Ed25519PublicKey, ticket: RoundTicket, sender: str) -> None:
    """The aggregator's check before adding: signature, binding to this round, and the digest."""
    receipt = upload.receipt
    verify_receipt(public_key, receipt)
    expected = {
        "federation": ticket.federation,
        "round": ticket.round,
        "nonce": ticket.nonce,
        "kind": upload.kind,
        "sender": sender,
        "context_fingerprint": ticket.context_fingerprint,
        "participants": ticket.participants,
    }
    if receipt.policy_sha256 != ticket.policy_sha256:
        raise ReceiptError(
            f"upload of {upload.kind!r} from {sender!r}: signed under policy {receipt.policy_sha256[:12]}…, this round "
            f"runs policy {ticket.policy_sha256[:12]}…; every node must run the same policy file"
        )
    wrong = [name for name, value in expected.items() if getattr(receipt, name) != value]
    if wrong:
        raise ReceiptError(f"upload of {upload.kind!r} from {sender!r}: receipt bound to another {', '.join(wrong)}")
    if ciphertext_digest(upload.chunks) != receipt.ciphertext_sha256:
        raise ReceiptError(f"upload of {upload.kind!r} from {sender!r}: ciphertext does not match its receipt digest")
    if receipt.values != upload.length:
        raise ReceiptError(
            f"upload of {upload.kind!r} from {sender!r}: {upload.length} values, its receipt says {receipt.values}"
        )


def read_checked(context: ts.Context, upload: Upload, sender: str, slots: int) -> ChunkedCiphertext:
    """The aggregator's reading of an upload whose receipt it checked (:func:`check_upload`): its chunks read as
    ciphertexts of ``context`` holding ``slots`` CKKS values (:func:`residue_sum.read_upload`), and their ``c1`` the
    one the receipt's digest binds — every decryptor checks the sum against it, so a bank whose receipt does not
    match its chunks is refused on its own here instead of the decryptors refusing the whole sum. The result is
    what the aggregator adds; its ``c1`` what the decryptors are sent."""
    ciphertext = residue_sum.read_upload(context, upload.chunks, slots, f"upload of {upload.kind!r} from {sender!r}")
    if c1_digest(ciphertext.c1) != upload.receipt.c1_sha256:
        raise ReceiptError(
            f"upload of {upload.kind!r} from {sender!r}: its ciphertexts' c1 does not match the receipt's c1 digest"
        )
    return ciphertext
