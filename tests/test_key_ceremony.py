"""crypto/key_ceremony.py (with ceremony_messages.py, share_envelopes.py, held_share.py): the threshold-CKKS key
ceremony's messages, over a relay that sees every message.

One federation (the key authority and banks "bank-a", "bank-b", "bank-c", t = 2, the small N = 4096
parameters) runs the whole ceremony once per module, every message passing through JSON as a relay would
carry it: every party computes the same public context, TenSEAL encrypts under it, and the key authority with
any 2 or all 3 banks decrypts a sum from the shares they keep. Then: the kept shares seal and unseal, every
malformed, forged, misrouted or missing message is refused naming its problem, a relay cannot substitute its
own announcement for a bank's, and no message carries a secret.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import re
from dataclasses import dataclass

import numpy as np
import pytest
import tenseal as ts
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedgl_secure.crypto import ceremony_messages, ckks, held_share, share_envelopes, threshold
from fedgl_secure.crypto import key_ceremony as kc
from fedgl_secure.errors import CryptoError, SealError
from fedgl_secure.policy.packing_layout import noise_bound

BANKS = ("bank-a", "bank-b", "bank-c")
THRESHOLD = 2
FEDERATION = "ceremony-federation"
POLICY = "5" * 64  # the digest of the policy every node runs (Policy.digest)
OPERATOR_SECRET = "operator secret of at least 16 bytes"


@dataclass(frozen=True)
class Ceremony:
    rings: threshold.Rings
    roster: ceremony_messages.Roster
    crp: np.ndarray
    signing_keys: dict[str, Ed25519PrivateKey]
    verify_keys: dict[str, Ed25519PublicKey]
    authority: threshold.KeyShare  # the key authority's own key share (it publishes .public)
    bank_secrets: dict[int, np.ndarray]  # TEST ONLY: each bank's s_b, copied before it was dropped
    announcements_json: list[str]  # as the relay carried them
    envelopes_json: list[str]
    held: dict[int, held_share.HeldShare]  # party -> what it keeps (0: key authority)
    secret_left_after_deal: dict[int, bool]  # TEST ONLY: whether a ceremony object still held s_b after dealing
    flooding_std: float
    tolerance: float


def _relay(messages, cls):
    """What the relay does: carry each message as JSON text (it could alter any byte of it)."""
    texts = [message.to_json() for message in messages]
    return texts, [cls.from_json(text.encode("utf-8")) for text in texts]


def _holds(value, secret: np.ndarray) -> bool:
    if isinstance(value, np.ndarray):
        return value.shape == secret.shape and np.array_equal(value, secret)
    if isinstance(value, threshold.KeyShare):
        return _holds(value.secret, secret)
    return False


@pytest.fixture(scope="module")
def rings(small_he) -> threshold.Rings:
    params = threshold.parameters_context(
        small_he.poly_modulus_degree, small_he.coeff_mod_bit_sizes, 2.0**small_he.global_scale_bits
    )
    return threshold.rings_of(params)


@pytest.fixture(scope="module")
def roster() -> ceremony_messages.Roster:
    return ceremony_messages.Roster(FEDERATION, BANKS, THRESHOLD, POLICY)


@pytest.fixture(scope="module")
def keys() -> dict[str, Ed25519PrivateKey]:
    return {bank: Ed25519PrivateKey.generate() for bank in BANKS}


@pytest.fixture(scope="module")
def ceremony(small_he, rings, roster, keys) -> Ceremony:
    crp = threshold.common_random_polynomial(rings, roster.digest())
    verify_keys = {bank: key.public_key() for bank, key in keys.items()}
    authority = threshold.generate_key_share(rings, threshold.AUTHORITY, crp)
    banks = {bank: kc.BankCeremony(rings, roster, bank, keys[bank], crp) for bank in BANKS}
    secrets = {c.party: c._key_share.secret.copy() for c in banks.values()}  # TEST ONLY

    announcements_json, announcements = _relay(
        [c.announcement() for c in banks.values()], ceremony_messages.Announcement
    )
    sent = [envelope for c in banks.values() for envelope in c.deal(announcements, verify_keys)]
    left = {c.party: any(_holds(v, secrets[c.party]) for v in vars(c).values()) for c in banks.values()}
    envelopes_json, envelopes = _relay(sent, share_envelopes.ShareEnvelope)

    # the relay routes each envelope to its recipient; the key authority's p_0 reaches the banks as an array
    held = {
        c.party: c.finish([e for e in envelopes if e.recipient == c.party], authority.public.copy())
        for c in banks.values()
    }
    # the key authority verifies the same announcements and computes the context itself
    public_shares = ceremony_messages.verify_announcements(rings, roster, announcements, verify_keys)
    context = kc.collective_context(rings, roster, crp, authority.public, public_shares)
    held[threshold.AUTHORITY] = held_share.HeldShare(threshold.AUTHORITY, roster, authority.secret.copy(), context)

    flooding = small_he.flooding_std()
    n = len(BANKS)
    tolerance = (
        noise_bound(small_he.poly_modulus_degree, n * (n + 1), flooding, n + 1) / 2.0**small_he.global_scale_bits
    )
    return Ceremony(
        rings,
        roster,
        crp,
        keys,
        verify_keys,
        authority,
        secrets,
        announcements_json,
        envelopes_json,
        held,
        left,
        flooding,
        tolerance,
    )


def _fresh_banks(rings, roster, keys, crp) -> dict[str, kc.BankCeremony]:
    return {bank: kc.BankCeremony(rings, roster, bank, keys[bank], crp) for bank in BANKS}


@pytest.fixture
def dealt(ceremony):
    """A fresh ceremony dealt but not finished: (bank ceremonies, announcements, envelopes)."""
    fed = ceremony
    banks = _fresh_banks(fed.rings, fed.roster, fed.signing_keys, fed.crp)
    announcements = [c.announcement() for c in banks.values()]
    envelopes = [e for c in banks.values() for e in c.deal(announcements, fed.verify_keys)]
    return banks, announcements, envelopes


# --- the whole ceremony -----------------------------------------------------------------------------


def test_every_party_computes_the_same_loadable_public_context(ceremony):
    contexts = {party: held.public_context for party, held in ceremony.held.items()}
    assert set(contexts) == {0, 1, 2, 3}
    assert len(set(contexts.values())) == 1, "parties disagree on the collective public context"
    context = ckks.load_public_context(contexts[0])
    assert not context.has_secret_key()
    # it is the collective key of exactly these shares (threshold.py's own path)
    public_shares = {
        p: ceremony_messages.Announcement.from_json(t) for p, t in enumerate(ceremony.announcements_json, start=1)
    }
    shares = {
        p: np.frombuffer(a.public_share, "<u8").reshape(ceremony.rings.key.shape) for p, a in public_shares.items()
    }
    key = threshold.collective_public_key(
        ceremony.rings, ceremony.crp, {0: ceremony.authority.public, **shares}, len(BANKS)
    )
    assert threshold.public_context(ceremony.rings, key) == contexts[0]
    # the held shares are what the banks' partial decryptions take
    for party in (1, 2, 3):
        share = ceremony.held[party].threshold_share(ceremony.rings)
        assert (share.party, share.threshold, share.banks) == (party, THRESHOLD, len(BANKS))


def test_banks_drop_their_secret_after_dealing(ceremony):
    assert ceremony.secret_left_after_deal == {1: False, 2: False, 3: False}


@pytest.mark.parametrize("chosen", [*itertools.combinations((1, 2, 3), 2), (1, 2, 3)])
def test_the_key_authority_and_any_t_banks_decrypt_under_the_ceremony_key(ceremony, chosen):
    rings, held = ceremony.rings, ceremony.held
    rng = np.random.default_rng(sum(chosen))
    first, second = rng.uniform(-10.0, 10.0, 1000), rng.uniform(-10.0, 10.0, 1000)
    context = ts.context_from(held[2].public_context)
    total = (ts.ckks_vector(context, first) + ts.ckks_vector(context, second)).serialize()
    chunk = threshold.chunk_residues(rings, total)
    partials = [threshold.authority_partial(rings, held[0].key_share(rings), chunk.residues, ceremony.flooding_std)]
    partials += [
        threshold.bank_partial(rings, held[j].threshold_share(rings), chunk.residues, chosen, ceremony.flooding_std)
        for j in chosen
    ]
    plain = threshold.fuse(rings, chunk.residues, partials, THRESHOLD, len(BANKS))
    decoded = threshold.decode(rings, plain, chunk.scale, chunk.size)
    assert np.abs(decoded - (first + second)).max() < ceremony.tolerance < 1e-3


def test_the_key_authority_cannot_use_a_bank_share_and_vice_versa(ceremony):
    rings = ceremony.rings
    with pytest.raises(CryptoError, match="party 1 is a bank"):
        ceremony.held[1].key_share(rings)
    with pytest.raises(CryptoError, match="party 0 is the key authority"):
        ceremony.held[0].threshold_share(rings)


# --- the held share at rest -------------------------------------------------------------------------


def test_a_held_share_seals_and_unseals(ceremony):
    rings = ceremony.rings
    for party in (0, 2):  # the key authority's key-level s_0 and a bank's data-level S_j
        held = ceremony.held[party]
        sealed = held_share.seal_held_share(held, OPERATOR_SECRET)
        assert held.secret.tobytes() not in sealed
        opened = held_share.unseal_held_share(sealed, OPERATOR_SECRET, rings)
        assert opened.party == party and opened.roster == ceremony.roster
        assert opened.secret.dtype == np.uint64 and np.array_equal(opened.secret, held.secret)
        assert opened.public_context == held.public_context

    sealed = held_share.seal_held_share(ceremony.held[1], OPERATOR_SECRET)
    with pytest.raises(SealError, match="wrong operator secret"):
        held_share.unseal_held_share(sealed, "another operator secret, 16+ bytes", rings)
    flipped = bytearray(sealed)
    flipped[len(sealed) // 2] ^= 0x01
    with pytest.raises(SealError, match="altered"):
        held_share.unseal_held_share(bytes(flipped), OPERATOR_SECRET, rings)


def test_an_unsealed_share_must_fit_the_rings(ceremony):
    # a bank's (k, N) share relabelled as the key authority's, which must be (K, N) at the key level
    bank = ceremony.held[1]
    wrong = held_share.HeldShare(0, bank.roster, bank.secret, bank.public_context)
    with pytest.raises(CryptoError, match=r"shape \(2, 4096\), these parameters need \(3, 4096\)"):
        held_share.unseal_held_share(
            held_share.seal_held_share(wrong, OPERATOR_SECRET), OPERATOR_SECRET, ceremony.rings
        )


def test_a_held_share_repr_shows_no_residue(ceremony):
    for held in ceremony.held.values():
        text = repr(held)
        assert text == f"HeldShare(party={held.party}, roster_sha256={ceremony.roster.digest()!r})"
        assert str(int(held.secret[0, 0])) not in text and str(int(held.secret[0, 1])) not in text


# --- refusals, each naming its problem ----------------------------------------------------------------


def _announcements(ceremony) -> list[ceremony_messages.Announcement]:
    return [ceremony_messages.Announcement.from_json(text) for text in ceremony.announcements_json]


def _resign(
    message: ceremony_messages.Announcement, key: Ed25519PrivateKey, **changes
) -> ceremony_messages.Announcement:
    unsigned = dataclasses.replace(message, **changes)
    return dataclasses.replace(unsigned, signature=key.sign(unsigned.signed_bytes()))


def test_announcements_are_verified(ceremony):
    rings, roster, keys, verify_keys = ceremony.rings, ceremony.roster, ceremony.signing_keys, ceremony.verify_keys
    a, b, c = _announcements(ceremony)
    assert set(ceremony_messages.verify_announcements(rings, roster, [c, a, b], verify_keys)) == {1, 2, 3}  # any order

    def refused(messages, match):
        with pytest.raises(CryptoError, match=match):
            ceremony_messages.verify_announcements(rings, roster, messages, verify_keys)

    bad = bytearray(b.signature)
    bad[0] ^= 0x01
    refused([a, dataclasses.replace(b, signature=bytes(bad)), c], "'bank-b'.*bad signature")
    refused([_resign(a, keys["bank-c"]), b, c], "'bank-a'.*bad signature")  # signed by another bank
    refused([a, c], r"no announcement from banks \['bank-b'\]")
    refused([a, b, b, c], "'bank-b' announced more than once")
    refused([a, b, c, _resign(a, keys["bank-a"], bank="bank-z")], "unknown bank 'bank-z'")
    foreign = ceremony_messages.Roster("another-federation", BANKS, THRESHOLD, POLICY).digest()
    refused([a, _resign(b, keys["bank-b"], roster_sha256=foreign), c], "'bank-b' is for another roster")
    refused([a, _resign(b, keys["bank-b"], party=3), c], "'bank-b' claims party 3, but the roster makes it party 2")
    short = b.public_share[:-8]
    refused(
        [a, b, _resign(c, keys["bank-c"], public_share=short)], r"'bank-c'.*public_share: 98296 bytes, expected 98304"
    )
    too_big = np.full(rings.key.shape, 2**64 - 1, dtype="<u8").tobytes()
    refused([_resign(a, keys["bank-a"], public_share=too_big), b, c], "'bank-a'.*not reduced")
    refused([a, b, _resign(c, keys["bank-c"], exchange_key=c.exchange_key[:31])], "'bank-c'.*exchange key of 31 bytes")
    refused(
        [a, _resign(b, keys["bank-b"], exchange_key=a.exchange_key), c], "'bank-b'.*same exchange key as bank 'bank-a'"
    )
    with pytest.raises(CryptoError, match="no verify key registered for bank 'bank-c'"):
        ceremony_messages.verify_announcements(
            rings, roster, [a, b, c], {k: v for k, v in verify_keys.items() if k != "bank-c"}
        )


def test_malformed_json_is_refused_naming_the_field(ceremony):
    text = json.loads(ceremony.announcements_json[0])
    with pytest.raises(CryptoError, match="field 'exchange_key' is not valid base64"):
        ceremony_messages.Announcement.from_json(json.dumps({**text, "exchange_key": "not base64!"}))
    with pytest.raises(CryptoError, match="field 'party' must be a non-negative integer"):
        ceremony_messages.Announcement.from_json(json.dumps({**text, "party": "1"}))
    with pytest.raises(CryptoError, match=r"missing fields \['signature'\]"):
        ceremony_messages.Announcement.from_json(json.dumps({k: v for k, v in text.items() if k != "signature"}))
    with pytest.raises(CryptoError, match="field 'type' is 'announcement', expected 'share-envelope'"):
        share_envelopes.ShareEnvelope.from_json(ceremony.announcements_json[0])
    with pytest.raises(CryptoError, match="not JSON"):
        share_envelopes.ShareEnvelope.from_json(b"\xff{")
    with pytest.raises(CryptoError, match="field 'party' must be a non-negative integer, got 1.5"):
        ceremony_messages.Announcement.from_json(json.dumps({**text, "party": 1.5}))
    # JSON has numbers: 1.0 is the integer the schema (json_schema, the services' OpenAPI) allows
    assert (
        ceremony_messages.Announcement.from_json(json.dumps({**text, "party": float(text["party"])}))
        == _announcements(ceremony)[0]
    )


def test_the_message_schemas_describe_what_parses(ceremony):
    """The OpenAPI schema of a message is as strict as its parser: every field, required, nothing else."""
    schema = ceremony_messages.Announcement.json_schema()
    text = json.loads(ceremony.announcements_json[0])
    assert set(schema["required"]) == set(text) and schema["additionalProperties"] is False
    assert schema["properties"]["type"]["enum"] == ["announcement"]
    pattern = re.compile(schema["properties"]["signature"]["pattern"])
    assert pattern.fullmatch(text["signature"]) and not pattern.fullmatch("abc")  # base64 as b64decode takes it
    envelope = share_envelopes.ShareEnvelope.json_schema()
    assert set(envelope["required"]) == {"type", "roster_sha256", "dealer", "recipient", "nonce", "ciphertext"}


def test_envelopes_are_checked(dealt, ceremony):
    banks, _, envelopes = dealt
    bank_a = banks["bank-a"]  # party 1
    p0 = ceremony.authority.public
    mine = [e for e in envelopes if e.recipient == 1]
    from_b = next(e for e in mine if e.dealer == 2)
    others = [e for e in mine if e is not from_b]

    def refused(messages, match):
        with pytest.raises(CryptoError, match=match):
            bank_a.finish(messages, p0)

    flipped = bytearray(from_b.ciphertext)
    flipped[100] ^= 0x01
    tampered = dataclasses.replace(from_b, ciphertext=bytes(flipped))
    refused([*others, tampered], r"share dealt by bank 'bank-b' \(party 2\) could not be opened \(tampered")
    # re-addressed by the relay: the AAD binds the recipient, so even relabelled it does not open
    to_c = next(e for e in envelopes if e.dealer == 2 and e.recipient == 3)
    refused([*others, to_c], r"addressed to bank 'bank-c' \(party 3\), not to bank 'bank-a' \(party 1\)")
    refused(
        [*others, dataclasses.replace(to_c, recipient=1)], "'bank-b'.*could not be opened.*not sealed for bank 'bank-a'"
    )
    refused(others, r"no envelope for bank 'bank-a' \(party 1\) from bank 'bank-b' \(party 2\)")
    refused([*mine, from_b], "'bank-b' \\(party 2\\) sent bank 'bank-a' \\(party 1\\) more than one envelope")
    refused([*others, dataclasses.replace(from_b, dealer=1)], "foreign dealer bank 'bank-a'")
    foreign = ceremony_messages.Roster("another-federation", BANKS, THRESHOLD, POLICY).digest()
    refused([*others, dataclasses.replace(from_b, roster_sha256=foreign)], "'bank-b'.*for another roster")
    # every refusal left the bank where it was: the right envelopes still finish
    held = bank_a.finish(mine, p0)
    assert held.party == 1 and ckks.load_public_context(held.public_context).has_public_key()


def test_steps_out_of_order_are_refused(ceremony):
    fed = ceremony
    bank = kc.BankCeremony(fed.rings, fed.roster, "bank-b", fed.signing_keys["bank-b"], fed.crp)
    with pytest.raises(CryptoError, match="finish: 'bank-b' cannot finish .* \\(call deal first\\)"):
        bank.finish([], fed.authority.public)
    others = _announcements(fed)
    # the relay hands back an old announcement in this bank's place (validly signed by it)
    with pytest.raises(CryptoError, match="deal: the announcement relayed for 'bank-b' is not the one this bank made"):
        bank.deal([others[0], others[1], others[2]], fed.verify_keys)
    with pytest.raises(CryptoError, match="not in the roster"):
        kc.BankCeremony(fed.rings, fed.roster, "bank-z", fed.signing_keys["bank-b"], fed.crp)


def test_finished_and_dealt_steps_are_not_repeated(dealt, ceremony):
    banks, announcements, envelopes = dealt
    bank_c = banks["bank-c"]
    with pytest.raises(CryptoError, match="deal: 'bank-c' has already dealt"):
        bank_c.deal(announcements, ceremony.verify_keys)
    bank_c.finish([e for e in envelopes if e.recipient == 3], ceremony.authority.public)
    with pytest.raises(CryptoError, match="finish: 'bank-c' cannot finish .* \\(already finished\\)"):
        bank_c.finish([e for e in envelopes if e.recipient == 3], ceremony.authority.public)


def test_rosters_are_checked(roster):
    with pytest.raises(CryptoError, match=r"t = 1: needs 2 <= t"):
        ceremony_messages.Roster(FEDERATION, BANKS, 1, POLICY)
    with pytest.raises(CryptoError, match="t = 4 exceeds the 3 parties"):
        ceremony_messages.Roster(FEDERATION, BANKS, 4, POLICY)
    with pytest.raises(CryptoError, match=r"names banks \['bank-a'\] more than once"):
        ceremony_messages.Roster(FEDERATION, ("bank-a", "bank-b", "bank-a"), 2, POLICY)
    with pytest.raises(CryptoError, match="non-empty federation id"):
        ceremony_messages.Roster("", BANKS, 2, POLICY)
    with pytest.raises(CryptoError, match="non-empty strings"):
        ceremony_messages.Roster(FEDERATION, ("bank-a", ""), 2, POLICY)
    assert roster.party("bank-c") == 3 and roster.bank(1) == "bank-a"
    with pytest.raises(CryptoError, match="'bank-z' is not in the roster"):
        roster.party("bank-z")
    with pytest.raises(CryptoError, match="party 0 is the key authority"):
        roster.bank(0)
    with pytest.raises(CryptoError, match="party 4 is not a bank"):
        roster.bank(4)
    # every field is bound into the digest
    digests = {
        roster.digest(),
        ceremony_messages.Roster(FEDERATION + "x", BANKS, 2, POLICY).digest(),
        ceremony_messages.Roster(FEDERATION, ("bank-b", "bank-a", "bank-c"), 2, POLICY).digest(),
        ceremony_messages.Roster(FEDERATION, BANKS, 3, POLICY).digest(),
        ceremony_messages.Roster(FEDERATION, (*BANKS, "bank-d"), 2, POLICY).digest(),
        ceremony_messages.Roster(FEDERATION, BANKS, 2, "6" * 64).digest(),  # another policy
    }
    assert (
        len(digests) == 6 and ceremony_messages.Roster(FEDERATION, list(BANKS), 2, POLICY).digest() == roster.digest()
    )


def test_the_context_needs_the_federations_polynomial_and_every_share(ceremony):
    rings, roster = ceremony.rings, ceremony.roster
    shares = ceremony_messages.verify_announcements(rings, roster, _announcements(ceremony), ceremony.verify_keys)
    other = threshold.common_random_polynomial(rings, "another-federation")
    with pytest.raises(CryptoError, match="not the roster's \\(federation 'ceremony-federation'"):
        kc.collective_context(rings, roster, other, ceremony.authority.public, shares)
    with pytest.raises(CryptoError, match=r"missing parties \[2\]"):
        kc.collective_context(rings, roster, ceremony.crp, ceremony.authority.public, {1: shares[1], 3: shares[3]})


# --- the relay cannot take a bank's place -------------------------------------------------------------


def test_a_relay_cannot_substitute_its_own_announcement(ceremony):
    fed = ceremony
    rings, roster = fed.rings, fed.roster
    a, b, c = _announcements(fed)
    relay_signing = Ed25519PrivateKey.generate()
    relay_exchange = X25519PrivateKey.generate()
    relay_share = threshold.generate_key_share(rings, 2, fed.crp)
    forged = ceremony_messages.announce(rings, roster, "bank-b", relay_share, relay_exchange, relay_signing)
    assert (forged.bank, forged.party, forged.roster_sha256) == (b.bank, b.party, b.roster_sha256)
    with pytest.raises(CryptoError, match="'bank-b'.*bad signature"):
        ceremony_messages.verify_announcements(rings, roster, [a, forged, c], fed.verify_keys)
    bank_a = kc.BankCeremony(rings, roster, "bank-a", fed.signing_keys["bank-a"], fed.crp)
    bank_c = kc.BankCeremony(rings, roster, "bank-c", fed.signing_keys["bank-c"], fed.crp)
    forged_set = [bank_a.announcement(), forged, bank_c.announcement()]
    for bank in (bank_a, bank_c):
        with pytest.raises(CryptoError, match="'bank-b'.*bad signature"):
            bank.deal(forged_set, fed.verify_keys)
    # what the signature prevents: were the relay's key taken for bank-b's, the other banks would seal
    # bank-b's shares to the relay, which opens them
    fooled = {**fed.verify_keys, "bank-b": relay_signing.public_key()}
    envelopes = [e for bank in (bank_a, bank_c) for e in bank.deal(forged_set, fooled)]
    stolen = share_envelopes.open_envelopes(
        rings, roster, 2, relay_exchange, forged_set, [e for e in envelopes if e.recipient == 2]
    )
    assert set(stolen) == {1, 3}


# --- no secret in any message ----------------------------------------------------------------------


def test_no_message_carries_a_secret(ceremony):
    texts = ceremony.announcements_json + ceremony.envelopes_json
    decoded = [
        base64.b64decode(value)
        for text in texts
        for key, value in json.loads(text).items()
        if key in {"public_share", "exchange_key", "signature", "nonce", "ciphertext"}
    ]
    secrets = [*ceremony.bank_secrets.values(), *(held.secret for held in ceremony.held.values())]
    assert len(secrets) == 7
    for secret in secrets:
        raw = secret.astype("<u8").tobytes()
        assert base64.b64encode(raw).decode() not in "".join(texts)
        for row in secret:  # no row of any secret, nor its first 64 bytes, in any decoded field
            head = row.astype("<u8").tobytes()[:64]
            assert not any(head in field for field in decoded)


def test_envelopes_encrypt_their_shares(ceremony, roster, keys):
    rings, crp = ceremony.rings, ceremony.crp
    shares = {p: threshold.generate_key_share(rings, p, crp) for p in (1, 2, 3)}
    exchange = {p: X25519PrivateKey.generate() for p in (1, 2, 3)}
    announcements = [
        ceremony_messages.announce(rings, roster, BANKS[p - 1], shares[p], exchange[p], keys[BANKS[p - 1]])
        for p in (1, 2, 3)
    ]
    dealt = threshold.deal_shares(rings, shares[1], THRESHOLD, len(BANKS))
    envelopes = share_envelopes.seal_envelopes(rings, roster, 1, exchange[1], announcements, dealt)
    assert sorted((e.dealer, e.recipient) for e in envelopes) == [(1, 2), (1, 3)]  # the own share is not sent
    for envelope in envelopes:
        plain = dealt[envelope.recipient].astype("<u8").tobytes()
        assert len(envelope.ciphertext) == len(plain) + 16 and envelope.ciphertext[: len(plain)] != plain
        assert plain[:64] not in envelope.ciphertext
    # and they open to exactly the dealt shares (bank 3 needs bank 2's envelope too: deal one)
    from_2 = share_envelopes.seal_envelopes(
        rings, roster, 2, exchange[2], announcements, threshold.deal_shares(rings, shares[2], THRESHOLD, len(BANKS))
    )
    opened = share_envelopes.open_envelopes(
        rings, roster, 3, exchange[3], announcements, [e for e in envelopes + from_2 if e.recipient == 3]
    )
    assert np.array_equal(opened[1], dealt[3]) and set(opened) == {1, 2}
    with pytest.raises(CryptoError, match="exchange key given for bank 'bank-c' .* not the one it announced"):
        share_envelopes.open_envelopes(
            rings, roster, 3, exchange[2], announcements, [e for e in envelopes + from_2 if e.recipient == 3]
        )
