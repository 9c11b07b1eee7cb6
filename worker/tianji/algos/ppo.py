"""PPO (clipped surrogate) on asynchronously produced fragments.

A batch is [T, N] steps from possibly several behaviour versions. Values are
recomputed with the learner's current critic; advantages come from GAE,

    delta_t = r_t + gamma * V(o_{t+1}) * (1 - terminated_t) - V(o_t)
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},

and the surrogate's ratio is taken against the *behaviour* log-probs the
actor recorded, so residual policy lag is corrected by the clip (the paper's
on-policy "1:1" consumption plus staleness bound). With Gymnasium's NEXT_STEP
autoreset, o_{t+1} after a done is the final observation (bootstraps a
truncation) and the following step is a reset step, masked by `valid`.

With `offPolicyCorrection: vtrace`, advantages and value targets come from
algos/vtrace.py instead (truncated importance weights between the learner's
policy at update start and the behaviour policy). The surrogate's ratio stays
against the behaviour log-probs: a lagged sample is weighted by rho (in its
advantage, as IMPALA's policy gradient) and by the clipped ratio.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tianji.algos import BatchStager, apply_gradients, autocast, distributions, resolve_precision
from tianji.algos.adam import Adam
from tianji.algos.normalize import scale_rewards
from tianji.algos.vtrace import vtrace
from tianji.control.spec import PPOConfig


@torch.inference_mode()
def act(model: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sample a ~ softmax(logits) by inverse CDF in numpy (3x cheaper than torch.distributions per step);
    a diagonal Gaussian for continuous actions (distributions.py)."""
    if getattr(model, "continuous", False):
        return distributions.act_gaussian(model, obs, rng)
    logits = model.logits(torch.from_numpy(obs)).numpy().astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    cdf = np.exp(logp_all).cumsum(-1)
    u = rng.random((len(cdf), 1)) * cdf[:, -1:]
    a = np.minimum((cdf < u).sum(-1), cdf.shape[1] - 1)
    return a, {"logp": logp_all[np.arange(len(a)), a].astype(np.float32)}


def gae(rewards: torch.Tensor, values: torch.Tensor, last_value: torch.Tensor, dones: torch.Tensor,
        terminated: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Advantages [T, N] (see module docstring for the recursion)."""
    T = rewards.shape[0]
    next_values = torch.cat([values[1:], last_value[None]], 0)
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in range(T - 1, -1, -1):
        running = deltas[t] + gamma * lam * (1.0 - dones[t]) * running
        adv[t] = running
    return adv


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - pred) / Var(target): 1 is a perfect critic, 0 no better than a constant."""
    if target.numel() < 2:
        return 0.0
    var = float(target.var())
    return 0.0 if var < 1e-12 else 1.0 - float((target - pred).var()) / var


class PPOLearner:
    def __init__(self, model: nn.Module, cfg: PPOConfig, seed: int):
        self.model, self.cfg = model, cfg
        self.device = next(model.parameters()).device
        self.opt = Adam(model.parameters(), lr=cfg.lr, eps=1e-5, fused=True)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.stage = BatchStager(self.device)
        self.continuous = getattr(model, "continuous", False)
        self.gen = torch.Generator().manual_seed(seed)
        self.samples_seen = 0
        self.sync_grads = None  # set by a data-parallel learner: averages gradients across learners
        self.world = 1  # number of data-parallel learners

    def _lr(self) -> float:
        c = self.cfg
        if not c.lr_anneal_frames:
            return c.lr
        # Over the frames trained on, as CleanRL's per-update schedule (there every frame is trained
        # on): frames its buffers received but dropped (stale, overflow under load) would otherwise
        # end training early, and a learner that starts over without a checkpoint starts its
        # schedule over. The nominal count (batchSize x learners) is the same on every data-parallel
        # learner, so their schedules agree.
        return c.lr * max(0.0, 1.0 - self.samples_seen / c.lr_anneal_frames)

    def _forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model under the learner's precision; outputs float32 (the loss is computed in float32;
        `.float()` of a float32 tensor is the tensor itself, so fp32 is the plain path)."""
        with autocast(self.device, self.precision):
            logits, v = self.model(x)
        return logits.float(), v.float()

    def _stage(self, b: dict) -> dict[str, torch.Tensor]:
        """The arrays the update reads, on the learner's device (one pinned copy on CUDA)."""
        f32 = np.float32
        return self.stage(b, {"obs": None, "last_obs": None, "rewards": f32, "dones": f32, "terminated": f32,
                              "valid": bool, "logp": f32, "actions": f32 if self.continuous else np.int64})

    def _flat_actions(self, actions: torch.Tensor, n: int) -> torch.Tensor:
        return actions.reshape(n, actions.shape[-1]) if self.continuous else actions.reshape(n)

    @torch.no_grad()
    def _targets(self, t: dict, flat_obs: torch.Tensor, rewards: torch.Tensor, T: int, N: int):
        """Values at update start, then advantages and returns (GAE, or V-trace); with the mean
        importance weight and the critic's explained variance."""
        c = self.cfg
        logits0, values = self._forward(flat_obs)
        values = values.reshape(T, N)
        _, last_value = self._forward(t["last_obs"])
        valid_tn = t["valid"].reshape(T, N)
        dones, terminated = t["dones"], t["terminated"]
        rho_mean = 1.0
        if c.off_policy_correction == "vtrace":
            act0 = self._flat_actions(t["actions"], T * N)
            target_logp = distributions.logp_entropy(self.model, logits0, act0, self.continuous)[0].reshape(T, N)
            vt = vtrace(target_logp, t["logp"], rewards, values, last_value, dones, terminated, c.gamma,
                        c.gae_lambda, c.vtrace_rho_bar, c.vtrace_c_bar, valid_tn)
            adv, ret = vt.advantages, vt.vs
            rho_mean = float(vt.rhos[valid_tn].mean()) if bool(valid_tn.any()) else 1.0
        else:
            adv = gae(rewards, values, last_value, dones, terminated, c.gamma, c.gae_lambda)
            ret = adv + values
        return adv, ret, rho_mean, explained_variance(values[valid_tn], ret[valid_tn])

    def loss(self, obs: torch.Tensor, act: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor,
             ret: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The clipped-surrogate loss of one minibatch: (loss, policy loss, value loss, entropy,
        ratio, log ratio); the forward pass under the learner's precision, the rest in float32."""
        c = self.cfg
        logits, v = self._forward(obs)
        logp, entropy = distributions.logp_entropy(self.model, logits, act, self.continuous)
        log_ratio = logp - behaviour_logp
        ratio = log_ratio.exp()
        if c.norm_adv and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean()
        vl = 0.5 * (v - ret).pow(2).mean()
        ent = entropy.mean()
        return pg + c.vf_coef * vl - c.ent_coef * ent, pg, vl, ent, ratio, log_ratio

    def update(self, b: dict[str, np.ndarray], tick=None) -> dict[str, float]:
        """One PPO iteration (epochs x minibatches) on a [T, N] batch; returns loss stats. `tick()`
        runs after every minibatch step (the learner's heartbeat: an update can outlast its timeout)."""
        c = self.cfg
        dev = self.device
        t = self._stage(b)
        # One non-finite input spoils the whole batch, not only the minibatches it lands in: every
        # step's loss is made NaN, so each step is skipped after the all-reduce on every
        # data-parallel learner alike (apply_gradients), and they stay in step.
        spoiled = any(v.is_floating_point() and not bool(torch.isfinite(v).all()) for v in t.values()
                      if isinstance(v, torch.Tensor))
        obs = t["obs"]
        T, N = obs.shape[:2]
        rewards = t["rewards"]
        valid = t["valid"].reshape(-1)
        flat_obs = obs.reshape(T * N, *obs.shape[2:])
        # learner-owned statistics (normalize.py): rewards scaled with the batch's returns folded in;
        # observations normalised with the statistics the batch was acted with, folded in after the update
        if getattr(self.model, "ret_rms", None) is not None and not spoiled:
            rewards = scale_rewards(self.model.ret_rms, rewards, t["dones"], c.gamma)
        adv, ret, rho_mean, explained_var = self._targets(t, flat_obs, rewards, T, N)
        idx_valid = torch.nonzero(valid).squeeze(-1)
        mb_obs = flat_obs[idx_valid]
        mb_act = self._flat_actions(t["actions"], T * N)[idx_valid]
        mb_logp = t["logp"].reshape(-1)[idx_valid]
        mb_adv = adv.reshape(-1)[idx_valid]
        mb_ret = ret.reshape(-1)[idx_valid]
        n = int(idx_valid.numel())
        for g in self.opt.param_groups:
            g["lr"] = self._lr()
        stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0,
                 "grad_norm": 0.0}
        steps = skipped = 0
        # A fixed number of minibatch steps per epoch (batchSize // minibatchSize), whatever the count of
        # valid samples: data-parallel learners must take the same number of synchronised steps.
        mbs = min(c.minibatch_size, max(n, 1))
        per_epoch = max(1, c.batch_size // c.minibatch_size)
        for _ in range(c.epochs):
            perm = torch.randperm(n, generator=self.gen).to(dev).repeat((per_epoch * mbs) // max(n, 1) + 1)
            for s in range(0, per_epoch * mbs, mbs):
                i = perm[s:s + mbs]
                loss, pg, vl, ent, ratio, log_ratio = self.loss(mb_obs[i], mb_act[i], mb_logp[i], mb_adv[i],
                                                                mb_ret[i])
                if spoiled:
                    loss = loss * float("nan")
                if not apply_gradients(loss, self.model, self.opt, c.max_grad_norm, self.sync_grads, stats):
                    skipped += 1
                    continue
                steps += 1
                if tick is not None:
                    tick()
                with torch.no_grad():
                    stats["policy_loss"] += pg.item()
                    stats["value_loss"] += vl.item()
                    stats["entropy"] += ent.item()
                    stats["clip_fraction"] += ((ratio - 1).abs() > c.clip_coef).float().mean().item()
                    stats["approx_kl"] += ((ratio - 1) - log_ratio).mean().item()
        # Nominal count (batch size x learners), not the valid-sample count: the lr schedule must be the
        # same on every data-parallel learner or their parameters drift apart.
        self.samples_seen += c.batch_size * self.world
        if getattr(self.model, "obs_rms", None) is not None and not spoiled:
            self.model.obs_rms.update(flat_obs[valid])  # for the next version (normalize.py: why after)
        out = {k: v / max(steps, 1) for k, v in stats.items()}
        out.update(explained_variance=explained_var, importance_weight=rho_mean, train_steps=steps, samples=n,
                   skipped_steps=skipped)
        return out

    def state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "samples_seen": self.samples_seen, "gen": self.gen.get_state()}

    def load_state(self, s: dict) -> None:
        self.opt.load_state_dict(s["optimizer"])
        self.samples_seen = int(s["samples_seen"])
        self.gen.set_state(s["gen"])
