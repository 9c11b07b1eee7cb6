"""Vectorised Gymnasium environments for actors.

Classic-control ids with a native vector implementation (CartPole) use it:
one numpy step for all envs, no per-env Python loop. Atari ids go through
`tianji.envs.atari`. Vector envs use Gymnasium's NEXT_STEP autoreset: the step
after a `done` returns the reset observation and ignores its action, so the
actor marks that step invalid (see roles/actor.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.wrappers.vector import DtypeObservation

from tianji.control.spec import EnvConfig, EnvSpaces
from tianji.control.spec.userenv import missing_spaces
from tianji.envs.custom import UserCodeError, carried_observation_problem, cast_observation_note, gym_id, wrapper_fns

log = logging.getLogger(__name__)


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


ATARI_KWARGS = "spec.env.kwargs: Atari ids take frameStack, episodicLife and clipRewards, not kwargs"
ATARI_WRAPPERS = ("spec.env.wrappers: Atari ids are wrapped by TianJi's Atari maker (frameStack, episodicLife, "
                  "clipRewards), not by env.wrappers")


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def atari_problem(cfg: EnvConfig) -> str | None:
    """The Atari maker sets its own kwargs (frameskip, repeat_action_probability) and wrappers: a
    job's are refused, not silently ignored."""
    if is_atari(cfg.id) and cfg.kwargs:
        return ATARI_KWARGS
    if is_atari(cfg.id) and cfg.wrappers:
        return ATARI_WRAPPERS
    return None


def make_vec_env(cfg: EnvConfig, num_envs: int | None = None, halves: bool = False,
                 note: Callable[[str], None] = log.info) -> gym.vector.VectorEnv:
    """`halves`: Atari (native backend) as two halves an actor steps double-buffered (envs/split.py).
    `note` hears what TianJi changed about the env (integer observations cast to float32)."""
    n = num_envs or cfg.num_envs
    if is_atari(cfg.id):
        if (problem := atari_problem(cfg)) is not None:
            raise ValueError(problem)
        from tianji.envs.atari import make_atari_vec

        return make_atari_vec(cfg, n, halves=halves)
    target, spec, wrappers = _resolve(cfg)
    mode = "vector_entry_point" if _native(spec, wrappers) else "sync"
    env = gym.make_vec(target, num_envs=n, vectorization_mode=mode, wrappers=wrappers or None, **cfg.kwargs)
    if (cast := cast_observation_note(env.single_observation_space)) is not None:
        note(f"spec.env.id {cfg.id!r}: {cast}")
        env = DtypeObservation(env, np.float32)
    return env


def _resolve(cfg: EnvConfig):
    """The Gymnasium target (an id, or an EnvSpec for an entry point), its EnvSpec and the job's wrappers."""
    target = gym_id(cfg)  # imports env.imports; an entry point becomes an EnvSpec
    wrappers = wrapper_fns(cfg)
    try:
        spec = gym.spec(target) if isinstance(target, str) else target
    except gym.error.Error as e:
        raise ValueError(f"env.id {cfg.id!r}: {e}") from None
    return target, spec, wrappers


def _native(spec, wrappers) -> bool:
    # A native vector env (CartPole's) has no single envs to wrap: wrappers need the per-env loop.
    return spec.vector_entry_point is not None and not wrappers


def steps_natively(cfg: EnvConfig) -> bool:
    """Does make_vec_env step this env's copies in one numpy call (a native vector env, no
    wrappers)? Then a hundred copies cost little more than one; otherwise each is a Python step."""
    if is_atari(cfg.id):
        return False
    _, spec, wrappers = _resolve(cfg)
    return _native(spec, wrappers)


def env_info(env: gym.vector.VectorEnv) -> EnvInfo:
    obs = env.single_observation_space
    act = env.single_action_space
    problem = carried_observation_problem(obs)
    if problem:
        raise ValueError(problem)
    obs_info = (tuple(int(d) for d in obs.shape), np.dtype(obs.dtype).name)
    if isinstance(act, gym.spaces.Discrete):
        return EnvInfo(*obs_info, int(act.n))
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1 and act.shape[0] >= 1:
        return EnvInfo(*obs_info, 0, (int(act.shape[0]),), tuple(float(x) for x in act.low),
                       tuple(float(x) for x in act.high))
    raise ValueError(f"actions must be Discrete or a 1-D Box space, got {act}")


def spaces_of(info: EnvInfo) -> EnvSpaces:
    """The spec's declaration of what `info` describes (tianji run writes it into the run's job)."""
    big = float(np.finfo(np.float32).max)  # an unbounded Box side (the spec holds no inf): clipping is moot there
    bound = lambda xs: [min(max(x, -big), big) for x in xs]  # noqa: E731
    action = ({"shape": list(info.act_shape), "low": bound(info.act_low), "high": bound(info.act_high)}
              if info.continuous else {"n": info.n_actions})
    return EnvSpaces(observation={"shape": list(info.obs_shape), "dtype": info.obs_dtype}, action=action)


def declared_info(cfg: EnvConfig) -> EnvInfo:
    """Buffers and learners: the spaces the spec declares, without building an env. A built-in id
    with no declaration is probed as before; a user env (env.imports, an entry point) must be
    declared: its modules are imported only where envs are built."""
    if cfg.spaces is not None:
        o, a = cfg.spaces.observation, cfg.spaces.action
        if a.n is None:  # a Box
            return EnvInfo(tuple(o.shape), o.dtype, 0, tuple(a.shape), tuple(a.low), tuple(a.high))
        return EnvInfo(tuple(o.shape), o.dtype, a.n)
    problem = missing_spaces(cfg)
    if problem:
        raise ValueError(problem)
    return probe_env(cfg)


def check_declared(cfg: EnvConfig, info: EnvInfo) -> None:
    """Actors: the env built must be the env the spec declares (buffers and learners trust it)."""
    if cfg.spaces is not None and declared_info(cfg) != info:
        raise ValueError(f"spec.env.spaces declares {spaces_of(declared_info(cfg)).model_dump()} but the env "
                         f"has {spaces_of(info).model_dump()}")


def probe_env(cfg: EnvConfig, note: Callable[[str], None] = log.info) -> EnvInfo:
    env = make_vec_env(cfg, 1, note=note)
    try:
        return env_info(env)
    finally:
        env.close()


def check_env_spec(cfg: EnvConfig, source: str, algorithm: str | None = None,
                   note: Callable[[str], None] = log.info) -> EnvInfo:
    """Resolve `env.id` and check its spaces before anything starts (`tianji run`): an unknown id,
    an action space that is neither Discrete nor a 1-D Box, a continuous one for DQN, or an
    observation space without a fixed shape is a SpecError naming the file and the field. The
    operator cannot do this (it has no Gymnasium); its workers fail the same way at start."""
    from tianji.control.spec import SpecError

    if (problem := atari_problem(cfg)) is not None:
        raise SpecError(f"{source}: {problem}")
    try:
        target = None if is_atari(cfg.id) else gym_id(cfg)
        wrapper_fns(cfg)  # importable, before the env is built
    except UserCodeError as e:
        raise SpecError(f"{source}: {e}") from None
    try:
        spec = target if target is None or not isinstance(target, str) else gym.spec(target)
    except Exception as e:  # noqa: BLE001 - gymnasium's NameNotFound, VersionNotFound, ...
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} is not a registered Gymnasium environment "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    del spec
    try:
        info = probe_env(cfg, note)
    except UserCodeError as e:  # a wrapper that cannot wrap: its own field
        raise SpecError(f"{source}: {e}") from None
    except Exception as e:  # noqa: BLE001
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, TypeError) and cfg.kwargs:  # most likely a keyword the constructor does not take
            raise SpecError(f"{source}: spec.env.kwargs: {cfg.id!r} cannot be made with {cfg.kwargs}: "
                            f"TypeError: {text}") from None
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} cannot be used: "
                        f"{type(e).__name__}{': ' + extra_hint(e, text) if str(e) else ''}") from None
    if not info.obs_shape or np.dtype(info.obs_dtype).name not in ("uint8", "float32", "float64"):
        raise SpecError(f"{source}: spec.env.id: {cfg.id!r} observations {info.obs_dtype}{list(info.obs_shape)} "
                        "are not a fixed-shape uint8/float array")
    if cfg.spaces is not None and declared_info(cfg) != info:
        raise SpecError(f"{source}: spec.env.spaces: declares {spaces_of(declared_info(cfg)).model_dump()}, "
                        f"but {cfg.id!r} has {spaces_of(info).model_dump()}")
    if algorithm is not None and algorithm != "ppo" and info.continuous:
        raise SpecError(f"{source}: spec.algorithm.name: {algorithm} needs a Discrete action space, but "
                        f"{cfg.id!r} has a continuous one, {continuous_space_text(info)}; use ppo")
    return info


# Gymnasium's families that need packages TianJi does not install by default: the extra that does.
EXTRAS = {"box2d": "box2d", "mujoco": "mujoco"}


def extra_hint(e: Exception, text: str) -> str:
    """`text` (the error's first line); for Gymnasium's DependencyNotInstalled of a family TianJi has
    an extra for, what is missing and that extra instead of Gymnasium's own pip command."""
    extra = next((x for key, x in EXTRAS.items() if key in text.lower()), None)
    if type(e).__name__ != "DependencyNotInstalled" or extra is None:
        return text
    return f"{text.split(',')[0]}: install TianJi's {extra} extra, pip install -e '.[{extra}]'"


def continuous_space_text(info: EnvInfo) -> str:
    return f"Box(low={list(info.act_low)}, high={list(info.act_high)}, shape={list(info.act_shape)})"
