"""A bank's encryption of its own terms in the process where the bank's work runs (a Ray actor of the simulation),
handed to the round as ciphertexts: the terms never leave that process in clear.

What a bank needs to encrypt the terms of one round stage — the public context (bytes: the public key only), the
HE parameters, how each kind is packed, how many banks the sum has (the packed headroom) and the broadcast W̄ its
weights are centred on — is a :class:`BankEncryption`, made by the open round (``SecureRound.bank_encryption``)
and sent with every stage; the bank's process loads the context once (``load_context``). The bank's process
returns :class:`EncryptedTerms` — per kind the ciphertext chunks and the digest of their ``c1`` polynomials, as
an encryption pool's worker returns them (:mod:`fedgl_secure.crypto.encryption_pool`) — and the round signs the
receipts where the banks' signing keys are kept, checks and adds them exactly as it does its own encryptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import torch

from fedgl_secure.crypto import ckks, packing
from fedgl_secure.crypto.centring import bank_term
from fedgl_secure.crypto.encryption_pool import EncryptedTerm, encrypt_with_digest
from fedgl_secure.crypto.upload import finite_term
from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.he import HEParameters


@dataclass(frozen=True)
class EncryptedTerms:
    """One bank's terms of a stage as ciphertexts: per kind the chunks and ``c1`` digest (``terms``) and the shape of
    the tensor it encrypted (``shapes``, so the sum is restored to it)."""

    terms: Mapping[str, EncryptedTerm]
    shapes: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class BankEncryption:
    """How a bank encrypts its terms of one open round stage (module doc); ``layouts`` holds every kind the policy
    lets leave a bank (``None``: one float per slot), ``centre`` the broadcast W̄ as the banks download it."""

    public_context: bytes
    fingerprint: str  # ckks.fingerprint(public_context), as the round computed it once
    he: HEParameters
    layouts: Mapping[str, packing.KindLayout | None]
    participants: int
    centre: np.ndarray | None

    def load_context(self, loaded: dict[str, ts.Context]) -> ts.Context:
        """The public context, loaded once per process: ``loaded`` maps fingerprints to contexts already loaded."""
        if self.fingerprint not in loaded:
            loaded[self.fingerprint] = ckks.load_public_context(self.public_context)
        return loaded[self.fingerprint]

    def encrypt(self, context: ts.Context, contribution: Mapping[str, torch.Tensor]) -> EncryptedTerms:
        """``contribution`` (pre-weighted, normalised terms) encrypted under the public ``context``, kind by kind:
        centred, checked finite and in range, packed as the policy says, the ``c1`` digest read back for the
        receipt. A kind the policy keeps inside banks is refused before anything is encrypted."""
        refused = sorted(set(contribution) - set(self.layouts))
        if refused:
            raise PolicyError(f"policy: kinds {refused} may not leave a bank (allowed: {sorted(self.layouts)})")
        terms = {
            kind: encrypt_with_digest(
                context,
                self.he,
                self.layouts[kind],
                self.participants,
                kind,
                finite_term(kind, bank_term(kind, tensor, self.centre)),
            )
            for kind, tensor in contribution.items()
        }
        return EncryptedTerms(terms, {kind: tuple(tensor.shape) for kind, tensor in contribution.items()})
