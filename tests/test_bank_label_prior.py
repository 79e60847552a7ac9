"""A bank's side of the consortium label prior (``consortium/bank_label_prior.py``) where it must stop, in-process
against a scripted aggregator; the whole protocol over real processes is ``test_consortium_label_dp.py``."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.consortium.aggregator_port import RoundResponse, Served
from fedgl_secure.consortium.bank_label_prior import LabelPriorParticipant
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.broadcast_signature import sign_broadcast
from fedgl_secure.errors import ConfigError, ServiceError
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.log import get_logger
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy.consortium_prior import LABEL_PRIOR_STAGE, prior_size
from fedgl_secure.privacy.label_release import StagedRelease
from fedgl_secure.wire.broadcast import stage_label
from fedgl_secure.wire.encodings import encode_arrays

NODES, FEATURES, CLASSES = 30, 5, 3


class ScriptedAggregator:
    """Answers ``current_round`` with the given views in turn and keeps what is uploaded."""

    def __init__(self, views: list[RoundResponse]) -> None:
        self.views = iter(views)
        self.uploads: list[tuple[int, str]] = []

    def current_round(self) -> RoundResponse:
        return next(self.views)

    def upload(self, round_number, kind, chunks, receipt):
        self.uploads.append((round_number, kind))


def participant(he, aggregator, tmp_path) -> LabelPriorParticipant:
    policy = policy_from_dict(
        {
            "protection": "he",
            "he": he,
            "dp": {
                "unit": "label",
                "labels": {
                    "mechanism": "rr-with-prior",
                    "epsilon": 2.0,
                    "stages": 2,
                    "stage_order": "validation-first",
                    "prior": "consortium-sgc",
                },
            },
            "budget": {"epsilon": 2.0, "rounds": 5},
        }
    )
    context = ckks.create_secret_context(policy.he)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, NODES)
    train, val = np.arange(NODES) < 10, (np.arange(NODES) >= 10) & (np.arange(NODES) < 20)
    adjacency = sp.random(NODES, NODES, density=0.1, random_state=0, format="csr")
    return LabelPriorParticipant(
        name="bank-a",
        federation="f",
        aggregator=aggregator,
        context=context,
        fingerprint=ckks.fingerprint(ckks.public_context_bytes(context)),
        policy=policy,
        signing_key=Ed25519PrivateKey.generate(),
        broadcast_key=AGGREGATOR_KEY.public_key(),
        normaliser=float(NODES),
        release=StagedRelease(labels, train, val, CLASSES, 2.0, 2, "validation-first", 0.5),
        release_path=tmp_path / "staged.npz",
        settings={},
        adjacency=adjacency + adjacency.T,
        features=rng.random((NODES, FEATURES)),
        num_classes=CLASSES,
        log=get_logger(node="bank-a", role="bank"),
        poll_seconds=0.0,
    )


AGGREGATOR_KEY = Ed25519PrivateKey.generate()  # signs what the scripted aggregator serves


def served(round_number: int, body: bytes) -> Served:
    """``body`` as the aggregator serves round ``round_number``'s prior to bank-a: signed."""
    label = stage_label(round_number, LABEL_PRIOR_STAGE)
    return Served(body, sign_broadcast(AGGREGATOR_KEY, "f", "bank-a", label, body))


def prior_round(bank: LabelPriorParticipant) -> RoundResponse:
    return RoundResponse(
        phase="open",
        federation="f",
        round=1,
        nonce="0" * 32,
        base_version=-1,
        participants=["bank-a", "bank-b"],
        shapes={WEIGHTS: [prior_size(FEATURES, CLASSES) + 1]},
        context_fingerprint=bank.fingerprint,
        policy_sha256=bank.policy.digest,
        stage=LABEL_PRIOR_STAGE,
        prior_rounds=[],
    )


def test_a_term_outside_the_packed_range_stops_the_bank_naming_the_setting(small_he, tmp_path):
    # a reopened round would compute the same term: the bank must not retry it for ever
    weights = {"lower": -1e-3, "upper": 1e-3, "step_bits": 7}
    narrow = {**small_he.model_dump(), "packing": "quantised", "precision": {"weights": weights}}
    aggregator = ScriptedAggregator([])
    bank = participant(narrow, aggregator, tmp_path)
    aggregator.views = iter([prior_round(bank)])
    with pytest.raises(ConfigError, match=r"label-prior round 1 cannot be encrypted.*packing = 'none'"):
        bank.run(threading.Event())
    assert aggregator.uploads == []


def test_a_federation_that_finishes_before_the_release_is_complete_is_an_error(small_he, tmp_path):
    aggregator = ScriptedAggregator([RoundResponse(phase="finished", federation="f", prior_rounds=[])])
    bank = participant(small_he.model_dump(), aggregator, tmp_path)
    with pytest.raises(ConfigError, match="finished after 0 of the label prior.s 20 rounds, before"):
        bank.run(threading.Event())


def test_a_prior_that_cannot_be_downloaded_is_retried_not_fatal(small_he, tmp_path):
    # all prior rounds are fitted; the first download of the last θ̄ fails (an aggregator restarting), the next works
    published = np.zeros(prior_size(FEATURES, CLASSES), dtype=np.float32)
    done = RoundResponse(phase="waiting", federation="f", prior_rounds=list(range(1, 21)))
    aggregator = ScriptedAggregator([done, done])
    attempts = []

    def stage_model(round_number, stage):
        attempts.append((round_number, stage))
        if len(attempts) == 1:
            raise ServiceError(None, "unreachable", "connection refused")
        return served(round_number, encode_arrays({"prior": published}))

    aggregator.stage_model = stage_model
    bank = participant(small_he.model_dump(), aggregator, tmp_path)
    release = bank.run(threading.Event())
    assert attempts == [(20, LABEL_PRIOR_STAGE), (20, LABEL_PRIOR_STAGE)] and bank.release.complete
    assert release.labels.shape == (NODES,)


def test_a_round_whose_start_cannot_be_downloaded_is_taken_part_in_at_the_next_poll(small_he, tmp_path):
    # step 2 starts from the θ̄ of round 1; its first download fails (the aggregator restarting), the retry uploads
    aggregator = ScriptedAggregator([])
    bank = participant(small_he.model_dump(), aggregator, tmp_path)
    step_two = prior_round(bank).model_copy(update={"round": 2, "prior_rounds": [1]})
    finished = RoundResponse(phase="finished", federation="f", prior_rounds=[1, 2])
    aggregator.views = iter([step_two, step_two, finished])
    attempts = []

    def stage_model(round_number, stage):
        attempts.append(round_number)
        if len(attempts) == 1:
            raise ServiceError(None, "unreachable", "server disconnected")
        return served(round_number, encode_arrays({"prior": np.zeros(prior_size(FEATURES, CLASSES), dtype=np.float32)}))

    aggregator.stage_model = stage_model
    with pytest.raises(ConfigError, match="finished after 2 of the label prior's 20 rounds"):
        bank.run(threading.Event())
    assert attempts == [1, 1] and aggregator.uploads == [(2, "weights")]  # one upload, after the retry


def test_a_prior_round_under_another_policy_is_not_taken_part_in(small_he, tmp_path):
    """One policy for all: a round view carrying another policy's digest is skipped (logged with both), nothing
    is encrypted for it."""
    aggregator = ScriptedAggregator([])
    bank = participant(small_he.model_dump(), aggregator, tmp_path)
    foreign = prior_round(bank).model_copy(update={"policy_sha256": "0" * 64})
    bank._take_part(foreign)
    assert (foreign.round, foreign.nonce) in bank._done and not bank._uploads
