"""Algorithms: what an actor computes per step and what a learner does with a batch.

Shared learner plumbing lives here: the batch's host-to-device staging (BatchStager), the
learner's numeric precision (resolve_precision, autocast) and the guarded optimizer step
(apply_gradients).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Optional

import numpy as np
import torch
from torch import nn

STAGE_ALIGN = 64  # bytes: every array of a staged batch starts at a multiple (any dtype can view it)


def to_tensor(a, device: torch.device, dtype=None) -> torch.Tensor:
    """numpy (possibly a read-only wire view) → tensor on the learner's device."""
    t = torch.from_numpy(np.asarray(a, dtype=dtype))
    return t.to(device, non_blocking=True) if device.type != "cpu" else t


class BatchStager:
    """A batch's arrays onto the learner's device. On CUDA: packed into one page-locked host
    buffer (allocated once, grown when a batch needs more) and sent in one non-blocking copy;
    the buffer is reused only after the previous copy has finished (a CUDA event). On the CPU:
    tensors over the arrays themselves, no copy (exactly as `to_tensor`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pin = device.type == "cuda"
        self.host: Optional[torch.Tensor] = None
        self.copied: Optional[torch.cuda.Event] = None

    def __call__(self, b: dict, dtypes: dict) -> dict[str, torch.Tensor]:
        """`dtypes`: key → numpy dtype to convert to (None: as it is). Returns key → tensor."""
        arrays = {k: np.asarray(b[k], dtype=dt) for k, dt in dtypes.items()}
        if self.device.type != "cuda":
            return {k: torch.from_numpy(a) for k, a in arrays.items()}
        if self.copied is not None:
            self.copied.synchronize()  # the previous batch's copy may still read the buffer
        offsets, total = self.pack(arrays)
        dev = self.host[:total].to(self.device, non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record(torch.cuda.current_stream(self.device))
        return unpack(dev, arrays, offsets)

    def pack(self, arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
        """Copy `arrays` into the host buffer, each at a STAGE_ALIGN multiple; (offsets, bytes used)."""
        offsets, total = {}, 0
        for k, a in arrays.items():
            offsets[k] = total
            total += -(-a.nbytes // STAGE_ALIGN) * STAGE_ALIGN
        total = max(total, STAGE_ALIGN)
        if self.host is None or self.host.numel() < total:
            self.host = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin)
        host = self.host.numpy()
        for k, a in arrays.items():
            o = offsets[k]
            np.copyto(host[o:o + a.nbytes].view(a.dtype).reshape(a.shape), a, casting="no")
        return offsets, total


def unpack(buf: torch.Tensor, arrays: dict[str, np.ndarray], offsets: dict[str, int]) -> dict[str, torch.Tensor]:
    """Views of a packed uint8 buffer (BatchStager.pack) as the arrays' dtypes and shapes."""
    out = {}
    for k, a in arrays.items():
        o = offsets[k]
        out[k] = buf[o:o + a.nbytes].view(torch.from_numpy(np.empty(0, dtype=a.dtype)).dtype).view(a.shape)
    return out


def resolve_precision(requested: str, device: torch.device) -> str:
    """spec.algorithm.precision on this device: "fp32" or "bf16". auto: bf16 on a CUDA device that
    supports it, else fp32; bf16 asked for on a CUDA device without it is an error."""
    if requested == "fp32":
        return "fp32"
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if requested == "auto":
        return "bf16" if cuda_bf16 else "fp32"
    if requested == "bf16":
        if device.type == "cuda" and not cuda_bf16:
            raise ValueError(f"spec.algorithm.precision: bf16, but {torch.cuda.get_device_name(device)} does not "
                             "support bfloat16; use auto or fp32")
        return "bf16"
    raise ValueError(f"spec.algorithm.precision: {requested!r} is not auto, fp32 or bf16")


def autocast(device: torch.device, precision: str):
    """The forward pass and loss under bfloat16 autocast (bf16), or nothing at all (fp32: the
    float32 path is the plain one, bit for bit). Weights, gradients and optimizer state stay float32."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


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
