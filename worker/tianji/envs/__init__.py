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


def make_vec_env(cfg: EnvConfig, num_envs: int | None = None, halves: bool = False) -> gym.vector.VectorEnv:
    """`halves`: Atari (native backend) as two halves an actor steps double-buffered (envs/split.py)."""
    n = num_envs or cfg.num_envs
    if is_atari(cfg.id):
        from tianji.envs.atari import make_atari_vec

        return make_atari_vec(cfg, n, halves=halves)
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
        raise ValueError(f"PPO and DQN here need a discrete action space, got {act}")
    if not isinstance(obs, gym.spaces.Box):
        raise ValueError(f"observations must be a Box space, got {obs}")
    return EnvInfo(tuple(int(d) for d in obs.shape), np.dtype(obs.dtype).name, int(act.n))


def probe_env(cfg: EnvConfig) -> EnvInfo:
    env = make_vec_env(cfg, 1)
    try:
        return env_info(env)
    finally:
        env.close()


def check_env_spec(cfg: EnvConfig, source: str) -> EnvInfo:
    """Resolve `env.id` and check its spaces before anything starts (`tianji run`): an unknown id,
    a continuous action space (PPO and DQN here act in Discrete spaces) or an observation space
    without a fixed shape is a SpecError naming the file and the field. The operator cannot do
    this (it has no Gymnasium); its workers fail the same way at start."""
    from tianji.control.spec import SpecError

    try:
        spec = None if is_atari(cfg.id) else gym.spec(cfg.id)
    except Exception as e:  # noqa: BLE001 - gymnasium's NameNotFound, VersionNotFound, ...
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} is not a registered Gymnasium environment "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    del spec
    try:
        info = probe_env(cfg)
    except Exception as e:  # noqa: BLE001
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} cannot be used: {text}") from None
    if not info.obs_shape or np.dtype(info.obs_dtype).name not in ("uint8", "float32", "float64"):
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} observations {info.obs_dtype}{list(info.obs_shape)} "
                        "are not a fixed-shape uint8/float array")
    return info
