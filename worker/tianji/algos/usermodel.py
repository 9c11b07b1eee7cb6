"""A user's torch module as the policy (`spec.model.entryPoint: mypkg.models:Net`).

Constructor contract, the same in every role:

    Net(observation_space: gymnasium.spaces.Box, action_space: gymnasium.spaces.Discrete,
        config: dict)          # config = spec.model.config (plain data)

Forward contract, the built-ins' (tianji.algos.models):

    PPO  forward(obs) -> (logits [B, n], value [B]);  logits(obs) -> logits [B, n]
    DQN  forward(obs) -> q-values [B, n]

`obs` is the env's batch as a tensor ([B, *shape], the env's dtype: uint8 images
stay uint8). Only the module's state_dict travels (tianji.algos.models.state_arrays),
never code: every process imports the class from its own image, and only from a
package the job lists (env.imports or model.imports). Every role seeds torch the same
way before building it, so version 0 is the same everywhere.
"""
from __future__ import annotations

from collections.abc import Iterable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from tianji.control.spec import ModelConfig, import_allowed
from tianji.envs import EnvInfo
from tianji.envs.custom import UserCodeError, load_entry_point

PROBE_BATCH = 2


def spaces_for(info: EnvInfo) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
    dtype = np.dtype(info.obs_dtype)
    low, high = (0, 255) if dtype == np.uint8 else (-np.inf, np.inf)
    return gym.spaces.Box(low, high, info.obs_shape, dtype), gym.spaces.Discrete(info.n_actions)


def load_class(cfg: ModelConfig, allowed: Iterable[str]) -> type:
    """The class `cfg.entry_point` names, imported only if its module is in `allowed`."""
    module = cfg.entry_point.split(":", 1)[0]
    if not import_allowed(module, (*allowed, *cfg.imports)):
        raise UserCodeError(f"spec.model.entryPoint: module {module!r} is not in a package listed in env.imports "
                            "or model.imports")
    cls = load_entry_point(cfg.entry_point, "spec.model.entryPoint")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserCodeError(f"spec.model.entryPoint: {cfg.entry_point!r} is not a torch.nn.Module subclass")
    return cls


def _check_outputs(model: nn.Module, algorithm: str, info: EnvInfo, name: str) -> None:
    """One forward pass on zeros: a model that breaks the contract fails at build, naming what is wrong."""
    obs = torch.zeros((PROBE_BATCH, *info.obs_shape), dtype=getattr(torch, info.obs_dtype))
    want = (PROBE_BATCH, info.n_actions)
    with torch.no_grad():
        if algorithm == "ppo":
            if not callable(getattr(model, "logits", None)):
                raise UserCodeError(f"spec.model.entryPoint: {name} has no logits(obs) method (PPO needs it)")
            out = model(obs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise UserCodeError(f"spec.model.entryPoint: {name}.forward must return (logits, value) for PPO")
            shapes = {"forward logits": (out[0], want), "value": (out[1], (PROBE_BATCH,)),
                      "logits()": (model.logits(obs), want)}
        else:
            shapes = {"q-values": (model(obs), want)}
    for what, (t, shape) in shapes.items():
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise UserCodeError(f"spec.model.entryPoint: {name} {what}: expected shape {list(shape)}, got {got}")


def build_user_model(algorithm: str, cfg: ModelConfig, info: EnvInfo, allowed: Iterable[str]) -> nn.Module:
    cls = load_class(cfg, allowed)
    obs_space, action_space = spaces_for(info)
    try:
        model = cls(obs_space, action_space, dict(cfg.config))
    except Exception as e:  # noqa: BLE001 - the user's constructor
        raise UserCodeError(f"spec.model.entryPoint: {cfg.entry_point}(observation_space, action_space, config) "
                            f"failed: {type(e).__name__}: {e}") from None
    _check_outputs(model, algorithm, info, cls.__name__)
    return model
