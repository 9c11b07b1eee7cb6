"""V-trace off-policy targets (IMPALA, Espeholt et al. 2018, eq. 1 and the remark on lambda).

A batch is [T, N] steps acted by behaviour policies mu (possibly several lagged versions);
pi is the learner's policy at the start of the update. With truncated importance weights

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))
    c_t   = lambda * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))

the value targets and policy-gradient advantages are

    delta_t = rho_t * (r_t + gamma * (1 - terminated_t) * V(x_{t+1}) - V(x_t))
    v_t     = V(x_t) + delta_t + gamma * (1 - done_t) * c_t * (v_{t+1} - V(x_{t+1}))
    A_t     = rho_t * (r_t + gamma * (1 - terminated_t) * boot_{t+1} - V(x_t))
    boot_{t+1} = v_{t+1} if the episode goes on (done_t = 0), else V(x_{t+1})

with v_T = V(x_T) (the fragment's last observation). Episode ends follow algos/ppo.gae: with
Gymnasium's NEXT_STEP autoreset, x_{t+1} after a done is the final observation (bootstraps a
truncation, ignored after a termination), and the following reset step is masked by `valid`;
its weights are set to 1 so that a dummy action cannot scale anything.

With pi == mu (on-policy data) rho = 1 and c = lambda, so v_t - V(x_t) is GAE(lambda) and,
with lambda = 1, v_t is the n-step return bootstrapped at the fragment's end.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

MAX_LOG_RATIO = 20.0  # exp() of more overflows float32; the truncation makes larger values moot


class VTrace(NamedTuple):
    vs: torch.Tensor          # value targets [T, N]
    advantages: torch.Tensor  # policy-gradient advantages [T, N]
    rhos: torch.Tensor        # truncated importance weights [T, N] (for statistics)


@torch.no_grad()
def vtrace(target_logp: torch.Tensor, behaviour_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           last_value: torch.Tensor, dones: torch.Tensor, terminated: torch.Tensor, gamma: float, lam: float = 1.0,
           rho_bar: float = 1.0, c_bar: float = 1.0, valid: Optional[torch.Tensor] = None) -> VTrace:
    """V-trace targets for [T, N] tensors (last_value [N]); see the module docstring."""
    log_ratio = (target_logp - behaviour_logp).clamp(max=MAX_LOG_RATIO)
    if valid is not None:
        log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    ratio = log_ratio.exp()
    rhos = ratio.clamp(max=rho_bar)
    cs = lam * ratio.clamp(max=c_bar)
    next_values = torch.cat([values[1:], last_value[None]], 0)
    not_term, not_done = 1.0 - terminated, 1.0 - dones
    deltas = rhos * (rewards + gamma * not_term * next_values - values)
    T = rewards.shape[0]
    vs_minus_v = torch.zeros_like(values)
    acc = torch.zeros_like(last_value)
    for t in range(T - 1, -1, -1):
        acc = deltas[t] + gamma * not_done[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    next_vs = torch.cat([vs[1:], last_value[None]], 0)
    boot = not_done * next_vs + dones * next_values
    adv = rhos * (rewards + gamma * not_term * boot - values)
    return VTrace(vs, adv, rhos)
