"""PPO's action distributions: Categorical (Discrete) and diagonal Gaussian (Box).

The Gaussian follows CleanRL's ppo_continuous_action.py: mean from the policy
head, a state-independent log-std parameter (clamped to [LOG_STD_MIN,
LOG_STD_MAX] so densities, and hence log-probs, stay bounded), actions sampled
*unclipped*; the actor stores the unclipped action and its log-prob and clips
only what it passes to env.step (`clip_to_bounds`).

Acting samples in numpy (cheaper than torch.distributions per step);
learning evaluates log-probs and entropy in torch.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def log_std(model: nn.Module) -> torch.Tensor:
    return model.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


@torch.inference_mode()
def act_gaussian(model: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """a = mean + std * z, z ~ N(0, I); returns float32 actions [N, act_dim] and their log-probs [N]."""
    mean = model.logits(torch.from_numpy(obs)).numpy().astype(np.float64)
    ls = log_std(model).numpy().astype(np.float64)
    z = rng.standard_normal(mean.shape)
    a = mean + np.exp(ls) * z
    logp = (-0.5 * z * z - ls - _HALF_LOG_2PI).sum(-1)
    return a.astype(np.float32), {"logp": logp.astype(np.float32)}


def clip_to_bounds(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """What env.step gets: the stored (unclipped) action clipped into the Box."""
    return np.clip(actions, low, high)


def logp_entropy(model: nn.Module, pi_out: torch.Tensor, actions: torch.Tensor,
                 continuous: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `actions` under the current policy and its entropy, per sample."""
    if not continuous:
        logp_all = torch.log_softmax(pi_out, -1)
        return logp_all.gather(1, actions[:, None]).squeeze(1), -(logp_all.exp() * logp_all).sum(-1)
    ls = log_std(model)
    z = (actions - pi_out) * torch.exp(-ls)
    logp = (-0.5 * z.pow(2) - ls - _HALF_LOG_2PI).sum(-1)
    ent = (ls + 0.5 + _HALF_LOG_2PI).sum(-1).expand(pi_out.shape[0])
    return logp, ent


def flat_actions(actions, n: int, continuous: bool, device: torch.device) -> torch.Tensor:
    """Batch actions [T, B(, act_dim)] → [T*B] int64 or [T*B, act_dim] float32."""
    from tianji.algos import to_tensor

    if continuous:
        a = to_tensor(actions, device, np.float32)
        return a.reshape(n, a.shape[-1])
    return to_tensor(actions, device, np.int64).reshape(n)
