"""User code a job names: the modules it imports, entry points, and the spaces TianJi carries.

A job never ships code. It names modules (`env.imports: [mypkg.envs]`, imported
for their side effect of registering Gymnasium ids) and entry points
(`mypkg.envs:MyEnv`, `mypkg.models:Net`) that the worker imports from what its
image installed (images/worker.Dockerfile, USER_PACKAGE). Every failure names the
spec field and the import error, so `tianji run` can refuse the job before any
process starts and a worker's log says which field to fix.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np

CARRIED_OBS_DTYPES = ("uint8", "float32", "float64")


class UserCodeError(ValueError):
    """A module or entry point named by the spec that cannot be imported or used."""


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def import_modules(modules: Iterable[str], field: str) -> None:
    """Import each listed module (they register Gymnasium ids). Raises UserCodeError naming
    `field[i]` and the import error."""
    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - ImportError, or whatever the user's module raises
            raise UserCodeError(f"{field}[{i}]: cannot import {name!r}: {_first_line(e)}") from None


def load_entry_point(entry_point: str, field: str) -> Any:
    """The object `module.path:Name` names (imports the module). Raises UserCodeError naming `field`."""
    module, _, attr = entry_point.partition(":")
    try:
        obj = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        raise UserCodeError(f"{field}: {entry_point!r}: cannot import {module!r}: {_first_line(e)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserCodeError(f"{field}: {entry_point!r}: module {module!r} has no attribute {attr!r}") from None
    return obj


def is_entry_point(env_id: str) -> bool:
    return ":" in env_id


def gym_id(cfg) -> str | gym.envs.registration.EnvSpec:
    """What gym.make_vec takes for `env.id`: the id itself (after `env.imports` registered it), or,
    for an entry point, an unregistered EnvSpec around the class it names."""
    import_modules(cfg.imports, "spec.env.imports")
    if not is_entry_point(cfg.id):
        return cfg.id
    entry = load_entry_point(cfg.id, "spec.env.id")
    if not callable(entry):
        raise UserCodeError(f"spec.env.id: {cfg.id!r} is not a class or function that makes an env")
    name = cfg.id.rpartition(":")[2].replace(".", "_")
    return gym.envs.registration.EnvSpec(id=name, entry_point=entry)


def wrapper_fns(cfg) -> list[Callable[[gym.Env], gym.Env]]:
    """`spec.env.wrappers` as what gym.make_vec applies to each env, in order (imports their modules).
    Raises UserCodeError naming `spec.env.wrappers[i].entryPoint`."""
    fns = []
    for i, w in enumerate(cfg.wrappers):
        field = f"spec.env.wrappers[{i}].entryPoint"
        wrapper = load_entry_point(w.entry_point, field)
        if not callable(wrapper):
            raise UserCodeError(f"{field}: {w.entry_point!r} is not a class or function that wraps an env")
        fns.append(functools.partial(_wrap, wrapper, dict(w.kwargs), field, w.entry_point))
    return fns


def _wrap(wrapper: Callable, kwargs: dict, field: str, entry_point: str, env: gym.Env) -> gym.Env:
    try:
        out = wrapper(env, **kwargs)
    except TypeError as e:  # most likely a keyword it does not take
        raise UserCodeError(f"{field}: {entry_point!r} cannot wrap the env with kwargs {kwargs}: "
                            f"{_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - e.g. FlattenObservation on a space it cannot flatten
        raise UserCodeError(f"{field}: {entry_point!r} cannot wrap the env: {_first_line(e)}") from None
    if not isinstance(out, gym.Env):
        raise UserCodeError(f"{field}: {entry_point!r} returned {type(out).__name__}, not a gymnasium.Env")
    return out


def cast_observation_note(space: gym.Space) -> str | None:
    """A Box of integers (not uint8: images stay bytes) is carried as float32; this says so (None:
    nothing to cast). Integers up to 2**24 are exact in float32, far beyond a grid or a count."""
    if isinstance(space, gym.spaces.Box) and space.shape and space.dtype != np.uint8 and (
            np.issubdtype(space.dtype, np.integer) or space.dtype == np.bool_):
        return (f"observations {np.dtype(space.dtype).name}{list(space.shape)} are cast to float32 "
                f"(TianJi carries {'/'.join(CARRIED_OBS_DTYPES)} arrays)")
    return None


def carried_observation_problem(space: gym.Space) -> str | None:
    """Why an observation space cannot travel as one fixed-shape array per step (None if it can)."""
    if not isinstance(space, gym.spaces.Box):
        return (f"observation space {space} is not a Box: Dict, Tuple, Text, Graph and other structured spaces "
                "are not carried (flatten it: spec.env.wrappers: [{entryPoint: gymnasium.wrappers:"
                "FlattenObservation}])")
    if not space.shape or np.dtype(space.dtype).name not in CARRIED_OBS_DTYPES:
        return (f"observation space {space}: observations must be a fixed-shape "
                f"{'/'.join(CARRIED_OBS_DTYPES)} array")
    return None
