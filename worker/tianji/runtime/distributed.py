"""Data-parallel learners through torch.distributed: within a group, and between groups.

Every learner has rank = group * learnersPerGroup + index in one process group
of world = groups * learnersPerGroup (`sync_backend`: nccl when each learner has
a GPU of its own, gloo otherwise), and all start from rank 0's weights
(`broadcast_from_first`). What the learners then share depends on
spec.topology.groupSync.mode:

  allreduce  after each backward pass the gradients are averaged over all
             learners of all groups with one all-reduce of a flat buffer. Same
             start + same averaged gradients + same optimizer => identical
             parameters after every step; every learner waits for the slowest.
  average    gradients are all-reduced synchronously only among the learners of
             the same group (a subgroup; none with one learner per group), so a
             group's learners stay identical. Between groups, parameters are
             averaged asynchronously (`GroupSync.after_update`): every
             intervalUpdates updates a learner posts a non-blocking all-reduce
             of a snapshot s_own of its parameters and buffers, on a process
             group of its own, keeps training, and once the collective has
             completed (polled at each later update, never waited on) applies
             theta <- theta + (mean(s) - s_own): the mean of the snapshots plus
             its own progress since. Collective k is posted only after k-1 has
             completed, so every rank posts the same collectives in the same
             order and a fast group never blocks on a slow one. Optimizer state
             stays local. A mean that is not finite (a NaN from any rank) is
             skipped on every rank alike and counted. The learners of one group
             agree (a tiny MIN all-reduce in their subgroup) on whether the
             collective has completed, so they apply it at the same update and
             stay identical.

Learners never wait on actors or buffers. A learner that dies breaks the process
groups: the others exit with an error (at their next collective) and everything
is restarted from its checkpoint (the launcher or Kubernetes does that).
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


def sync_backend(device: torch.device, shares_gpu: bool) -> str:
    """nccl for learners that each train on a GPU of their own; gloo otherwise: nccl moves CUDA
    tensors only (a CPU learner on a machine with a GPU must not pick it) and refuses two ranks on
    one GPU (local learners beyond the visible GPUs share them, cuda:<k mod GPUs>)."""
    return "nccl" if device.type == "cuda" and not shares_gpu else "gloo"


def world_of(job) -> tuple[int, int]:
    t = job.spec.topology
    return t.groups * t.learners, t.learners


class GradientAverager:
    """Callable hook: `averager(model)` replaces each .grad with the mean over the learners of
    `group` (a torch.distributed process group; None: the whole world)."""

    def __init__(self, size: int, group=None):
        self.size, self.group = size, group

    def __call__(self, model: nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        flat /= self.size
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off:off + n].view_as(g))
            off += n


def _float_state(model: nn.Module) -> list[torch.Tensor]:
    """What cross-group averaging moves: parameters and floating-point buffers (normaliser statistics)."""
    return [t for t in model.state_dict().values() if t.is_floating_point()]


def _flats(tensors: list[torch.Tensor]) -> dict[torch.dtype, torch.Tensor]:
    """One flat copy per dtype (float32 parameters, float64 running statistics)."""
    by: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by.setdefault(t.dtype, []).append(t.detach().reshape(-1))
    return {d: torch.cat(ts) for d, ts in by.items()}


class GroupSync:
    """One learner's torch.distributed state for spec.topology.groupSync (module docstring).

    `sync_grads`: the gradient hook for the algorithm (None when nothing is shared per step),
    `after_update(model)`: call once after every algorithm update; returns True when it applied
    a cross-group average to `model`. Counters: `averages` applied, `skipped` (not finite)."""

    def __init__(self, rank: int, groups: int, per_group: int, init_method: str, mode: str = "allreduce",
                 interval: int = 20, backend: Optional[str] = None, device: Optional[torch.device] = None):
        world = groups * per_group
        if world < 2:
            raise ValueError("data-parallel learners need at least 2 learners")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of {world}")
        if mode not in ("allreduce", "average"):
            raise ValueError(f"groupSync mode {mode!r}: expected allreduce or average")
        if interval < 1:
            raise ValueError(f"groupSync intervalUpdates {interval} < 1")
        self.rank, self.world, self.mode, self.interval = rank, world, mode, interval
        self.device = device or torch.device("cpu")
        self.backend = backend or sync_backend(self.device, shares_gpu=False)
        # The subgroup's completion flag lives where the backend moves tensors.
        self.flag_device = self.device if self.backend == "nccl" else torch.device("cpu")
        dist.init_process_group(self.backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        self.subgroup = None  # this group's learners (average mode, per_group > 1)
        self.cross = None  # every rank, for the asynchronous averaging (average mode, groups > 1)
        self.posted = self.averages = self.skipped = 0  # in both modes: the learner reads them
        if mode == "allreduce":
            self.sync_grads: Optional[GradientAverager] = GradientAverager(world)
            self.stats_group = None  # normaliser statistics: the whole world
            self.stats_sync = True
            return
        # Every rank creates every subgroup, in the same order (torch.distributed requires it).
        for g in range(groups):
            pg = dist.new_group(list(range(g * per_group, (g + 1) * per_group))) if per_group > 1 else None
            if g == rank // per_group:
                self.subgroup = pg
        if groups > 1:
            self.cross = dist.new_group(list(range(world)))
        self.sync_grads = GradientAverager(per_group, self.subgroup) if per_group > 1 else None
        self.stats_group, self.stats_sync = self.subgroup, per_group > 1
        self.groups, self.per_group = groups, per_group
        self.updates = 0  # since the last post
        self.work: list = []  # the collective in flight (one work per dtype)
        self.snapshot: dict[torch.dtype, torch.Tensor] = {}  # own snapshot, kept to compute the delta
        self.reduced: dict[torch.dtype, torch.Tensor] = {}  # summed in place by the collective

    def broadcast_from_first(self, model: nn.Module) -> None:
        """Make every learner start from rank 0's weights (e.g. after rank 0 resumed a checkpoint)."""
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, src=0)

    # ------------------------------------------------------------ average mode
    def _completed(self) -> bool:
        done = all(w.is_completed() for w in self.work)
        if self.subgroup is not None:  # the group's learners apply at the same update, or none does
            flag = torch.tensor([1 if done else 0], dtype=torch.int32, device=self.flag_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.subgroup)
            done = bool(flag.item())
        if done:
            for w in self.work:
                w.wait()  # completed: returns at once, or raises what failed (a peer gone)
        return done

    def _post(self, model: nn.Module) -> None:
        self.snapshot = _flats(_float_state(model))
        self.reduced = {d: t.clone() for d, t in self.snapshot.items()}
        self.work = [dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.cross, async_op=True)
                     for _, t in sorted(self.reduced.items(), key=lambda kv: str(kv[0]))]
        self.posted += 1
        self.updates = 0

    @torch.no_grad()
    def _apply(self, model: nn.Module) -> bool:
        deltas = {}
        for d, total in self.reduced.items():
            mean = total / self.world
            if not bool(torch.isfinite(mean).all()):  # a NaN/inf from any rank: the same decision everywhere
                return False
            deltas[d] = mean - self.snapshot[d]
        state = _float_state(model)
        new = []
        offs = {d: 0 for d in deltas}
        for t in state:
            n = t.numel()
            v = t + deltas[t.dtype][offs[t.dtype]:offs[t.dtype] + n].view_as(t).to(t.device)
            offs[t.dtype] += n
            if not bool(torch.isfinite(v).all()):
                return False
            new.append(v)
        for t, v in zip(state, new):
            t.copy_(v)
        return True

    def poll(self, model: nn.Module) -> bool:
        """Apply the collective in flight if it has completed (never waits). True if applied."""
        if not self.work or not self._completed():
            return False
        self.work = []
        if self._apply(model):
            self.averages += 1
            return True
        self.skipped += 1
        return False

    def after_update(self, model: nn.Module) -> bool:
        """Poll the collective in flight (apply it if completed), post the next when it is due."""
        if self.mode != "average" or self.cross is None:
            return False
        self.updates += 1
        applied = self.poll(model)
        if not self.work and self.updates >= self.interval:
            self._post(model)
        return applied

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
