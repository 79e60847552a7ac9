"""The one method registry (fedgl_secure/method_registry.py): every name the CLI and the configuration accept,
what each built-in method declares, and a method added from outside the package through the entry-point group —
a new method that touches nothing but its own module and its registration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.method_registry import (
    BUILT_IN,
    ENTRY_POINT_GROUP,
    MethodSpec,
    load,
    method_names,
    method_spec,
    method_specs,
)
from fedgl_secure.methods import build_method
from fedgl_secure.simulation.experiment import run_experiment

# A method written by someone outside the package: plain FedAvg with every bank weighted equally (w_k = 1). It
# uses only the methods' public interface (methods/base.py) and registers through its distribution's entry point.
TOY_MODULE = """
from fedgl_secure.method_registry import MethodSpec
from fedgl_secure.methods.base import WEIGHTS, Broadcast, FederatedMethod, split_weights_sum, weights_term
from fedgl_secure.model.averaging import fedavg


class EqualWeightAverage(FederatedMethod):
    name = "toy-equal-average"

    def __init__(self, config):
        self.config = config

    @property
    def upload_kinds(self):
        return (WEIGHTS,)

    def upload_shapes(self, num_parameters, num_global_nodes, num_classes):
        return {WEIGHTS: (num_parameters + 1,)}

    def client_contribution(self, trainer, broadcast, *, with_node_terms=True):
        trainer.train(self.evaluation_adjacency(trainer.graph, broadcast), broadcast.weights, None, 0.0, 0.0)
        return {WEIGHTS: weights_term(1.0, trainer.model.flat_parameters().cpu())}

    def server_update(self, sums, round_number):
        return Broadcast(round_number, fedavg(*split_weights_sum(sums[WEIGHTS])))

    def evaluation_adjacency(self, graph, broadcast):
        return graph.adjacency(None, 0.0, False)


SPEC = MethodSpec("toy-equal-average", "FedAvg with equal bank weights", "toy_method:EqualWeightAverage")
"""


def install_toy_method(directory: Path, entry_point_value: str = "toy_method:SPEC") -> Path:
    """A distribution on ``directory`` (module + ``.dist-info`` with the entry point), as pip would leave it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "toy_method.py").write_text(textwrap.dedent(TOY_MODULE))
    info = directory / "toy_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy-equal-average = {entry_point_value}\n")
    return directory


@pytest.fixture
def toy_method(tmp_path, monkeypatch):
    install_toy_method(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("toy_method", None)


def test_every_built_in_method_loads_as_its_spec_says():
    for spec in BUILT_IN:
        implementation = load(spec.implementation)
        if spec.baseline:
            assert callable(implementation), spec.name
        else:
            method = build_method(build_config({"method": spec.name}))
            assert method.name == spec.name, spec.name
            assert method.upload_kinds, spec.name
            # the spec's own_model (which the configuration reads) says what the method does
            assert (method.build_model(8, 3) is not None) == spec.own_model, spec.name
        for hook in (spec.prepare_clients, spec.apply_mechanism_policy, spec.mechanism_releases, spec.check_privacy):
            if hook is not None:
                assert callable(load(hook)), (spec.name, hook)


def test_the_ablations_switch_alpha_and_beta_by_their_specs():
    values = {"self_supervision": {"alpha": 0.2, "beta": 0.3}}
    assert build_config({**values, "method": "fedgl"}).effective_alpha_beta() == (0.2, 0.3)
    assert build_config({**values, "method": "fedgl-no-gpg"}).effective_alpha_beta() == (0.2, 0.0)
    assert build_config({**values, "method": "fedgl-no-gpl"}).effective_alpha_beta() == (0.0, 0.3)
    assert build_config({**values, "method": "federated"}).effective_alpha_beta() == (0.0, 0.0)


def test_an_unknown_method_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"method: .*unknown method 'fedsgd'; choose from fedgl, federated"):
        build_config({"method": "fedsgd"})
    with pytest.raises(KeyError, match="unknown method 'fedsgd'"):
        method_spec("fedsgd")


def test_a_spec_refuses_unknown_phases_and_references_that_are_not_module_attribute():
    with pytest.raises(ValueError, match="unknown set-up phases"):
        MethodSpec("x", "x", "a:b", phases=("handshake",))
    with pytest.raises(ValueError, match="implementation 'a.b' is not 'module:attribute'"):
        MethodSpec("x", "x", "a.b")


def test_a_method_installed_through_the_entry_point_runs_in_the_simulation(toy_method):
    assert "toy-equal-average" in method_names()
    config = build_config(
        {"method": "toy-equal-average", "seed": 0, "federation": {"proportions": [0.3, 0.5, 0.7], "max_rounds": 2}}
    )
    assert not method_spec("toy-equal-average").baseline
    assert config.effective_alpha_beta() == (0.0, 0.0)  # declares no self-supervision
    dataset = load_dataset("synthetic", None, seed=0, split=config.data)
    toy_broadcasts, fedavg_broadcasts = [], []
    result = run_experiment(config, dataset, progress=False, observer=toy_broadcasts.append)
    assert result.method == "toy-equal-average" and result.rounds_run == 2
    assert [len(record.participants) for record in result.history] == [3, 3]
    # the same run under FedAvg (w_k = N_k) reaches another W̄ from the same start: the toy's own update ran
    fedavg = config.model_copy(update={"method": "federated"})
    run_experiment(fedavg, dataset, progress=False, observer=fedavg_broadcasts.append)
    assert [b.round_number for b in toy_broadcasts] == [b.round_number for b in fedavg_broadcasts] == [1, 2]
    assert not torch.allclose(toy_broadcasts[0].weights, fedavg_broadcasts[0].weights)


def test_the_cli_offers_an_installed_method(toy_method, tmp_path):
    output = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_method), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "fedgl_secure", "simulate", "--method", "toy-equal-average", "--rounds", "2"]
    completed = subprocess.run(
        [*command, "--set", "federation.proportions=[0.4,0.6]", "--no-progress", "--output", str(output)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(output.read_text())["method"] == "toy-equal-average"


def test_an_entry_point_that_clashes_or_is_not_a_spec_is_refused(tmp_path, monkeypatch):
    not_a_spec = install_toy_method(tmp_path / "not-a-spec", entry_point_value="toy_method:EqualWeightAverage")
    monkeypatch.syspath_prepend(str(not_a_spec))
    try:
        with pytest.raises(TypeError, match="loads type, not a MethodSpec"):
            method_specs()
    finally:
        sys.modules.pop("toy_method", None)
    monkeypatch.undo()
    # a plug-in that takes a built-in name: its entry point is named after the spec it loads, as the registry asks
    clash = tmp_path / "clash"
    clash.mkdir()
    (clash / "clash_method.py").write_text(
        "from fedgl_secure.method_registry import MethodSpec\n"
        'SPEC = MethodSpec("fedgl", "another fedgl", "clash_method:Nothing")\n'
    )
    info = clash / "clash_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfedgl = clash_method:SPEC\n")
    monkeypatch.syspath_prepend(str(clash))
    try:
        with pytest.raises(ValueError, match="method name 'fedgl' is already registered"):
            method_specs()
    finally:
        sys.modules.pop("clash_method", None)
