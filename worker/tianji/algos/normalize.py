"""Observation and reward normalisation owned by the learner (continuous control, as SB3's VecNormalize).

The statistics are buffers of the model, so they travel with the parameters
(every actor normalises with the same, learner-published statistics), are
checkpointed and resumed with it, and are checked on receipt like any
parameter (finite; validate.check_params adds var > 0, count > 0).

Fragments carry *raw* observations. A PPO update normalises them with the
statistics the batch was acted with (the model's own; in strict mode exactly
the actors'), so the importance ratio starts at 1, as in SB3's VecNormalize,
where observations are normalised when collected. Folding the batch in first
would shift every input at the update's start: on rl-zoo's Acrobot entry
(strict, 15 seeds) that order takes a geometric mean of 1.11x SB3's frames,
this one 1.01x (docs/benchmarks.md). After the update the learner folds the
batch's valid observations into `obs_rms` (Chan et al. parallel update,
all-reduced across the learners that share gradients, so their models stay
identical), for the next version; actors catch up at its publish. Rewards are
scaled only at the learner (actors never use them): r / sqrt(Var[R] + eps),
with R_t = gamma * R_{t-1} * (1 - done_{t-1}) + r_t
accumulated along each fragment column (the accumulator restarts at each
fragment, so it underestimates returns in a fragment's first ~1/(1-gamma)
steps; the scale is what matters, not its exact value).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

EPS = 1e-8
# Which learners fold their batches together (runtime/distributed.GroupSync sets it): the whole
# world (allreduce mode), a group's learners (average mode), or none (one learner per group).
_SYNC: dict = {"enabled": True, "group": None}
CLIP = 10.0  # normalised observations and scaled rewards are clipped to +-CLIP (SB3's default)
# Pixels (0..255): Sample Factory's floor and bound (eps 1e-5 on x / 255, clip 5), so that a pixel
# that almost never changes (a near-zero variance) does not swing to the bound when it does.
PIXEL_EPS, PIXEL_CLIP = 1e-5 * 255.0**2, 5.0


def configure_sync(enabled: bool, group=None) -> None:
    _SYNC.update(enabled=enabled, group=group)


def enabled(flag: Optional[bool], info) -> bool:
    """A normalisation switch from the spec: explicit, or on for continuous actions with vector
    observations. Images: only when asked (per-pixel statistics, as Sample Factory's Atari default;
    unasked, the encoder scales them by 1/255)."""
    if info.is_image:
        return bool(flag)
    return info.continuous if flag is None else bool(flag)


class RunningMeanStd(nn.Module):
    """Running mean/variance of a stream of arrays of `shape` (float64 buffers: exact over long runs).
    No 0-d buffers: the wire carries arrays of rank >= 1."""

    def __init__(self, shape: tuple[int, ...] = (1,), eps: float = EPS, clip: float = CLIP):
        super().__init__()
        self.eps, self.clip = eps, clip  # normalize's variance floor and bound (not state: set by the model)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.full((1,), EPS, dtype=torch.float64))
        self._cache: Optional[tuple] = None  # _float32_stats

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch [n, *shape] in; data-parallel learners fold in the union of their batches."""
        x = x.detach().reshape(-1, *self.mean.shape)
        if x.dtype == torch.uint8:
            # pixels: squares are exact in float32, sums in float64 (a [512, 4, 84, 84] batch would
            # otherwise be two 116 MB float64 temporaries)
            s1, s2 = x.sum(0, dtype=torch.float64), x.float().square().sum(0, dtype=torch.float64)
        else:
            x = x.to(torch.float64)
            s1, s2 = x.sum(0), x.pow(2).sum(0)
        moments = torch.cat([torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device),
                             s1.reshape(-1), s2.reshape(-1)])
        if _SYNC["enabled"] and dist.is_available() and dist.is_initialized():
            dist.all_reduce(moments, op=dist.ReduceOp.SUM, group=_SYNC["group"])
        n = moments[0]
        if n < 1:
            return
        k = self.mean.numel()
        b_mean = (moments[1:1 + k] / n).reshape(self.mean.shape)
        b_var = (moments[1 + k:] / n).reshape(self.mean.shape) - b_mean.pow(2)
        b_var = b_var.clamp_min(0.0)
        delta = b_mean - self.mean
        total = self.count + n
        m2 = self.var * self.count + b_var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_((m2 / total).clamp_min(EPS))
        self.count.copy_(total)

    def _float32_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 mean and std. Under inference mode (an actor's forward, every step) they are kept
        until a buffer is written (`Tensor._version` counts in-place writes: update(),
        load_state_dict, a bf16 copy's sync): made afresh per call, Pong's four 84x84 float64
        temporaries cost an actor 113 against 18 µs per frame at 8 envs (docs/benchmarks.md)."""
        if not torch.is_inference_mode_enabled() or self.mean.is_inference() or self.var.is_inference():
            # inference tensors (a model built under inference mode) count no writes: nothing kept
            return self.mean.to(torch.float32), torch.sqrt(self.var + self.eps).to(torch.float32)
        # identity and storage: a deep copy (the bf16 copy, an ONNX export) carries the cache over
        key = (self.mean.data_ptr(), self.mean._version, self.var.data_ptr(), self.var._version, self.eps)
        c = self._cache
        if c is None or c[0] is not self.mean or c[1] is not self.var or c[2] != key:
            c = self._cache = (self.mean, self.var, key, self.mean.to(torch.float32),
                               torch.sqrt(self.var + self.eps).to(torch.float32))
        return c[3], c[4]

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        m, s = self._float32_stats()
        # One float32 temporary, the rest in place (integers, uint8 pixels included, promote to float32
        # exactly): an actor normalises every step's stack of frames (Pong, 8 envs: 24 against 28 µs).
        return ((x.float() if x.is_floating_point() else x) - m).div_(s).clamp_(-self.clip, self.clip)


def scale_rewards(rms: RunningMeanStd, rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Update the return statistics from a [T, B] batch and return the rewards divided by their std."""
    ret = torch.zeros_like(rewards[0], dtype=torch.float64)
    returns = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        ret = ret * gamma + rewards[t]
        returns[t] = ret
        ret = ret * (1.0 - dones[t].to(torch.float64))
    rms.update(returns.reshape(-1, 1))
    return (rewards / torch.sqrt(rms.var + EPS).to(rewards.dtype)).clamp(-CLIP, CLIP)
