"""torch.optim.Adam without torch._dynamo.

torch.optim wraps Optimizer.add_param_group, zero_grad, state_dict and load_state_dict in
torch._disable_dynamo and Adam.step in a graph-break helper; each imports torch._dynamo on first
use: about 800 modules, sympy among them, 1.2 s of CPU on the 2-core machine (`import torch`
itself is 1.1 s). A learner never compiles, so those wrappers guard nothing here, and that import
sat on the critical path of every run and every learner pod: in the launcher's zygote before any
worker forked. This subclass calls the same torch functions without the wrappers: the update, the
state and the state_dict format are torch.optim.Adam's (tests/unit/test_adam.py checks both, and
that a learner's update leaves torch._dynamo unimported).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import Optimizer


def _unwrapped(fn: Callable) -> Callable:
    """The function under torch's functools.wraps decorators (itself where there is none)."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


_ADD_PARAM_GROUP = _unwrapped(Optimizer.add_param_group)
_ZERO_GRAD = _unwrapped(Optimizer.zero_grad)
_STATE_DICT = _unwrapped(Optimizer.state_dict)
_LOAD_STATE_DICT = _unwrapped(Optimizer.load_state_dict)
_STEP = _unwrapped(torch.optim.Adam.step)


class Adam(torch.optim.Adam):
    """torch.optim.Adam, same arguments, same update, same state; never imports torch._dynamo."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure=None):
        # What the graph-break helper does besides importing dynamo: no autograd graph for the
        # update (torch.optim's differentiable=False default, which TianJi never changes).
        with torch.no_grad():
            return _STEP(self, closure)
