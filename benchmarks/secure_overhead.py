"""Cost of the secure path: FedGL in plaintext against FedGL with CKKS ``SecureSummation``.

    python benchmarks/secure_overhead.py --dataset cora --output runs/secure_overhead.json

One process, one dataset load, the same seed and the same fixed number of rounds for every run
(early stopping is disabled by ``patience = rounds``). The secure runs use the policy file's HE
parameters (default ``policies/baseline.toml``: N = 4096, moduli [54, 54], quantised values packed
three or four to a register, two registers to a complex slot); their key authority, key generation,
sealing and bank enrolment happen before round 1 and are not round time. Every path is warmed up first (one round each).

Three runs: ``plain`` (plaintext sums), ``secure`` (CKKS, the banks of a round encrypting
concurrently on the encryption pool's worker processes, as separate machines would; the pool starts
in round 1, which is not timed) and ``secure_serial`` (the same, the
banks encrypting one after another: ``encrypt_workers = 1``). The engine streams each bank's terms to the
summation as the bank finishes training (``engine.aggregation.open_round``), so a secure run's banks encrypt, and
its aggregator checks their uploads, while the next bank trains; its summation seconds are the wait after the
last bank (the last encryptions, the decryptions and the fusion).

**Interleaved timing.** On a shared machine the load drifts by more than the effect measured, so
the runs go in lockstep: each runs the unchanged engine (``run_experiment``) in its own
thread, and a baton lets exactly one of them work at a time, handing over at every summation
(plain round 1, secure round 1, serial round 1, plain round 2, ...). A run's *round time* k is its busy time
from the end of summation k-1 to the end of summation k: server update and evaluation of round
k-1, training of round k, summation k — one whole round of work, never the other run's. The first
one also holds the federation's construction, so rounds 2..R are compared.

Reported:

* ``round_ratio`` = secure / plain mean seconds per round over the same rounds (2..R), banks
  encrypting concurrently; ``round_ratio_serial`` the same for the serial run;
* ``round_ratio_paired``: the secure run's own non-summation time as the baseline (what the round
  would cost with the plaintext sum), insensitive to any load difference between the runs;
* ``round_ratio_separate_machines_model``: a model, not a measurement: the concurrent run with its
  encryption phase replaced by the busiest bank's own encryption seconds (one machine per bank); with the
  encryption streamed during training, the phase left is the wait for the last bank's ciphertexts, so the model
  no longer subtracts what the other banks' encryption costs the training they overlap;
* ``secure_phase_seconds_per_round``: each party's own seconds (encryption: the phase's wall time and
  the busiest bank's share; the aggregator's and the key authority's on the aggregator's thread); they
  overlap, so they add up to more than ``secure_summation_seconds_per_round``;
* ``bytes_per_value``: ciphertext bytes banks sent / values they encrypted, over every round;
* ``bytes_per_value_common_params``: round 1's real contribution vectors of every bank encrypted
  (not decrypted, one float per slot) under the common N = 8192, [60, 40, 40, 60], scale 2^40
  context; ``bytes_per_value_unpacked_default_params`` the same under the policy's N and primes;
* global test accuracy at the best validation round of each run and the difference to plaintext
  (quantisation is deterministic and CKKS noise is rounded away, so both secure runs agree).

* ``decryption``: the threshold decryptions' traffic over every round (the key authority's and each decrypting
  bank's download of the receipted uploads' ``c1`` — ``verification_bytes`` — and the partial decryptions they send
  back — ``partial_bytes``), per decrypted value and per round, beside the banks' upload bytes; the key authority's
  and the slowest bank's partial-decryption seconds are the phase ``decrypt`` (on separate machines the decrypting
  banks work at once), every bank's in turn ``decrypt_banks``. Both add up over the kinds, whose decryptions run
  side by side, so they exceed the summation's wait.

Targets (2 CPU cores, issue 27): ``round_ratio <= 1.5``, ``bytes_per_value <= 20``, ``|Δ accuracy| <= 0.01``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import platform
import pstats
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import tenseal as ts
import torch

from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.secure_summation import PhaseTimes, SecureSummation
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.aggregation import PlaintextSummation, Summation, open_round
from fedgl_secure.engine.config import ExperimentConfig, build_config
from fedgl_secure.log import configure_logging
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.schema import Policy, load_policy
from fedgl_secure.simulation.experiment import RunResult, run_experiment

REPO = Path(__file__).resolve().parents[1]
BASELINE_POLICY = REPO / "policies" / "baseline.toml"
COMMON_PARAMETERS = HEParameters(
    poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), global_scale_bits=60, packing="none"
)
TARGETS = {"round_ratio": 1.5, "bytes_per_value": 20.0, "abs_accuracy_difference": 0.01}
PLAIN, SECURE, SERIAL = "plain", "secure", "secure_serial"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--output", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each run (no early stopping), at least 2")
    parser.add_argument("--data-root", type=Path, default=None, help="directory holding <dataset>/raw/ ($FEDGL_DATA)")
    parser.add_argument("--method", default="fedgl", choices=["fedgl", "federated", "fedgl-no-gpg", "fedgl-no-gpl"])
    parser.add_argument("--policy", type=Path, default=BASELINE_POLICY, help="policy of the secure run")
    parser.add_argument("--device", default="cpu", help="device of both runs ('cpu', 'cuda', 'auto')")
    parser.add_argument("--profile", type=Path, default=None, help="also cProfile one secure run; write stats here")
    return parser.parse_args(argv)


class Baton:
    """Lets one of several threads work at a time, in a fixed rotation; a finished thread drops out."""

    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = list(order)
        self.turn = 0
        self.condition = threading.Condition()

    def _holder(self) -> str | None:
        return self.order[self.turn % len(self.order)] if self.order else None

    def wait(self, name: str) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self._holder() == name)

    def hand_over(self, name: str) -> None:
        """``name`` is done for now: the next one in the rotation works, ``name`` waits for its turn."""
        with self.condition:
            self.turn = (self.order.index(name) + 1) % len(self.order)
            self.condition.notify_all()
            self.condition.wait_for(lambda: self._holder() == name)

    def leave(self, name: str) -> None:
        with self.condition:
            if name in self.order:
                position = self.order.index(name)
                self.order.remove(name)
                if self.order:
                    self.turn = position % len(self.order)
            self.condition.notify_all()


class LockstepSummation:
    """Wraps a summation: busy seconds per round (see the module docstring), seconds inside the
    summation per round, and round 1's contributions if asked; hands the baton over after each sum."""

    def __init__(self, inner: Summation, name: str, baton: Baton, keep_first_round: bool = False) -> None:
        self.inner, self.name, self.baton = inner, name, baton
        self.round_seconds: list[float] = []
        self.summation_seconds: list[float] = []
        self.keep_first_round = keep_first_round
        self.first_round: dict[int, dict[str, torch.Tensor]] | None = None
        self.phases_after_first: PhaseTimes | None = None  # a secure summation's phase seconds after round 1
        self.resumed = time.perf_counter()

    def start(self) -> None:
        self.baton.wait(self.name)
        self.resumed = time.perf_counter()

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ):
        with self.open_round(round_number, sorted(contributions), reference) as round_sum:
            for client_id in sorted(contributions):
                round_sum.add(client_id, contributions[client_id])
            return round_sum.result()

    def open_round(self, round_number: int, participants, reference: torch.Tensor | None = None) -> LockstepRound:
        """The inner summation's round (streamed when it streams: a secure run's banks encrypt while the next
        bank trains, inside this run's turn), timed and handed over at its end."""
        return LockstepRound(self, open_round(self.inner, round_number, participants, reference))

    def keep(self, client_id: int, contribution: Mapping[str, torch.Tensor]) -> None:
        if self.keep_first_round and not self.round_seconds:
            self.first_round = self.first_round or {}
            self.first_round[client_id] = {kind: t.detach().clone() for kind, t in contribution.items()}

    def finished(self, started: float) -> None:
        """The end of a summation begun at ``started`` (its result's wait: with a streamed round, the part of the
        summation that did not overlap training): record it, and hand the baton over."""
        finished = time.perf_counter()
        self.summation_seconds.append(finished - started)
        self.round_seconds.append(finished - self.resumed)
        if len(self.round_seconds) == 1 and isinstance(getattr(self.inner, "seconds", None), PhaseTimes):
            self.phases_after_first = dataclasses.replace(self.inner.seconds)
        self.baton.hand_over(self.name)
        self.resumed = time.perf_counter()


class LockstepRound:
    """One round of a :class:`LockstepSummation`: the inner round, its result timed."""

    def __init__(self, owner: LockstepSummation, inner) -> None:
        self.owner, self.inner = owner, inner

    def __enter__(self) -> LockstepRound:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.inner.__exit__(*exc_info)

    def add(self, client_id: int, contribution: Mapping[str, torch.Tensor]) -> None:
        self.owner.keep(client_id, contribution)
        self.inner.add(client_id, contribution)

    def result(self) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        sums = self.inner.result()
        self.owner.finished(started)
        return sums


def timed_phases(wrapper: LockstepSummation, rounds_run: int) -> dict[str, float]:
    """Each party's seconds per round over the timed rounds 2..R (round 1 holds one-off starts: the encryption
    pool's workers, which also import the benchmark's own main module, several seconds)."""
    total, first = wrapper.inner.seconds, wrapper.phases_after_first
    names = ("encrypt", "encrypt_slowest_bank", "aggregate", "decrypt", "decrypt_banks")
    return {name: round((getattr(total, name) - getattr(first, name)) / max(1, rounds_run - 1), 4) for name in names}


def experiment_config(args: argparse.Namespace, rounds: int) -> ExperimentConfig:
    return build_config(
        {
            "dataset": args.dataset,
            "method": args.method,
            "seed": args.seed,
            "device": args.device,
            "data_root": str(args.data_root) if args.data_root else None,
            "federation": {"max_rounds": rounds, "patience": max(rounds, 1)},
        }
    )


def new_secure_summation(
    policy: Policy, num_clients: int, encrypt_workers: int | None = None
) -> tuple[SecureSummation, float]:
    """A fresh key authority, enrolled banks and their key ceremony (setup, never counted as round time)."""
    started = time.perf_counter()
    summation = SecureSummation(policy, encrypt_workers=encrypt_workers, banks=num_clients)
    return summation, time.perf_counter() - started


def run_in_lockstep(runs: dict[str, Callable[[], RunResult]], wrappers: dict[str, LockstepSummation]) -> dict:
    """Run every ``runs[name]`` in its own thread, one at a time in turn; re-raise the first failure."""
    results: dict[str, RunResult] = {}
    errors: dict[str, BaseException] = {}

    def work(name: str) -> None:
        try:
            wrappers[name].start()
            results[name] = runs[name]()
        except BaseException as error:  # re-raised in the caller's thread below
            errors[name] = error
        finally:
            wrappers[name].baton.leave(name)

    threads = [threading.Thread(target=work, args=(name,), name=f"bench-{name}") for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"the {name} run failed: {error}") from error
    return results


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def encrypted_size(params: HEParameters, contributions: Mapping[int, Mapping[str, torch.Tensor]]) -> dict:
    """Bytes per value of real contribution vectors encrypted (only) under a public context of ``params``."""
    context = ckks.create_secret_context(params)
    public = ckks.load_public_context(ckks.public_context_bytes(context))
    total_bytes = total_values = 0
    by_kind: dict[str, int] = {}
    for contribution in contributions.values():
        for kind, tensor in contribution.items():
            values = tensor.detach().to(torch.float64).cpu().numpy().reshape(-1)
            size = sum(len(chunk) for chunk in ckks.encrypt_vector(public, values))
            total_bytes += size
            total_values += values.size
            by_kind[kind] = by_kind.get(kind, 0) + size
    return {
        "bytes_per_value": total_bytes / total_values,
        "bytes_per_full_chunk_slot": ckks.bytes_per_value(public),
        "bytes_by_kind_one_round": by_kind,
        "values_one_round": total_values,
    }


class ProfiledSummation:
    """Runs a summation under cProfile, and only the summation (profiling training distorts torch's times)."""

    def __init__(self, inner: Summation, profiler: cProfile.Profile) -> None:
        self.inner, self.profiler = inner, profiler

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ):
        self.profiler.enable()
        try:
            return self.inner(round_number, contributions, reference=reference)
        finally:
            self.profiler.disable()


def profile_secure_run(config: ExperimentConfig, dataset, policy: Policy, path: Path) -> dict:
    """cProfile the secure summation of one run (setup excluded). The banks encrypt on the calling thread
    (``encrypt_workers = 1``) and the aggregator's thread, which fuses each kind, gets a profiler of its
    own (cProfile sees one thread); the two are merged."""
    summation, _ = new_secure_summation(policy, len(config.federation.proportions), encrypt_workers=1)
    profiler, fusing = cProfile.Profile(), cProfile.Profile()
    fuse = summation._fuse

    def profiled_fuse(*args):
        fusing.enable()
        try:
            return fuse(*args)
        finally:
            fusing.disable()

    summation._fuse = profiled_fuse  # type: ignore[method-assign]
    try:
        run_experiment(config, dataset, progress=False, summation=ProfiledSummation(summation, profiler))
    finally:
        summation.close()
    merged = pstats.Stats(profiler, stream=io.StringIO())
    merged.add(fusing)
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.dump_stats(str(path))
    stats = merged.stats  # type: ignore[attr-defined]
    rows = []
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.items():
        where = f"{Path(filename).name}:{line}" if line else "~"
        rows.append(
            {"function": f"{where}({name})", "calls": calls, "own": round(own, 3), "cumulative": round(cumulative, 3)}
        )

    def cumulative_of(pattern: str) -> float:
        """Summed cumulative seconds of the functions whose "file:line(name)" contains each "*"-separated part."""
        parts = pattern.split("*")
        return round(sum(row["cumulative"] for row in rows if all(part in row["function"] for part in parts)), 3)

    rounds = config.federation.max_rounds
    rows.sort(key=lambda row: row["own"], reverse=True)
    parts = {
        "secure summation (all; waits for the aggregator's thread)": "secure_summation.py:*(__call__)",
        "make_upload (bank: checks, encrypt, sign)": "(make_upload)",
        "  encrypt_term (checks, quantise + pack)": "(encrypt_term)",
        "    packing.encode": "packing.py*(encode)",
        "  encrypt_vector (encode + encrypt + serialise)": "(encrypt_vector)",
        "    SEAL encode + public-key encrypt (complex slots)": "(encrypt_complex)",
        "    SEAL save + TenSEAL wrapping": "(tenseal_chunk)",
        "  sign_receipt (Ed25519)": "(sign_receipt)",
        "ciphertext_digest (sha256; bank and aggregator)": "(ciphertext_digest)",
        "_fuse (aggregator's thread: check, add, partial decryptions, fuse, decode)": "(_fuse)",
        "  check_upload (aggregator: Ed25519 + sha256)": "(check_upload)",
        "  read_checked (aggregator: each upload read once, c1 digest)": "(read_checked)",
        "  residue_sum.add (aggregator: residues added modulo each prime)": "residue_sum.py*(add)",
        "  decrypt_sum (key authority: rules, partial decryption, ledger, audit)": "(decrypt_sum)",
        "  partial (each decrypting bank: rules, partial decryption, ledger)": "partial_decryption.py*(partial)",
        "    partial_residues (c1·share + flooding)": "(partial_residues)",
        "    audit log records": "key_authority.py:*(_record)",
        "    ledger (SQLite)": "ledger.py*(record_decryption)",
        "  fused_values (aggregator: c0 + partials, decode)": "(fused_values)",
        "open_round (key authority)": "(open_round)",
    }
    return {
        "file": str(path),
        "rounds": rounds,
        "seconds_per_round": {label: round(cumulative_of(fragment) / rounds, 4) for label, fragment in parts.items()},
        "top_own_time": rows[:15],
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    configure_logging("warning")
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (round 1 carries the federation's construction)")
    policy = load_policy(args.policy)
    config = experiment_config(args, args.rounds)
    dataset = load_dataset(args.dataset, config.data_root, seed=args.seed)
    num_clients = len(config.federation.proportions)
    load_before = os.getloadavg()

    # warm-up of every path (lazy imports, allocator and thread-pool start-up, TenSEAL's first calls)
    warmup = experiment_config(args, 1)
    run_experiment(warmup, dataset, progress=False)
    for workers in (None, 1):
        warm_summation, _ = new_secure_summation(policy, num_clients, workers)
        try:
            run_experiment(warmup, dataset, progress=False, summation=warm_summation)
        finally:
            warm_summation.close()

    secure_summation, setup_seconds = new_secure_summation(policy, num_clients)
    serial_summation, _ = new_secure_summation(policy, num_clients, encrypt_workers=1)
    baton = Baton((PLAIN, SECURE, SERIAL))
    wrappers = {
        PLAIN: LockstepSummation(PlaintextSummation(), PLAIN, baton),
        SECURE: LockstepSummation(secure_summation, SECURE, baton, keep_first_round=True),
        SERIAL: LockstepSummation(serial_summation, SERIAL, baton),
    }
    started = time.perf_counter()
    try:
        results = run_in_lockstep(
            {name: lambda name=name: run_experiment(config, dataset, False, wrappers[name]) for name in wrappers},
            wrappers,
        )
    finally:
        secure_summation.close()
        serial_summation.close()
    lockstep_seconds = time.perf_counter() - started

    plain, secure, serial = wrappers[PLAIN], wrappers[SECURE], wrappers[SERIAL]
    plain_result, secure_result, serial_result = results[PLAIN], results[SECURE], results[SERIAL]
    plain_round, secure_round = mean(plain.round_seconds[1:]), mean(secure.round_seconds[1:])
    serial_round = mean(serial.round_seconds[1:])
    plain_sum, secure_sum = mean(plain.summation_seconds[1:]), mean(secure.summation_seconds[1:])
    per_round_ratios = sorted(s / p for s, p in zip(secure.round_seconds[1:], plain.round_seconds[1:], strict=True))
    rounds_run = secure_result.rounds_run
    wire = secure_summation.wire
    common = encrypted_size(COMMON_PARAMETERS, secure.first_round)
    unpacked_same_vectors = encrypted_size(policy.he.model_copy(update={"packing": "none"}), secure.first_round)
    accuracy_difference = abs(secure_result.global_test_accuracy - plain_result.global_test_accuracy)
    serial_accuracy_difference = abs(serial_result.global_test_accuracy - plain_result.global_test_accuracy)
    phases, serial_phases = timed_phases(secure, rounds_run), timed_phases(serial, serial_result.rounds_run)
    separate_machines = secure_round - phases["encrypt"] + phases["encrypt_slowest_bank"]

    result = {
        "dataset": args.dataset,
        "method": args.method,
        "seed": args.seed,
        "rounds": args.rounds,
        "rounds_run": {PLAIN: plain_result.rounds_run, SECURE: rounds_run, SERIAL: serial_result.rounds_run},
        "rounds_timed": f"2..{rounds_run} (interleaved round by round)",
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": args.device,
        "policy": str(args.policy),
        "he": policy.he.model_dump(mode="json"),
        "plain_round_seconds": round(plain_round, 4),
        "secure_round_seconds": round(secure_round, 4),
        "secure_serial_round_seconds": round(serial_round, 4),
        "round_ratio": round(secure_round / plain_round, 4),
        "round_ratio_serial": round(serial_round / plain_round, 4),
        "round_ratio_separate_machines_model": round(separate_machines / plain_round, 4),
        "encrypt_workers": secure_summation.encrypt_workers,
        "round_ratio_median_of_rounds": round(per_round_ratios[len(per_round_ratios) // 2], 4),
        "round_ratio_paired": round(secure_round / (secure_round - secure_sum + plain_sum), 4),
        "plain_summation_seconds_per_round": round(plain_sum, 4),
        "secure_summation_seconds_per_round": round(secure_sum, 4),
        "secure_phase_seconds_per_round": phases,  # rounds 2..R, as the round times
        "secure_first_round_seconds": round(secure.round_seconds[0], 4),
        "secure_serial_phase_seconds_per_round": serial_phases,
        "secure_setup_seconds": round(setup_seconds, 3),
        "plain_round_seconds_each": [round(s, 3) for s in plain.round_seconds],
        "secure_round_seconds_each": [round(s, 3) for s in secure.round_seconds],
        "secure_serial_round_seconds_each": [round(s, 3) for s in serial.round_seconds],
        "lockstep_wall_seconds": round(lockstep_seconds, 1),
        "bytes_per_value": round(wire.bytes_per_value(), 3),
        "decryption": {
            "threshold": policy.he.threshold,
            "decryptors_per_sum": policy.he.threshold + 1,
            "verification_bytes": secure_summation.decryption.verification,
            "partial_bytes": secure_summation.decryption.partials,
            "decrypted_values": secure_summation.decryption.values,
            "bytes_per_decrypted_value": round(secure_summation.decryption.bytes_per_value(), 3),
            "bytes_per_round": round(
                (secure_summation.decryption.verification + secure_summation.decryption.partials) / rounds_run
            ),
            "upload_bytes_per_round": round(sum(wire.bytes_by_kind.values()) / rounds_run),
        },
        "wire_bytes_by_kind": dict(wire.bytes_by_kind),
        "wire_values_by_kind": dict(wire.values_by_kind),
        "bytes_per_value_common_params": round(common["bytes_per_value"], 3),
        "bytes_per_value_unpacked_default_params": round(unpacked_same_vectors["bytes_per_value"], 3),
        "packing": {
            kind: {
                "values_per_slot": layout.values_per_slot,
                "values_per_register": layout.per_slot,
                "digit_bits": layout.digit_bits,
                "step": layout.step,
            }
            if (layout := policy.upload_layout(kind)) is not None
            else None
            for kind in policy.allowed_kinds
        },
        "bytes_per_full_chunk_slot": {
            "default": round(unpacked_same_vectors["bytes_per_full_chunk_slot"], 3),
            "common": round(common["bytes_per_full_chunk_slot"], 3),
        },
        "common_params": COMMON_PARAMETERS.model_dump(mode="json"),
        "plain_accuracy": plain_result.global_test_accuracy,
        "secure_accuracy": secure_result.global_test_accuracy,
        "secure_serial_accuracy": serial_result.global_test_accuracy,
        "abs_accuracy_difference": round(accuracy_difference, 6),
        "abs_accuracy_difference_serial": round(serial_accuracy_difference, 6),
        "plain_best_round": plain_result.best_round,
        "secure_best_round": secure_result.best_round,
        "max_abs_val_accuracy_difference": max(
            abs(p.val_accuracy - s.val_accuracy)
            for p, s in zip(plain_result.history, secure_result.history, strict=True)
        ),
        "targets": TARGETS,
        "meets_targets": {
            "round_ratio": secure_round / plain_round <= TARGETS["round_ratio"],
            "bytes_per_value": wire.bytes_per_value() <= TARGETS["bytes_per_value"],
            "abs_accuracy_difference": accuracy_difference <= TARGETS["abs_accuracy_difference"],
        },
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "tenseal_version": ts.__version__,
        "torch_version": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    if args.profile is not None:
        result["profile"] = profile_secure_run(config, dataset, policy, args.profile)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
