"""Double DQN with a target network, on uniformly replayed transitions.

Per gradient step on a minibatch of (o, a, R, o', d) where R is the n-step
return and d = gamma^k * (1 - terminated) its bootstrap discount:

    a*     = argmax_a Q_online(o', a)          (double DQN; Q_target if off)
    target = R + d * Q_target(o', a*)
    loss   = Huber(Q_online(o, a) - target)

The target network follows the online one every `targetUpdateInterval`
steps with Polyak factor tau (tau = 1: hard copy).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tianji.algos import BatchStager, apply_gradients, autocast, resolve_precision
from tianji.algos.adam import Adam
from tianji.control.spec import DQNConfig


def epsilon(cfg: DQNConfig, global_frames: float) -> float:
    """Linear decay from epsilonStart to epsilonEnd over explorationFrames (global estimate)."""
    frac = min(1.0, global_frames / cfg.exploration_frames)
    return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)


@torch.inference_mode()
def act(model: nn.Module, obs: np.ndarray, eps: float, rng: np.random.Generator,
        n_actions: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    greedy = model(torch.from_numpy(obs)).argmax(-1).numpy()
    explore = rng.random(len(greedy)) < eps
    if explore.any():
        greedy = np.where(explore, rng.integers(0, n_actions, len(greedy)), greedy)
    return greedy, {}


class DQNLearner:
    def __init__(self, model: nn.Module, cfg: DQNConfig, seed: int):
        self.model, self.cfg = model, cfg
        self.device = next(model.parameters()).device
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.opt = Adam(model.parameters(), lr=cfg.lr)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.stage = BatchStager(self.device)
        self.steps = 0
        self.sync_grads = None  # set by a data-parallel learner: averages gradients across learners

    def _sync_target(self) -> None:
        tau = self.cfg.tau
        with torch.no_grad():
            for t, o in zip(self.target.parameters(), self.model.parameters()):
                t.lerp_(o, tau) if tau < 1 else t.copy_(o)

    def loss(self, obs: torch.Tensor, act: torch.Tensor, ret: torch.Tensor, disc: torch.Tensor,
             nxt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Huber loss of one minibatch and its Q(o, a). The forward passes run under the learner's
        precision, the targets and the loss in float32 (`.float()` of a float32 tensor is the tensor
        itself: fp32 is the plain path)."""
        dev = self.device
        with torch.no_grad(), autocast(dev, self.precision):
            q_next_t = self.target(nxt).float()
            a_star = (self.model(nxt).float() if self.cfg.double_dqn else q_next_t).argmax(-1, keepdim=True)
        y = ret + disc * q_next_t.gather(1, a_star).squeeze(1)
        with autocast(dev, self.precision):
            q_all = self.model(obs)
        q = q_all.float().gather(1, act[:, None]).squeeze(1)
        return F.smooth_l1_loss(q, y), q

    def update(self, b: dict[str, np.ndarray], tick=None) -> dict[str, float]:
        """stepsPerBatch gradient steps; `tick()` after each (the learner's heartbeat, as PPO's)."""
        c = self.cfg
        t = self.stage(b, {"obs": None, "next_obs": None, "actions": np.int64, "returns": np.float32,
                           "discounts": np.float32})
        obs, nxt, act, ret, disc = t["obs"], t["next_obs"], t["actions"], t["returns"], t["discounts"]
        total = obs.shape[0]
        bs = c.batch_size
        loss_sum, q_sum, steps, skipped, norms = 0.0, 0.0, 0, 0, {"grad_norm": 0.0}
        for s in range(0, total - bs + 1, bs):
            sl = slice(s, s + bs)
            loss, q = self.loss(obs[sl], act[sl], ret[sl], disc[sl], nxt[sl])
            if not apply_gradients(loss, self.model, self.opt, c.max_grad_norm, self.sync_grads, norms):
                skipped += 1
                continue
            self.steps += 1
            steps += 1
            if tick is not None:
                tick()
            if self.steps % c.target_update_interval == 0:
                self._sync_target()
            loss_sum += loss.item()
            q_sum += q.detach().mean().item()
        return {"dqn_loss": loss_sum / max(steps, 1), "q_mean": q_sum / max(steps, 1),
                "grad_norm": norms["grad_norm"] / max(steps, 1),
                "train_steps": steps, "samples": steps * bs, "skipped_steps": skipped}

    def state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "target": self.target.state_dict(), "steps": self.steps}

    def load_state(self, s: dict) -> None:
        self.opt.load_state_dict(s["optimizer"])
        self.target.load_state_dict(s["target"])
        self.steps = int(s["steps"])
