"""``torch.optim.Adam`` for processes that never compile: the same update without importing ``torch._dynamo``.

torch's optimisers import ``torch._dynamo`` (the compiler's front end: sympy, FX, inductor's helpers) the first time
one is constructed and on every ``step``, only to mark graph breaks and to disable tracing of their own methods —
both no-ops outside ``torch.compile``. Nothing here compiles, and the import cost 3.1 s of CPU in every bank
process (measured: ``import torch`` 3.3 s, with ``torch._dynamo`` 6.4 s), paid again at each of the test suite's
node starts. :class:`EagerAdam` calls the very functions ``torch.optim.Adam`` runs, undecorated (the decorators'
``__wrapped__``), so its updates, state and ``state_dict`` are those of ``torch.optim.Adam`` bit for bit; the
grad mode the step's decorator set, it sets itself.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# torch's own methods without their decorators (the functions they wrap, as ``functools.wraps`` records them),
# unwrapped once here rather than at every call
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)


class EagerAdam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, same results) whose construction and steps skip ``torch._dynamo``."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # what torch's step decorator does
            return _ADAM_STEP(self, closure)
