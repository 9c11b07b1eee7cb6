"""A policy's evaluation: N episodes of its evaluation policy, a fixed count per env.

N episodes from the largest number of envs (at most eval_env_limit: 8, or 128 for an env with
a native vector implementation such as CartPole's) that divides N, the same count from each
(EpisodeQuota): 20 episodes are 4 from each of 5 envs (or 1 from each of 20 CartPoles), 7 are
7 from one. DQN acts ε-greedily (DQN_EVAL_EPSILON unless told), PPO at its mode. `tianji eval`
and the evaluator role both use it.

The checkpoint carries its job manifest, so the model and env are rebuilt
exactly; it is read with `torch.load(weights_only=True)` (checkpoint.load).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from tianji.control.spec import parse_job
from tianji.runtime import checkpoint

# ε of DQN's evaluation policy: ε-greedy at 0.05, the Atari protocol of Mnih et al. (2015)
# (later work uses 0.01-0.001; --epsilon sets it). A fully greedy Q-policy can loop forever
# in a state whose best action is a no-op. PPO is evaluated at its mode (argmax of the logits).
DQN_EVAL_EPSILON = 0.05


class EpisodeQuota:
    """A fixed number of episodes from every env: env i keeps its first `quota[i]` episodes.

    Taking the first N episodes to finish, whichever env they come from, over-represents
    short episodes (an env whose episodes are short finishes more of them in the same
    steps), which biases the mean toward what short episodes return (a crash in Pong, a
    pole that falls). Per-env quotas make the sample independent of episode length."""

    def __init__(self, episodes: int, num_envs: int):
        if episodes < 1 or num_envs < 1:
            raise ValueError("episodes and num_envs must be >= 1")
        self.quota = [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]
        self.returns: list[list[float]] = [[] for _ in range(num_envs)]
        self.lengths: list[list[int]] = [[] for _ in range(num_envs)]

    def add(self, env: int, episode_return: float, length: int = 0) -> None:
        if len(self.returns[env]) < self.quota[env]:
            self.returns[env].append(float(episode_return))
            self.lengths[env].append(int(length))

    @property
    def done(self) -> bool:
        return all(len(r) >= q for r, q in zip(self.returns, self.quota))

    def all_returns(self) -> np.ndarray:
        return np.array([x for r in self.returns for x in r])

    def all_lengths(self) -> np.ndarray:
        return np.array([x for n in self.lengths for x in n])


# Envs an evaluation plays at once: a native vector env steps all its copies in one numpy call, so
# 100 CartPole episodes on 100 envs take 0.11 s where 5 envs take 1.5 s (500 batched steps, not
# 10,000); other envs step each copy in Python and hold its memory (an ALE each), so 8.
MAX_EVAL_ENVS, MAX_NATIVE_EVAL_ENVS = 8, 128


def eval_env_limit(cfg) -> int:
    """The most envs an evaluation of env `cfg` (spec.env) plays at once."""
    from tianji.envs import steps_natively

    return MAX_NATIVE_EVAL_ENVS if steps_natively(cfg) else MAX_EVAL_ENVS


def eval_env_count(episodes: int, limit: int) -> int:
    """The most envs, at most `limit`, over which `episodes` split evenly (the same count from each)."""
    return max(n for n in range(1, max(1, min(episodes, limit)) + 1) if episodes % n == 0)


def eval_actions(scores, epsilon: float, rng: np.random.Generator):
    """argmax of `scores` ([n, actions]), each replaced by a uniform random action with probability ε."""
    actions = scores.argmax(-1).numpy()
    if epsilon > 0:
        explore = rng.random(actions.shape[0]) < epsilon
        actions[explore] = rng.integers(scores.shape[-1], size=int(explore.sum()))
    return actions


def play_episodes(model, env, info, algo: str, episodes: int, epsilon: float, seed: int,
                  should_stop=None, step_cap: Optional[int] = None) -> EpisodeQuota:
    """`episodes` episodes (a fixed count per env, EpisodeQuota) of `model`'s evaluation policy:
    argmax (PPO: the logits' mode; DQN: ε-greedy Q) or, continuous, the Gaussian's mean clipped
    to the Box (no ε: there is no argmax to replace). The envs are reset with `seed` first.
    Used by `tianji eval` and the evaluator role; `should_stop()` true ends it early (a stop
    signal), the quota then not done. `step_cap`: an episode still running after that many steps
    counts as one episode with the return it has so far, and the next `step_cap` steps of it as
    another: a policy that never ends an episode (a greedy one that loops, in an env without a
    time limit) then finishes its quota with what it earned instead of running forever."""
    import torch

    rng = np.random.default_rng(seed)
    quota = EpisodeQuota(episodes, env.num_envs)
    obs, _ = env.reset(seed=int(seed))
    ret = np.zeros(env.num_envs)
    steps = np.zeros(env.num_envs, dtype=np.int64)
    resetting = np.zeros(env.num_envs, dtype=bool)  # NEXT_STEP autoreset: the step after a done only resets
    with torch.inference_mode():
        while not quota.done and not (should_stop and should_stop()):
            x = torch.from_numpy(obs)
            scores = model.logits(x) if algo == "ppo" else model(x)
            a = (np.clip(scores.numpy(), info.act_low, info.act_high) if info.continuous
                 else eval_actions(scores, epsilon, rng))
            obs, r, term, trunc, inf = env.step(a)
            ret += r
            steps += ~resetting
            resetting = np.asarray(term | trunc)
            ended = inf.get("episode_end", term | trunc) if isinstance(inf, dict) else term | trunc
            if step_cap is not None:
                ended = np.asarray(ended) | (steps >= step_cap)
            for i in np.nonzero(ended)[0]:
                quota.add(int(i), ret[i], steps[i])
                ret[i], steps[i] = 0.0, 0
    return quota


def evaluate(ckpt_path: Path, episodes: int, seed: int, epsilon: Optional[float] = None,
             num_envs: Optional[int] = None, step_cap: Optional[int] = None) -> dict:
    """`num_envs`: the most envs to play on (None: eval_env_limit)."""
    import torch

    from tianji.algos.models import build_model
    from tianji.envs import env_info, make_vec_env

    torch.set_num_threads(1)
    state = checkpoint.load(ckpt_path)
    if "manifest" not in state:
        raise ValueError(f"{ckpt_path}: checkpoint has no job manifest")
    job = parse_job(yaml.safe_load(state["manifest"]), f"{ckpt_path}:manifest")
    algo = job.spec.algorithm.name
    eps = (DQN_EVAL_EPSILON if algo == "dqn" else 0.0) if epsilon is None else epsilon
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"--epsilon {eps} is not in [0, 1]")
    env = make_vec_env(job.spec.env, eval_env_count(episodes, num_envs or eval_env_limit(job.spec.env)))
    info = env_info(env)
    model = build_model(job.spec.algorithm, job.spec.model, info, job.spec.env.seed, job.spec.env.imports)
    model.load_state_dict(state["model"])
    model.eval()
    quota = play_episodes(model, env, info, algo, episodes, eps, seed, step_cap=step_cap)
    env.close()
    rets = quota.all_returns()
    return {"checkpoint": str(ckpt_path), "job": job.name, "env": job.spec.env.id,
            "policy_version": int(state["policy_version"]), "episodes": int(rets.size), "epsilon": eps,
            "episodes_per_env": [len(r) for r in quota.returns],
            "mean_return": float(rets.mean()), "std_return": float(rets.std()),
            "min_return": float(rets.min()), "max_return": float(rets.max()),
            "mean_length": float(quota.all_lengths().mean())}
