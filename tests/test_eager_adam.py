"""EagerAdam is torch.optim.Adam bit for bit, and constructing and stepping it imports no torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from fedgl_secure.model.eager_adam import EagerAdam


def _fit(optimizer_class, steps: int, amsgrad: bool = False, restore_from: dict | None = None):
    """A two-layer model fitted by ``optimizer_class`` with the engine's two parameter groups (decay on the first)."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(7, 5), torch.nn.Linear(5, 3)
    optimizer = optimizer_class(
        [{"params": first.parameters(), "weight_decay": 5e-4}, {"params": second.parameters(), "weight_decay": 0.0}],
        lr=0.01,
        amsgrad=amsgrad,
    )
    if restore_from is not None:
        optimizer.load_state_dict(copy.deepcopy(restore_from))  # torch keeps (and steps) the given tensors
    features, labels = torch.randn(11, 7), torch.randint(0, 3, (11,))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(second(torch.relu(first(features))), labels).backward()
        optimizer.step()
    return [p.detach().clone() for p in (*first.parameters(), *second.parameters())], optimizer.state_dict()


def _assert_same(ours, theirs) -> None:
    (our_parameters, our_state), (their_parameters, their_state) = ours, theirs
    assert all(torch.equal(a, b) for a, b in zip(our_parameters, their_parameters, strict=True))
    assert our_state["param_groups"] == their_state["param_groups"]
    assert our_state["state"].keys() == their_state["state"].keys()
    for index, values in our_state["state"].items():
        assert values.keys() == their_state["state"][index].keys()
        assert all(torch.equal(value, their_state["state"][index][name]) for name, value in values.items())


@pytest.mark.parametrize("amsgrad", [False, True])
def test_the_same_parameters_and_state_as_torch_adam(amsgrad):
    _assert_same(_fit(EagerAdam, 25, amsgrad), _fit(torch.optim.Adam, 25, amsgrad))


def test_a_state_dict_moves_between_the_two_and_the_fit_continues_alike():
    _, state = _fit(torch.optim.Adam, 10)
    _assert_same(_fit(EagerAdam, 10, restore_from=state), _fit(torch.optim.Adam, 10, restore_from=state))


def test_the_step_needs_no_grad_mode_and_leaves_it_as_it_was():
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = EagerAdam([parameter], lr=0.1)
    (parameter * 2).sum().backward()
    optimizer.step()
    assert torch.is_grad_enabled() and parameter.grad_fn is None and not torch.equal(parameter, torch.ones(3))


def test_no_torch_dynamo_is_imported():
    probe = (
        "import sys, torch\n"
        "from fedgl_secure.model.eager_adam import EagerAdam\n"
        "model = torch.nn.Linear(3, 2)\n"
        "optimizer = EagerAdam(model.parameters(), lr=0.01)\n"
        "model(torch.ones(1, 3)).sum().backward()\n"
        "optimizer.step(); optimizer.zero_grad(); optimizer.load_state_dict(optimizer.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
