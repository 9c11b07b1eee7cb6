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
                    sync_grads: Optional[Callable[[nn.Module], None]] = None) -> None:
    """One optimizer step: backward, average across data-parallel learners (if any), clip, step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if sync_grads is not None:
        sync_grads(model)
    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
    opt.step()
