"""Declared set-up phases (``consortium/phases.py``): a phase a new method or a new unit of privacy declares is run by
the aggregator and by a bank at its points — after the union index and before training round 1, before enrolment —
with no branch for it in ``consortium/``. In-process: the toy phases below are this module's own classes, named in
their declarations as ``"module:Class"`` like any plug-in's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_aggregator import BANKS, Federation, _coordinator, wait_open

from fedgl_secure import method_registry
from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.bank_worker import BankWorker
from fedgl_secure.consortium.phases import AggregatorPhase, BankPhase, declared_phases
from fedgl_secure.consortium.pseudonyms import pseudonymise
from fedgl_secure.crypto import ckks
from fedgl_secure.data.graph import induced_subgraph
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.sampling import make_clients
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError, ProtocolConflict
from fedgl_secure.method_registry import MethodSpec, SetupPhase
from fedgl_secure.methods.fedavg import FedAvg
from fedgl_secure.policy.schema import Policy, Timeouts
from fedgl_secure.privacy import unit_phases

TOY_METHOD = "toy-phased"


class ToyFedAvg(FedAvg):
    """FedAvg under a name of its own: the toy method whose spec declares :data:`METHOD_PHASE`."""

    name = TOY_METHOD


class ToyAggregatorPhase(AggregatorPhase):
    """Records what the coordinator had when it ran the phase, and says so in the status."""

    def __init__(self, parts) -> None:
        super().__init__(parts)
        self.seen: list[tuple[bool, int, bool]] = []

    def before_training(self, stop: threading.Event) -> bool:
        # (the union index exists, the last round number in the store, a round is open)
        self.seen.append(
            (self.parts.enrolment.index is not None, self.parts.store.last_round_number(), self.parts.stages.open)
        )
        return True

    def status(self) -> dict[str, object]:
        return {"toy": len(self.seen)}


class ToyBankPhase(BankPhase):
    """Enrols half of the bank's graph, and keeps the input the node's wiring gave it."""

    def before_enrolment(self, graph, stop):
        self.received = self.parts.inputs
        return induced_subgraph(graph, np.arange(graph.num_nodes // 2))


METHOD_PHASE = SetupPhase(
    "toy-method-phase",
    "a toy method's set-up",
    aggregator=f"{__name__}:ToyAggregatorPhase",
    bank=f"{__name__}:ToyBankPhase",
)
UNIT_PHASE = SetupPhase(
    "toy-unit-phase",
    "a toy unit's set-up",
    aggregator=f"{__name__}:ToyAggregatorPhase",
    bank=f"{__name__}:ToyBankPhase",
)


@pytest.fixture
def toy_declarations(monkeypatch):
    """The toy method registered with :data:`METHOD_PHASE`, and every policy's units declaring :data:`UNIT_PHASE`."""
    spec = MethodSpec(TOY_METHOD, "FedAvg with a toy set-up phase", f"{__name__}:ToyFedAvg", phases=(METHOD_PHASE,))
    monkeypatch.setattr(method_registry, "BUILT_IN", (*method_registry.BUILT_IN, spec))
    monkeypatch.setattr(unit_phases, "setup_phases", lambda policy: (UNIT_PHASE,))


def test_a_declared_phase_runs_at_the_aggregator_after_the_index_and_before_round_1(
    toy_declarations, tmp_path, small_he
):
    policy = Policy(he=small_he, quorum=3, timeouts=Timeouts(round_seconds=30, upload_seconds=20))
    federation = Federation(tmp_path / "federation", policy, {bank: Ed25519PrivateKey.generate() for bank in BANKS})
    store = AggregatorStore(tmp_path / "aggregator.sqlite3")
    stop = threading.Event()
    try:
        coordinator = _coordinator(federation, store, max_rounds=1, method=TOY_METHOD)
        assert list(coordinator.phases) == ["toy-method-phase", "toy-unit-phase"]  # the method's, then the unit's
        assert coordinator.status()["toy"] == 0
        for offset, bank in enumerate(BANKS):
            coordinator.enrol(bank, 5, 3, pseudonymise(b"k" * 32, range(offset * 10, offset * 10 + 40)))
        threading.Thread(target=coordinator.run, args=(stop,), daemon=True).start()
        view = wait_open(coordinator)
        assert view.round == 1 and view.stage == "round"
        for phase in coordinator.phases.values():  # each ran once, with the index built and no round opened yet
            assert phase.seen == [(True, 0, None)]
        assert coordinator.status()["toy"] == 1
    finally:
        stop.set()
        store.close()
        federation.close()


class EnrolmentPort:
    """The aggregator as far as enrolment: records what a bank enrols, then stops it (no union index follows)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.enrolled: list[int] = []

    def enrol(self, num_features, num_classes, pseudonyms):
        self.enrolled.append(len(pseudonyms))
        self.stop.set()

    def index(self):
        raise ProtocolConflict("not-ready", "the union index is not built yet")


@pytest.mark.parametrize(("method", "declared"), [(TOY_METHOD, "toy-method-phase"), ("federated", "toy-unit-phase")])
def test_a_declared_phase_runs_at_a_bank_before_it_enrols_and_gets_its_input(
    toy_declarations, small_context, small_he, method, declared
):
    config = build_config({"dataset": "synthetic", "method": method, "federation": {"proportions": [0.5, 0.5]}})
    policy = Policy(he=small_he)
    names = [phase.name for phase in declared_phases(config, policy)]
    assert names == ([METHOD_PHASE.name] if method == TOY_METHOD else []) + [UNIT_PHASE.name]
    client = make_clients(load_dataset("synthetic", None, seed=0), [0.5, 0.5], 0, 0.0)[0]
    stop = threading.Event()
    port = EnrolmentPort(stop)
    options = dict(
        name="bank-a",
        federation="fed",
        client_index=0,
        config=config,
        graph=client,
        aggregator=port,
        public_context=ckks.public_context_bytes(small_context),
        policy=policy,
        signing_key=Ed25519PrivateKey.generate(),
        pseudonym_key=b"k" * 32,
        broadcast_key=Ed25519PrivateKey.generate().public_key(),
        poll_seconds=0.01,
    )
    worker = BankWorker(**options, phase_inputs={declared: "from the node's files"})
    worker.run(stop)
    # every declared phase ran in turn before enrolment (each halves the graph), and only its own input reached it
    assert port.enrolled == [client.num_nodes // 2 ** len(names)]
    assert [phase.received for phase in worker.phases] == [
        "from the node's files" if name == declared else None for name in names
    ]
    with pytest.raises(ConfigError, match=r"inputs for set-up phases \['no-such-phase'\]"):
        BankWorker(**options, phase_inputs={"no-such-phase": 1})
