"""Vectorised Gymnasium environments for actors.

Classic-control ids with a native vector implementation (CartPole) use it:
one numpy step for all envs, no per-env Python loop. Atari ids go through
`tianji.envs.atari`. Vector envs use Gymnasium's NEXT_STEP autoreset: the step
after a `done` returns the reset observation and ignores its action, so the
actor marks that step invalid (see roles/actor.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from tianji.control.spec import EnvConfig


@dataclass(frozen=True)
class EnvInfo:
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def make_vec_env(cfg: EnvConfig, num_envs: int | None = None) -> gym.vector.VectorEnv:
    n = num_envs or cfg.num_envs
    if is_atari(cfg.id):
        from tianji.envs.atari import make_atari_vec

        return make_atari_vec(cfg, n)
    try:
        spec = gym.spec(cfg.id)
    except gym.error.Error as e:
        raise ValueError(f"env.id {cfg.id!r}: {e}") from None
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    return gym.make_vec(cfg.id, num_envs=n, vectorization_mode=mode)


def env_info(env: gym.vector.VectorEnv) -> EnvInfo:
    obs = env.single_observation_space
    act = env.single_action_space
    if not isinstance(act, gym.spaces.Discrete):
        raise ValueError(f"only discrete action spaces are supported, got {act}")
    return EnvInfo(tuple(int(d) for d in obs.shape), np.dtype(obs.dtype).name, int(act.n))


def probe_env(cfg: EnvConfig) -> EnvInfo:
    env = make_vec_env(cfg, 1)
    try:
        return env_info(env)
    finally:
        env.close()
