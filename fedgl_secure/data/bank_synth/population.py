"""Who the synthetic customers are, who banks with whom, and who pays whom (relationships, fraud rings, victims).

Person-level truth (:class:`_Population`: memberships, labels, splits, person-level features and
keys) and the transfers drawn at each bank (:func:`_bank_relationships`), as person indices: the
model in :mod:`fedgl_secure.data.bank_synth`'s docstring, before any bank's table or file exists.
:mod:`.tables` turns these into Arrow tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np
import pyarrow as pa

from fedgl_secure.data.bank_synth.parameters import SynthParameters
from fedgl_secure.data.bank_synth.strings import _hex_keys

SPLIT_SHARES = (0.6, 0.2, 0.2)
# category probabilities (legitimate, fraud), in the order of SEGMENTS / REGIONS
SEGMENT_PROBABILITIES = ((0.80, 0.15, 0.05), (0.90, 0.09, 0.01))
REGION_PROBABILITIES = ((0.20, 0.20, 0.20, 0.20, 0.18, 0.02), (0.17, 0.17, 0.17, 0.17, 0.20, 0.12))

PAIR_SHARE = 0.8  # of a bank's shared customers, the share held by exactly one other bank
BACKGROUND_PER_CUSTOMER = 2.6  # background relationships drawn per customer at each bank
LOCAL_SHARE = 0.5  # of the background relationships, the share seen at the drawing bank only
RING_SIZES = (3, 9)  # fraud ring sizes, [low, high)
RING_OUT_DEGREE = 2  # relationships each fraudster sends inside its ring
VICTIMS_PER_FRAUDSTER = 1.5  # mean legitimate customers paying each fraudster
REPEAT_P = 0.7  # transfers per relationship ~ Geometric(REPEAT_P), mean 1/0.7 ≈ 1.43
WINDOW_START = 1_704_067_200  # 2024-01-01T00:00:00Z
WINDOW_SECONDS = 90 * 86_400
RING_BURST_SECONDS = 14 * 86_400
REPEAT_SPREAD_SECONDS = 7 * 86_400  # a relationship's repeated transfers fall within a week of its first
INCOME_MISSING = 0.02


@dataclass(frozen=True)
class _Population:
    """Person-level truth: who banks where, labels, splits and the features a person has everywhere."""

    members: tuple[np.ndarray, ...]  # per bank: person index of each row (row i is customer number i)
    bank_count: np.ndarray  # banks holding each person
    fraud: np.ndarray  # bool, truth
    labelled: np.ndarray  # bool
    split: np.ndarray  # int8 index into SPLITS, -1 when unlabelled
    keys: pa.StringArray
    age: np.ndarray
    income: np.ndarray  # NaN when unknown
    segment: np.ndarray  # int8 index into SEGMENTS
    region: np.ndarray  # int8 index into REGIONS


def _population(parameters: SynthParameters, rng: np.random.Generator) -> _Population:
    banks, n = parameters.banks, parameters.customers
    k = round(parameters.shared_fraction * n)
    m = int(PAIR_SHARE * k) // (banks - 1)
    g = k - (banks - 1) * m
    pair_a, pair_b = np.triu_indices(banks, 1)
    pair_base = banks * (n - k)
    all_base = pair_base + comb(banks, 2) * m
    persons = all_base + g
    members = []
    for b in range(banks):
        pairs = np.flatnonzero((pair_a == b) | (pair_b == b))
        held = np.concatenate(
            [
                np.arange(b * (n - k), (b + 1) * (n - k)),
                (pair_base + pairs[:, None] * m + np.arange(m)[None, :]).ravel(),
                np.arange(all_base, persons),
            ]
        )
        members.append(rng.permutation(held).astype(np.int32))
    bank_count = np.bincount(np.concatenate(members), minlength=persons).astype(np.int16)

    # Draws are stratified by the group of banks holding a person (and then by label), so every bank
    # gets its share of fraudsters, labels and splits up to rounding, even at a few thousand customers.
    group = np.concatenate(
        [
            np.repeat(np.arange(banks), n - k),
            banks + np.repeat(np.arange(len(pair_a)), m),
            np.full(g, banks + len(pair_a)),
        ]
    )
    fraud = _systematic(group, parameters.fraud_rate, rng) < 1
    by_label = 2 * group + fraud
    labelled = _systematic(by_label, parameters.labelled_fraction, rng) < 1
    position = _systematic(np.where(labelled, by_label, -1), 1.0, rng)
    split = np.searchsorted(np.cumsum(SPLIT_SHARES)[:-1], position, side="right").astype(np.int8)
    split[~labelled] = -1

    salt = rng.integers(0, 2**63, dtype=np.uint64)
    f = fraud
    age = np.clip(np.where(f, rng.normal(36.0, 13.0, persons), rng.normal(46.0, 15.0, persons)), 18, 95)
    income = np.round(np.where(f, rng.lognormal(7.7, 0.75, persons), rng.lognormal(8.0, 0.6, persons)), 2)
    income[rng.random(persons) < INCOME_MISSING] = np.nan
    return _Population(
        members=tuple(members),
        bank_count=bank_count,
        fraud=fraud,
        labelled=labelled,
        split=split,
        keys=_hex_keys(np.arange(persons, dtype=np.uint64), salt),
        age=age.astype(np.int64),
        income=income,
        segment=_categorical(rng, f, SEGMENT_PROBABILITIES),
        region=_categorical(rng, f, REGION_PROBABILITIES),
    )


def _systematic(strata: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Systematic sampling within each stratum, as a position: ``position < 1`` selects a ``fraction``.

    Persons are put in random order inside their stratum; person ``r`` of ``s`` gets
    ``(r + u) / s`` (one uniform ``u`` per stratum), and is selected when
    ``⌊(r + 1) f + u⌋ > ⌊r f + u⌋``. So every stratum gets ``s·f`` selected persons up to one (and
    exactly that in expectation). The position returned is ``(r + u) / s`` for a selected person and
    ``1 + (r + u) / s`` for the others; with ``fraction = 1`` it is a stratified uniform in ``[0, 1)``
    (cut at 0.6 and 0.8 for the train/val/test split).
    """
    count = len(strata)
    order = np.lexsort((rng.random(count), strata))
    sorted_strata = strata[order]
    starts = np.flatnonzero(np.r_[True, sorted_strata[1:] != sorted_strata[:-1]])
    sizes = np.diff(np.r_[starts, count])
    which = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(count) - starts[which]
    u = rng.random(len(starts))[which]
    chosen = np.floor((rank + 1) * fraction + u) > np.floor(rank * fraction + u)
    position = np.empty(count)
    position[order] = np.where(chosen, (rank + u) / sizes[which], 1.0 + (rank + u) / sizes[which])
    return position


def _categorical(rng: np.random.Generator, fraud: np.ndarray, probabilities: tuple[tuple[float, ...], ...]):
    """Category index per person, from the legitimate or the fraud distribution."""
    u = rng.random(len(fraud))
    legit, shifted = (np.cumsum(p)[:-1] for p in probabilities)
    return np.where(fraud, np.searchsorted(shifted, u, side="right"), np.searchsorted(legit, u, side="right")).astype(
        np.int8
    )


@dataclass(frozen=True)
class _Transfers:
    """Transfers between persons (person indices), one row per transfer."""

    source: np.ndarray
    target: np.ndarray
    amount: np.ndarray
    time: np.ndarray

    @staticmethod
    def concatenate(parts: list[_Transfers]) -> _Transfers:
        return _Transfers(
            *(np.concatenate([getattr(p, name) for p in parts]) for name in ("source", "target", "amount", "time"))
        )

    def select(self, mask: np.ndarray) -> _Transfers:
        return _Transfers(self.source[mask], self.target[mask], self.amount[mask], self.time[mask])


def _bank_relationships(population: _Population, bank: int, rng: np.random.Generator) -> tuple[_Transfers, _Transfers]:
    """The transfers drawn at one bank: (person-level ones, seen wherever both persons bank; bank-local ones)."""
    rows = population.members[bank]
    n = len(rows)
    fraud = population.fraud[rows]

    activity = np.cumsum(rng.lognormal(0.0, 0.9, n))
    count = round(BACKGROUND_PER_CUSTOMER * n)
    source = np.searchsorted(activity, rng.random(count) * activity[-1], side="right")
    target = np.searchsorted(activity, rng.random(count) * activity[-1], side="right")
    local = rng.random(count) < LOCAL_SHARE
    latest = WINDOW_SECONDS - REPEAT_SPREAD_SECONDS  # a relationship starts early enough for its repeats
    background = (source, target, rng.lognormal(3.8, 1.1, count), rng.integers(0, latest, count))

    # rings: the bank's fraudsters in groups of 3-8; each member pays RING_OUT_DEGREE others of its ring
    members = rng.permutation(np.flatnonzero(fraud))
    sizes = rng.integers(*RING_SIZES, size=len(members) // RING_SIZES[0] + 1)
    ends = np.cumsum(sizes)
    position = np.arange(len(members))
    ring = np.searchsorted(ends, position, side="right")
    start = ends[ring] - sizes[ring]
    size = np.minimum(ends[ring], len(members)) - start
    sender = np.repeat(np.flatnonzero(size >= 2), RING_OUT_DEGREE)
    offset = rng.integers(1, np.maximum(size[sender], 2))
    receiver = start[sender] + (position[sender] - start[sender] + offset) % size[sender]
    burst = rng.integers(0, latest - RING_BURST_SECONDS, size=len(sizes))[ring[sender]]
    rings = (
        members[sender],
        members[receiver],
        rng.lognormal(6.0, 0.9, len(sender)),
        burst + rng.integers(0, RING_BURST_SECONDS, len(sender)),
    )

    # victims: legitimate customers paying fraudsters (scams, mule deposits)
    victims_per = rng.poisson(VICTIMS_PER_FRAUDSTER, len(members))
    payee = np.repeat(members, victims_per)
    legit = np.flatnonzero(~fraud)
    payer = legit[rng.integers(0, len(legit), len(payee))] if len(legit) else payee
    victims = (payer, payee, rng.lognormal(5.5, 1.0, len(payee)), rng.integers(0, latest, len(payee)))

    def transfers(parts: list[tuple[np.ndarray, ...]]) -> _Transfers:
        source, target, amount, time = (np.concatenate(columns) for columns in zip(*parts, strict=True))
        keep = source != target
        repeats = rng.geometric(REPEAT_P, int(keep.sum()))
        # each transfer of a relationship has its own amount and time, near the relationship's
        amount = np.repeat(amount[keep], repeats) * rng.lognormal(0.0, 0.3, int(repeats.sum()))
        time = np.repeat(time[keep], repeats) + rng.integers(0, REPEAT_SPREAD_SECONDS, int(repeats.sum()))
        return _Transfers(
            rows[np.repeat(source[keep], repeats)],
            rows[np.repeat(target[keep], repeats)],
            np.maximum(0.01, np.round(amount, 2)),
            WINDOW_START + time,
        )

    population_level = [tuple(c[~local] for c in background), rings, victims]
    bank_local = [tuple(c[local] for c in background)]
    return transfers(population_level), transfers(bank_local)
