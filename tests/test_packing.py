"""Quantised, packed CKKS (crypto/packing.py): the stated error bound holds at the largest allowed number of
banks through real encryption, the ring pad and decryption; one bank more is refused; out-of-range values are
refused; a payload filling every slot bit decodes exactly; the policy validates the layout with every other HE
field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto import ckks, packing, residue_sum, seal_residues, tenseal_chunks
from fedgl_secure.crypto.partial_decryption import fused_values
from fedgl_secure.crypto.residues import data_level, sub_mod
from fedgl_secure.crypto.secure_summation import QuantisedSummation, SecureSummation
from fedgl_secure.crypto.upload import RoundTicket, make_upload
from fedgl_secure.errors import CiphertextError, PackingOverflow, PolicyError
from fedgl_secure.policy import packing_layout
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.schema import Policy, policy_from_dict

KINDS = ("weights", "predictions", "embeddings", "node_weight")


@pytest.fixture(scope="module")
def default_keys():
    """A key pair under the default (packed) parameters: the secret context and the public one."""
    secret = ckks.create_secret_context(HEParameters())
    return secret, ckks.load_public_context(ckks.public_context_bytes(secret))


def masked_decryption(public, summed, length, layout, banks, secret):
    """The aggregator's fusion with every decryptor's share of one key: ``c0 + (c1·s + E)`` where ``E`` carries the
    flooding of the key authority's and t banks' partial decryptions together (``fused_flooding_std``) — the noise a
    threshold decryption adds, from one test-only secret context."""
    level = data_level(secret)
    partial = []
    for polys in summed.polys:
        ciphertext = seal_residues.ciphertext_from(secret, level, polys, summed.scale)
        flooded = seal_residues.decrypt_flooded(secret, ciphertext, level, HEParameters().fused_flooding_std())
        partial.append(sub_mod(flooded, polys[0], level))
    return fused_values(public, summed, [np.stack(partial)], length, layout, banks)


def summed_uploads(public, uploads, layout, length):
    """The aggregator's sum of the uploads' chunks, each read and checked (``residue_sum``)."""
    slots = packing.slot_length(layout, length)
    read = [residue_sum.read_upload(public, chunks, slots, f"upload {i}") for i, chunks in enumerate(uploads)]
    return residue_sum.add(public, read)


def random_terms(layout: packing.KindLayout, banks: int, length: int, seed: int) -> np.ndarray:
    """``banks`` terms uniform over the whole accepted range, both ends included."""
    rng = np.random.default_rng(seed)
    terms = rng.uniform(layout.lower, layout.upper, (banks, length))
    terms[0, :2] = layout.lower, layout.upper
    return terms


@pytest.mark.parametrize("kind", KINDS)
def test_sums_at_max_banks_decode_within_the_stated_bound_through_ckks(default_keys, kind):
    secret, public = default_keys
    layout = HEParameters().layout(kind)
    banks = layout.max_banks
    length = 4 * layout.per_slot * ckks.slot_count(public) + 5  # two registers a slot: three chunks, one partial
    terms = random_terms(layout, banks, length, seed=KINDS.index(kind))
    uploads = [ckks.encrypt_vector(public, packing.encode(t, layout), layout.scale_bits) for t in terms]
    summed = summed_uploads(public, uploads, layout, length)

    decoded = masked_decryption(public, summed, length, layout, banks, secret)
    error = np.abs(decoded - terms.sum(axis=0))
    assert error.max() <= layout.error_bound
    # the quantisation error is real (not a vacuous bound) and exactly the plaintext model's
    assert error.max() > layout.error_bound / 10
    exact = packing.decode_sum(
        packing.pack(sum(packing.quantise(t, layout) for t in terms), layout), layout, length, banks
    )
    np.testing.assert_array_equal(decoded, exact)


def test_one_bank_more_than_the_headroom_is_refused(default_keys):
    secret, public = default_keys
    layout = HEParameters().layout("weights")
    banks = layout.max_banks + 1
    terms = np.full((banks, 10), layout.upper)  # the worst case: every digit at its top
    uploads = [ckks.encrypt_vector(public, packing.encode(t, layout), layout.scale_bits) for t in terms]
    summed = summed_uploads(public, uploads, layout, 10)
    with pytest.raises(PackingOverflow, match="max_banks = 7"):
        masked_decryption(public, summed, 10, layout, banks, secret)
    # and a bank refuses to encrypt into a round with more participants than the headroom
    ticket = RoundTicket("fed", 1, "00" * 16, tuple(f"bank-{i}" for i in range(banks)), "f" * 64, Policy().digest)
    with pytest.raises(PackingOverflow, match="exceed he.max_banks"):
        make_upload(public, HEParameters(), ticket, "bank-0", Ed25519PrivateKey.generate(), "weights", terms[0])


def test_a_payload_filling_every_slot_bit_decodes_exactly_at_both_ends(default_keys):
    """The register budget T = log2 Q − 2 − g (the pad needs no slot bits; a complex slot's two registers reach
    √5 · 2^(T−1) with the real part centred): one 24-bit digit per register at N = 4096, [36, 36, 37], 7 banks
    (46 guard bits hold the encryption noise and the flooding of the key authority's and t banks' partial
    decryptions, ``fused_flooding_std``);
    sums of all-lowest and all-highest values (P = 0 and P close to 2^T, in the real and the imaginary parts of
    every slot) come back exact."""
    secret, public = default_keys
    he = HEParameters()
    flooding = he.fused_flooding_std()  # what a fused decryption carries, as the policy's layouts are sized for
    available = packing.slot_bits(he.poly_modulus_degree, 72, he.max_banks, flooding)
    assert available == 72 - 2 - packing.guard_bits(he.poly_modulus_degree, he.max_banks, flooding) == 24
    top = ((1 << available) - 1) // he.max_banks  # L: 7·L < 2^24, so the digit is all 24 bits
    layout = packing.kind_layout(
        "wide", 0.0, float(top), 0, poly_modulus_degree=4096, data_bits=72, max_banks=he.max_banks, flooding=flooding
    )
    assert (layout.per_slot, layout.digit_bits, layout.payload_bits) == (1, 24, 24)
    length = 2 * ckks.slot_count(public) + 100  # two registers a slot: two chunks, the last one partial
    for value in (0.0, float(top)):
        terms = np.full((he.max_banks, length), value)
        uploads = [ckks.encrypt_vector(public, packing.encode(t, layout), layout.scale_bits) for t in terms]
        summed = summed_uploads(public, uploads, layout, length)
        assert len(summed.sizes) == 2
        decoded = masked_decryption(public, summed, length, layout, he.max_banks, secret)
        np.testing.assert_array_equal(decoded, terms.sum(axis=0))
    with pytest.raises(ValueError, match="a slot offers 24"):
        packing.kind_layout(
            "wider", 0.0, float(2 * top), 0, poly_modulus_degree=4096, data_bits=72, max_banks=7, flooding=flooding
        )


def test_mask_bits_is_retired_with_a_reason():
    with pytest.raises(PolicyError, match="he.mask_bits") as raised:
        policy_from_dict({"he": {"mask_bits": 0}})
    assert "retired" in str(raised.value) and "threshold decryption" in str(raised.value)


def test_values_outside_the_packed_range_are_refused_not_clipped():
    layout = HEParameters().layout("predictions")
    with pytest.raises(CiphertextError, match=r"he.precision.predictions"):
        packing.quantise(np.array([0.5, -0.01]), layout)
    with pytest.raises(CiphertextError, match="NaN"):
        packing.quantise(np.array([np.nan]), layout)


def test_decrypted_slots_that_are_not_packed_sums_are_refused():
    layout = HEParameters().layout("weights")
    with pytest.raises(PackingOverflow, match="not packed sums"):
        packing.unpack(np.array([3.5]), layout, 1, 2)
    with pytest.raises(PackingOverflow, match="not packed sums"):
        packing.unpack(np.array([2.0**layout.payload_bits]), layout, 1, 2)


def test_the_noise_model_covers_measured_fresh_encryption_error(default_keys):
    """The guard bits rest on NOISE_STD_PER_DEGREE; re-measure the per-slot error of fresh encryptions."""
    secret, public = default_keys
    degree = HEParameters().poly_modulus_degree
    values = np.random.default_rng(3).integers(0, 2**30, ckks.slot_count(public)).astype(np.float64)
    errors = [
        ckks.decrypt_vector(secret, ckks.encrypt_vector(public, values, 16), values.size) - values for _ in range(4)
    ]
    measured_std = float(np.std(np.concatenate(errors)) * 2**16)
    assert measured_std <= packing_layout.NOISE_STD_PER_DEGREE * degree
    assert float(np.abs(np.concatenate(errors)).max()) * 2**16 <= packing.noise_bound(degree, 1)  # tails too
    assert measured_std >= packing_layout.NOISE_STD_PER_DEGREE * degree / 4  # the model is not wildly loose either


def test_the_noise_model_covers_both_parts_of_complex_slots(default_keys):
    """Packed kinds use the imaginary parts too: their fresh-encryption error obeys the same model."""
    secret, public = default_keys
    degree = HEParameters().poly_modulus_degree
    level = data_level(secret)
    rng = np.random.default_rng(4)
    errors = []
    for _ in range(4):
        values = rng.integers(0, 2**30, ckks.slot_count(public)) + 1j * rng.integers(0, 2**30, ckks.slot_count(public))
        [chunk] = ckks.encrypt_vector(public, values, 16)
        ciphertext, _ = tenseal_chunks.tenseal_ciphertext(public, chunk, "test")
        residues = seal_residues.decrypt(secret, ciphertext, level)
        errors.append((seal_residues.decode(public, level, residues, 2.0**16, complex_slots=True) - values) * 2**16)
    error = np.concatenate(errors)
    for part in (error.real, error.imag):
        assert float(np.std(part)) <= packing_layout.NOISE_STD_PER_DEGREE * degree
        assert float(np.std(part)) >= packing_layout.NOISE_STD_PER_DEGREE * degree / 4
        assert float(np.abs(part).max()) <= packing.noise_bound(degree, 1)


def test_default_policy_packs_every_kind_and_dp_noised_kinds_travel_unpacked():
    policy = Policy()
    assert policy.he.packing == "quantised"
    layouts = {kind: policy.upload_layout(kind) for kind in KINDS}
    # two registers a slot, at least two values each, except GraphFL's 21-bit meta-gradients (one)
    assert all(
        layout is not None and layout.per_slot >= (1 if kind == "meta_gradients" else 2)
        for kind, layout in layouts.items()
    )
    central = policy_from_dict(
        {
            "quorum": 3,
            "dp": {"weights": {"clip": 1.0, "noise_multiplier": 1.0, "noise": "central"}},
            "budget": {"epsilon": 10.0, "rounds": 2},
            "allowed_kinds": ["weights"],
        }
    )
    assert central.upload_layout("weights") is None
    assert central.upload_layout("node_weight") is not None  # no DP channel of its own: packed


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        (
            {"he": {"precision": {"weights": {"lower": -8, "upper": 8, "step_bits": 40}}}},
            "he.precision.weights",
            "bits",
        ),
        ({"he": {"precision": {"node_weight": {"lower": 1, "upper": 0, "step_bits": 4}}}}, "upper", "must exceed"),
        ({"quorum": 8}, "he.max_banks", "below the quorum"),
        ({"he": {"poly_modulus_degree": 1024}}, "he.coeff_mod_bit_sizes", "128-bit security"),
    ],
)
def test_inconsistent_packing_is_refused_naming_the_field(values, field, message):
    with pytest.raises(PolicyError, match=field) as raised:
        policy_from_dict(values)
    assert message in str(raised.value)


def test_unpacked_mode_is_still_available():
    policy = policy_from_dict(
        {"he": {"packing": "none", "poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 60, 60]}}
    )
    assert policy.upload_layout("weights") is None


@pytest.mark.parametrize("workers", [1, 3])
def test_secure_summation_equals_the_quantised_plaintext_summation(workers):
    policy = Policy()
    rng = np.random.default_rng(workers)
    contributions = {
        k: {
            "weights": torch.from_numpy(rng.uniform(-1, 1, 3000)).float(),
            "predictions": torch.from_numpy(rng.uniform(0, 1, (500, 3))).float(),
            "node_weight": torch.from_numpy(rng.uniform(0, 1, 500)).float(),
        }
        for k in range(3)
    }
    summation = SecureSummation(policy, encrypt_workers=workers)
    try:
        secure = summation(1, contributions)
    finally:
        summation.close()
    plain = QuantisedSummation(policy)(1, contributions)
    for kind, tensor in plain.items():
        torch.testing.assert_close(secure[kind], tensor, rtol=0, atol=0)
    exact = sum(c["weights"].double() for c in contributions.values())
    assert float((secure["weights"].double() - exact).abs().max()) <= policy.he.layout("weights").error_bound
    # the accounting, not the clock: serially the busiest bank's seconds are a part of the encryption phase's sum;
    # on the pool each bank's seconds come from its workers' reports, measured while this process may wait or not
    # (comparing them with the phase's wall time, as this test did with a factor of 3, read the clock under load)
    if workers == 1:
        assert 0 < summation.seconds.encrypt_slowest_bank <= summation.seconds.encrypt
    else:
        assert summation.seconds.encrypt_slowest_bank > 0
