"""Data-parallel learners: one model for the whole job through torch.distributed.

Every learner (rank = group * learnersPerGroup + index, world = groups *
learnersPerGroup) starts from the same seeded weights, and after each
backward pass the gradients are averaged with one all-reduce of a flat
buffer (gloo on CPU, nccl when the learner has a GPU). Same start + same
averaged gradients + same optimizer ⇒ identical parameters after every
synchronised step; each learner is still fed by its own group's buffers.

Learners of a job step together (that is what data parallelism is), but
never wait on actors or buffers. A learner that dies breaks the process
group: every learner then exits with an error and is restarted from its
checkpoint (the launcher or Kubernetes does that).
"""
from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

INIT_ENV = "TIANJI_DIST_INIT"
TIMEOUT_S = float(os.environ.get("TIANJI_DIST_TIMEOUT_S", "120"))


def world_of(job) -> tuple[int, int]:
    t = job.spec.topology
    return t.groups * t.learners, t.learners


class GradientAverager:
    """Callable hook: `averager(model)` replaces each .grad with the mean over all learners."""

    def __init__(self, rank: int, world: int, init_method: str, backend: Optional[str] = None):
        if world < 2:
            raise ValueError("a data-parallel group needs at least 2 learners")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of {world}")
        self.rank, self.world = rank, world
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(self.backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))

    def broadcast_from_first(self, model: nn.Module) -> None:
        """Make every learner start from rank 0's weights (e.g. after rank 0 resumed a checkpoint)."""
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, src=0)

    def __call__(self, model: nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off:off + n].view_as(g))
            off += n

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
