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
    n_actions: int  # Discrete: the count; 0 for a continuous (Box) action space
    act_shape: tuple[int, ...] = ()  # Box: (act_dim,)
    act_low: tuple[float, ...] = ()
    act_high: tuple[float, ...] = ()

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def continuous(self) -> bool:
        return bool(self.act_shape)


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
    if not isinstance(obs, gym.spaces.Box):
        raise ValueError(f"observations must be a Box space, got {obs}")
    obs_info = (tuple(int(d) for d in obs.shape), np.dtype(obs.dtype).name)
    if isinstance(act, gym.spaces.Discrete):
        return EnvInfo(*obs_info, int(act.n))
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1 and act.shape[0] >= 1:
        return EnvInfo(*obs_info, 0, (int(act.shape[0]),), tuple(float(x) for x in act.low),
                       tuple(float(x) for x in act.high))
    raise ValueError(f"actions must be Discrete or a 1-D Box space, got {act}")


def probe_env(cfg: EnvConfig) -> EnvInfo:
    env = make_vec_env(cfg, 1)
    try:
        return env_info(env)
    finally:
        env.close()


def check_env_spec(cfg: EnvConfig, source: str, algorithm: str | None = None) -> EnvInfo:
    """Resolve `env.id` and check its spaces before anything starts (`tianji run`): an unknown id,
    an action space that is neither Discrete nor a 1-D Box, a continuous one for DQN, or an
    observation space without a fixed shape is a SpecError naming the file and the field. The
    operator cannot do this (it has no Gymnasium); its workers fail the same way at start."""
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
    if algorithm is not None and algorithm != "ppo" and info.continuous:
        raise SpecError(f"{source}: spec.algorithm.name: {algorithm} needs a Discrete action space, but "
                        f"{cfg.id!r} has a continuous one, {continuous_space_text(info)}; use ppo")
    return info


def continuous_space_text(info: EnvInfo) -> str:
    return f"Box(low={list(info.act_low)}, high={list(info.act_high)}, shape={list(info.act_shape)})"
