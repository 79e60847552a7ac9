"""``benchmarks/layer_walk.py``: a profiled walk of the policy names the calls that climb back up a floor and the
paths that enter a floor twice, on a toy package of two floors whose calls are known."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

TOY_POLICY = """
class Policy:
    pass


class Holder:
    def __init__(self, policy):
        self.policy = policy
"""
LOW = """
def use(policy, callback):
    callback(policy)  # a lower floor calling back up: the climb


def leaf(policy):
    return policy


def unrelated(value):
    return value
"""
HIGH = """
from toypkg import low


def run(policy, holder):
    low.unrelated(1)  # carries no policy: not part of the walk
    low.leaf(policy)
    same_floor(holder)


def same_floor(holder):
    return holder


def with_climb(policy):
    low.use(policy, on_policy)


def on_policy(policy):
    return policy
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    package = tmp_path / "toypkg"
    package.mkdir()
    for name, text in {"__init__": "", "policy": TOY_POLICY, "low": LOW, "high": HIGH}.items():
        (package / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [module for module in sys.modules if module == "toypkg" or module.startswith("toypkg.")]:
        del sys.modules[name]


def _walk(package: Path, run) -> dict:
    layer_walk = load_benchmark("layer_walk")
    from toypkg.policy import Policy

    floors = {"toypkg.high": 2, "toypkg.low": 1, "toypkg.policy": 0}
    walk = layer_walk.Walk(floors, (Policy,), package_dir=package)
    sys.setprofile(walk.profile)
    try:
        run(Policy())
    finally:
        sys.setprofile(None)
    return walk.verdict(["toy"])


def test_a_walk_that_only_goes_down_crosses_each_floor_once(toy):
    from toypkg import high
    from toypkg.policy import Holder

    verdict = _walk(toy, lambda policy: high.run(policy, Holder(policy)))
    assert verdict["climbs"] == []
    assert verdict["distinct_steps"] == {"stay": 1, "down": 1, "climb": 0}
    # the holder's __init__ (called from the test, outside the package) carries the policy too: a root of its own
    assert verdict["floor_paths"] == ["toypkg.high", "toypkg.high → toypkg.low", "toypkg.policy"]
    assert verdict["each_floor_crossed_at_most_once_per_direction"] is True


def test_a_callback_up_a_floor_is_named_as_a_climb(toy):
    from toypkg import high

    verdict = _walk(toy, high.with_climb)
    assert verdict["climbs"] == ["toypkg.low:use → toypkg.high:on_policy"]
    assert verdict["paths_that_climb_or_reenter"] == ["toypkg.high → toypkg.low → toypkg.high"]
    assert verdict["each_floor_crossed_at_most_once_per_direction"] is False


def test_the_floors_come_from_the_import_contract():
    floors = load_benchmark("layer_walk").contract_floors()
    assert floors["fedgl_secure.cli"] > floors["fedgl_secure.simulation"] > floors["fedgl_secure.engine"]
    assert floors["fedgl_secure.engine"] > floors["fedgl_secure.privacy"] > floors["fedgl_secure.policy"]
    assert floors["fedgl_secure.model"] == floors["fedgl_secure.policy"]
