"""Algorithms: what an actor computes per step and what a learner does with a batch."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
from torch import nn


def to_tensor(a, device: torch.device, dtype=None) -> torch.Tensor:
    """numpy (possibly a read-only wire view) → tensor on the learner's device."""
    t = torch.from_numpy(np.asarray(a, dtype=dtype))
    return t.to(device, non_blocking=True) if device.type != "cpu" else t


def apply_gradients(loss: torch.Tensor, model: nn.Module, opt: torch.optim.Optimizer, max_grad_norm: float,
                    sync_grads: Optional[Callable[[nn.Module], None]] = None, stats: Optional[dict] = None) -> bool:
    """One optimizer step: backward, average across data-parallel learners (if any), clip, step.

    Returns False, and leaves the parameters and the optimizer's state untouched, when the loss or
    any gradient is not finite. The check is on the (averaged) gradient norm, after the all-reduce,
    so data-parallel learners all take the same decision and stay in step. `stats`, if given,
    accumulates the pre-clip gradient norm of the steps taken (`grad_norm`)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if sync_grads is not None:
        sync_grads(model)
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
    if not (bool(torch.isfinite(norm)) and bool(torch.isfinite(loss.detach()))):
        opt.zero_grad(set_to_none=True)
        return False
    opt.step()
    if stats is not None:
        stats["grad_norm"] = stats.get("grad_norm", 0.0) + float(norm)
    return True


def params_finite(model: nn.Module) -> bool:
    """Every parameter and buffer of `model` finite."""
    return all(bool(torch.isfinite(t).all()) for t in model.state_dict().values() if t.is_floating_point())
