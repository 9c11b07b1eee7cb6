"""PPO on EnvPool Pong in one file, after CleanRL's ppo_atari_envpool.py: the simplest fast peer.

    bench/peers/.venv-cleanrl-envpool/bin/python bench/peers/cleanrl_ppo_envpool.py \
        --seconds 1200 --log pong-cleanrl.jsonl

Credit: the algorithm and every setting follow CleanRL (Huang et al., "CleanRL: High-quality
Single-file Implementations of Deep Reinforcement Learning Algorithms", JMLR 2022;
github.com/vwxyzjn/cleanrl, MIT) and its "37 implementation details of PPO": 8 EnvPool envs x 128
steps, 4 epochs of 4 minibatches, Adam (eps 1e-5) at 2.5e-4 annealed linearly over 10M frames,
gamma 0.99, GAE 0.95, clip 0.1 (policy and value), entropy 0.01, value 0.5, gradient norm 0.5,
normalised advantages, the Nature CNN with orthogonal init. EnvPool's Pong-v5: 84x84 grey,
frame skip 4, 4 stacked frames, up to 30 no-ops, no sticky actions, episodic life, clipped rewards
for training. This file is written for this bench (not CleanRL's code): same settings, and a
JSON-lines clock instead of TensorBoard. Frames are agent steps (4 emulator frames each), TianJi's
unit; the logged return is the mean of the last 100 whole games' unclipped scores.
"""
from __future__ import annotations

import argparse
import collections
import json
import time

T_LAUNCH = time.time()  # before the heavy imports: start-up is part of the wall clock

import envpool  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ANNEAL_FRAMES = 10_000_000


def ortho(layer: nn.Module, gain: float = 2 ** 0.5) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class NatureAgent(nn.Module):
    def __init__(self, actions: int):
        super().__init__()
        self.body = nn.Sequential(
            ortho(nn.Conv2d(4, 32, 8, 4)), nn.ReLU(), ortho(nn.Conv2d(32, 64, 4, 2)), nn.ReLU(),
            ortho(nn.Conv2d(64, 64, 3, 1)), nn.ReLU(), nn.Flatten(), ortho(nn.Linear(3136, 512)), nn.ReLU())
        self.pi = ortho(nn.Linear(512, actions), 0.01)
        self.v = ortho(nn.Linear(512, 1), 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(obs.float() / 255.0)
        return self.pi(h), self.v(h).squeeze(-1)


class Games:
    """Whole-game scores from EnvPool's unclipped `info["reward"]` (Pong has no lives to join)."""

    def __init__(self, n: int):
        self.running = np.zeros(n)
        self.done: collections.deque[float] = collections.deque(maxlen=100)
        self.count = 0

    def step(self, info: dict, done: np.ndarray) -> None:
        self.running += info["reward"]
        ended = done & (info["lives"] == 0)
        for r in self.running[ended]:
            self.done.append(float(r))
        self.count += int(ended.sum())
        self.running[ended] = 0.0

    def mean(self) -> float | None:
        return float(np.mean(self.done)) if self.done else None


def gae(rew, val, done, last_val, last_done, gamma=0.99, lam=0.95):
    adv = torch.zeros_like(rew)
    carry = torch.zeros_like(last_val)
    for t in reversed(range(rew.shape[0])):
        nxt_val, nxt_nonterm = (last_val, 1.0 - last_done) if t == rew.shape[0] - 1 else (val[t + 1], 1.0 - done[t + 1])
        delta = rew[t] + gamma * nxt_val * nxt_nonterm - val[t]
        carry = delta + gamma * lam * nxt_nonterm * carry
        adv[t] = carry
    return adv, adv + val


def update(agent, opt, batch, epochs=4, minibatches=4, clip=0.1, ent=0.01, vf=0.5, max_norm=0.5) -> None:
    obs, act, logp, adv, ret, val = batch
    n = obs.shape[0]
    size = n // minibatches
    for _ in range(epochs):
        perm = torch.randperm(n)
        for i in range(0, n, size):
            j = perm[i:i + size]
            logits, v = agent(obs[j])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(act[j]) - logp[j]).exp()
            a = (adv[j] - adv[j].mean()) / (adv[j].std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_clipped = val[j] + (v - val[j]).clamp(-clip, clip)
            v_loss = 0.5 * torch.max((v - ret[j]) ** 2, (v_clipped - ret[j]) ** 2).mean()
            loss = pg - ent * dist.entropy().mean() + vf * v_loss
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), max_norm)
            opt.step()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, required=True, help="wall-clock budget from launch")
    ap.add_argument("--log", required=True, help="JSON lines: one clock row a second")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="torch threads and EnvPool threads (they alternate)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)  # the loop is synchronous: envs and torch take turns on the cores
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    envs = envpool.make("Pong-v5", env_type="gym", num_envs=a.envs, num_threads=a.threads, seed=a.seed,
                        episodic_life=True, reward_clip=True)
    agent = NatureAgent(envs.action_space.n)
    lr = 2.5e-4
    opt = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    T, N = a.steps, a.envs
    obs_buf = torch.zeros((T, N, 4, 84, 84), dtype=torch.uint8)
    act_buf, logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((T, N)) for _ in range(5))
    games, frames, last_row = Games(N), 0, 0.0
    obs, done = torch.from_numpy(envs.reset()[0]), torch.zeros(N)  # gym 0.26's (obs, info)
    with open(a.log, "w") as log:
        while time.time() - T_LAUNCH < a.seconds:
            opt.param_groups[0]["lr"] = lr * max(0.0, 1.0 - frames / ANNEAL_FRAMES)
            for t in range(T):
                obs_buf[t], done_buf[t] = obs, done
                with torch.no_grad():
                    logits, v = agent(obs)
                    dist = torch.distributions.Categorical(logits=logits)
                    act = dist.sample()
                act_buf[t], logp_buf[t], val_buf[t] = act, dist.log_prob(act), v
                o, r, term, trunc, info = envs.step(act.numpy())
                d = term | trunc
                games.step(info, d)
                rew_buf[t] = torch.from_numpy(r).float()
                obs, done = torch.from_numpy(o), torch.from_numpy(d).float()
                frames += N
                now = time.time()
                if now - last_row >= 1.0:
                    last_row = now
                    log.write(json.dumps({"time": now, "frames": frames, "episodes": games.count,
                                          "mean_return": games.mean()}) + "\n")
                    log.flush()
            with torch.no_grad():
                last_val = agent(obs)[1]
            adv, ret = gae(rew_buf, val_buf, done_buf, last_val, done)
            batch = (obs_buf.reshape(T * N, 4, 84, 84), act_buf.reshape(-1).long(), logp_buf.reshape(-1),
                     adv.reshape(-1), ret.reshape(-1), val_buf.reshape(-1))
            update(agent, opt, batch)
        log.write(json.dumps({"time": time.time(), "frames": frames, "episodes": games.count,
                              "mean_return": games.mean(), "end": True}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
