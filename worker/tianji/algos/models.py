"""Policy and value networks: MLP for vector observations, Nature-DQN CNN for Atari.

Orthogonal initialisation as in CleanRL / SB3. Every role builds the same
module from the same spec and seed, so version 0 is identical everywhere.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Optional

import numpy as np
import torch
from torch import nn

from tianji.algos.int8 import Int8NatureCNN, float32_features, vnni
from tianji.algos.int8 import ops as int8_ops
from tianji.algos.normalize import CLIP, EPS, PIXEL_CLIP, PIXEL_EPS, RunningMeanStd, enabled
from tianji.algos.onednn import FusedNatureCNN
from tianji.control.spec import ModelConfig
from tianji.envs import EnvInfo, continuous_space_text


def _init(layer: nn.Module, gain: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class NatureCNN(nn.Module):
    """Mnih et al. 2015 encoder: uint8 [B, C, 84, 84] → 512 features (scaled to [0, 1] inside,
    unless `scale` is off: the input is then already normalised, ActorCritic's obs_rms)."""

    # Training on a CPU: oneDNN's convolutions run forward + backward ~1.25x faster on channels-last
    # input (bench/learner_step.py); inference at an actor's batch sizes is faster as it is, so only a
    # step that builds a graph converts. Same function: only the memory layout changes.
    channels_last_training = True

    def __init__(self, in_channels: int, scale: bool = True):
        super().__init__()
        self.scale = scale
        self.net = nn.Sequential(
            _init(nn.Conv2d(in_channels, 32, 8, stride=4)), nn.ReLU(),
            _init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            _init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            _init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.out_dim = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # uint8 → float32 then an in-place divide: one [B, C, 84, 84] float temporary, not two (same values)
        if self.scale:
            x = x.float().div_(255.0) if x.dtype == torch.uint8 else x / 255.0
        if self.channels_last_training and torch.is_grad_enabled() and x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)


def mlp(in_dim: int, hidden: list[int], act: str, out_dim: int, out_gain: float) -> nn.Sequential:
    Act = nn.Tanh if act == "tanh" else nn.ReLU
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [_init(nn.Linear(d, h)), Act()]
        d = h
    layers.append(_init(nn.Linear(d, out_dim), out_gain))
    return nn.Sequential(*layers)


def _use_cnn(cfg: ModelConfig, info: EnvInfo) -> bool:
    return cfg.encoder == "nature_cnn" or (cfg.encoder == "auto" and info.is_image)


class ActorCritic(nn.Module):
    """Separate policy and value heads (shared CNN trunk for images). For a Box action space the
    policy head outputs the Gaussian's mean and `log_std` is a state-independent parameter
    (algos/distributions.py). `obs_rms` / `ret_rms`: the learner's normalisation statistics
    (algos/normalize.py), present when enabled, so they travel and checkpoint with the parameters."""

    def __init__(self, cfg: ModelConfig, info: EnvInfo, normalize_obs: bool = False, normalize_rewards: bool = False,
                 init_log_std: float = 0.0):
        super().__init__()
        self.continuous = info.continuous
        eps, clip = (PIXEL_EPS, PIXEL_CLIP) if info.is_image else (EPS, CLIP)
        self.obs_rms = RunningMeanStd(info.obs_shape, eps, clip) if normalize_obs else None
        self.ret_rms = RunningMeanStd() if normalize_rewards else None
        if _use_cnn(cfg, info):
            self.encoder: nn.Module = NatureCNN(info.obs_shape[0], scale=self.obs_rms is None)
            d, hidden = self.encoder.out_dim, []
        else:
            self.encoder = nn.Flatten()
            d, hidden = int(np.prod(info.obs_shape)), list(cfg.hidden)
        self.pi = mlp(d, hidden, cfg.activation, info.act_shape[0] if self.continuous else info.n_actions, 0.01)
        self.vf = mlp(d, hidden, cfg.activation, 1, 1.0)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full(info.act_shape, float(init_log_std)))

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_rms is not None:
            if getattr(self.encoder, "normalizes", False):  # the int8 copy's CNN: fused into its input
                return self.encoder(obs, self.obs_rms)
            return self.encoder(self.obs_rms.normalize(obs))
        return self.encoder(obs if obs.dtype == torch.uint8 else obs.float())

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self._features(obs)
        return self.pi(z), self.vf(z).squeeze(-1)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Discrete: action logits; continuous: the Gaussian's mean."""
        return self.pi(self._features(obs))


class QNetwork(nn.Module):
    def __init__(self, cfg: ModelConfig, info: EnvInfo):
        super().__init__()
        if info.continuous:
            raise ValueError(f"dqn needs a Discrete action space, got {continuous_space_text(info)}; use ppo")
        if _use_cnn(cfg, info):
            enc = NatureCNN(info.obs_shape[0])
            self.net = nn.Sequential(enc, _init(nn.Linear(enc.out_dim, info.n_actions), 1.0))
        else:
            self.net = nn.Sequential(nn.Flatten(), mlp(int(np.prod(info.obs_shape)), list(cfg.hidden),
                                                       cfg.activation, info.n_actions, 1.0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs if obs.dtype == torch.uint8 else obs.float())


def build_model(algorithm, cfg: ModelConfig, info: EnvInfo, seed: int, imports: Iterable[str] = ()) -> nn.Module:
    """`algorithm`: the spec's algorithm config (or just its name, for the defaults); `imports`:
    spec.env.imports, the modules a user model (cfg.entry_point) may come from."""
    torch.manual_seed(seed)  # same seed → same version-0 weights in every process
    name = algorithm if isinstance(algorithm, str) else algorithm.name
    if cfg.entry_point:
        from tianji.algos.usermodel import build_user_model

        return build_user_model(name, cfg, info, imports)
    if name != "ppo":
        return QNetwork(cfg, info)
    get = lambda k, d=None: d if isinstance(algorithm, str) else getattr(algorithm, k)  # noqa: E731
    return ActorCritic(cfg, info, normalize_obs=enabled(get("normalize_observations"), info),
                       normalize_rewards=enabled(get("normalize_rewards"), info),
                       init_log_std=get("init_log_std", 0.0))


class _Bf16NatureCNN(nn.Module):
    """The bf16 copy's Nature CNN. Pixels go straight to bfloat16 (0-255 are exact in it) with the
    1/255 scale folded into the first convolution's weights (`Bf16Policy.sync` folds it from the
    float32 master), and the ReLUs run in place. Autocast over the float32 module passed over the
    frames three times first (uint8 to float32, the divide, float32 to bf16): 183 against 165 µs per
    frame for Pong DQN at 8 envs on an AMD EPYC (docs/benchmarks.md). Where oneDNN's fused kernels
    run (`onednn.FusedNatureCNN`), they act, built at the first forward after each sync."""

    def __init__(self, cnn: NatureCNN):
        super().__init__()
        self.net, self.out_dim = cnn.net, cnn.out_dim  # `net`: the same state keys
        for m in self.net:
            if isinstance(m, nn.ReLU):
                m.inplace = True
        self.fused: bool = True  # False: the module path only (also once the kernels refuse)
        self._kernels: Optional[FusedNatureCNN] = None

    def weights_changed(self) -> None:
        self._kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if self.fused and self._kernels is None:
            self._kernels = FusedNatureCNN.build(self.net, x)
            self.fused = self._kernels is not None
        return self._kernels(x) if self.fused else self.net(x)


class _ActingCopy(nn.Module):
    """An actor's copy of `source` for acting, each Nature CNN swapped for `encoder(cnn)` (`_cnns`;
    `_pixel_cnns`: the state-key prefixes of those that scale pixels by 1/255 inside). The float32
    `source` stays the master copy: `sync()` after every parameter load."""

    def __init__(self, source: nn.Module, encoder, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.inner = copy.deepcopy(source).eval()
        for p in self.inner.parameters():  # buffers (normalisation statistics) stay float32
            p.requires_grad_(False)
            if dtype is not None and p.is_floating_point():
                p.data = p.data.to(dtype)
        self._cnns: list[nn.Module] = []
        self._pixel_cnns: list[str] = []
        for name, module in list(self.inner.named_modules()):
            for child_name, child in list(module.named_children()):
                if type(child) is NatureCNN:
                    setattr(module, child_name, encoder(child))
                    self._cnns.append(getattr(module, child_name))
                    if child.scale:
                        self._pixel_cnns.append(".".join(filter(None, (name, child_name))))
        self._source = [source]  # a list: not registered as a submodule (no second state_dict)
        self.continuous = bool(getattr(source, "continuous", False))
        self.sync()

    @property
    def log_std(self) -> torch.Tensor:
        return self._source[0].log_std  # the Gaussian's std stays float32 (distributions.act_gaussian)

    def _loaded(self, key: str, value: torch.Tensor) -> torch.Tensor:
        """What the copy holds under `key` for the master's `value`."""
        return value

    @torch.no_grad()
    def sync(self) -> None:
        own = self.inner.state_dict()
        for k, v in self._source[0].state_dict().items():
            own[k].copy_(self._loaded(k, v))  # casts to the copy's dtype
        for m in self._cnns:
            m.weights_changed()


class Bf16Policy(_ActingCopy):
    """The actor's bfloat16 copy of `model` for acting (spec.model.actorPrecision: bfloat16).

    Parameters are held in bf16 and the forward runs under CPU autocast, so convolutions and
    matrix products use the CPU's bf16 dot products (AVX512-BF16 / AMX) without re-casting
    the weights per call; a Nature CNN runs in bf16 from its uint8 input (`_Bf16NatureCNN`);
    outputs come back as float32. Everything the actor samples and stores
    (actions, PPO's behaviour log-probs) is computed from these outputs, so the stored log-prob is
    that of the policy actually sampled from; the learner's float32 policy differs from it by the
    bf16 rounding, which PPO's ratio / V-trace's weights see as (slightly) off-policy data.
    `sync()` after every parameter load (the float32 `source` stays the master copy)."""

    def __init__(self, source: nn.Module):
        super().__init__(source, _Bf16NatureCNN, torch.bfloat16)

    @property
    def _folded(self) -> list[str]:
        """The state keys of the weights that carry the folded 1/255."""
        return [f"{prefix}.net.0.weight" for prefix in self._pixel_cnns]

    def _loaded(self, key: str, value: torch.Tensor) -> torch.Tensor:
        return value / 255.0 if key in self._folded else value

    @staticmethod
    def _float(out):
        if isinstance(out, tuple):
            return tuple(o.float() for o in out)
        return out.float()

    def forward(self, obs: torch.Tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self._float(self.inner(obs))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner.logits(obs).float()


class _Int8NatureCNN(nn.Module):
    """The int8 copy's Nature CNN: `int8.Int8NatureCNN` kernels built on the first batch after each
    sync, float32 where they cannot run. Counts the CPU time of its last build and of its forwards
    since (`Int8Policy.due`). One behind ActorCritic's observation normaliser `normalizes`: it takes
    the raw observations and the normaliser, and folds the normalisation into its input quantization."""

    def __init__(self, cnn: NatureCNN):
        super().__init__()
        self.net, self.out_dim, self.scale = cnn.net, cnn.out_dim, cnn.scale  # `net`: the same state keys
        self.normalizes = not cnn.scale  # unscaled: behind ActorCritic.obs_rms (NatureCNN's docstring)
        self.int8: bool = True  # False: float32 only (also once the kernels refuse)
        self._kernels: Optional[Int8NatureCNN] = None
        self.build_s = self.acting_s = 0.0

    def weights_changed(self) -> None:
        self._kernels, self.acting_s = None, 0.0

    def forward(self, x: torch.Tensor, rms=None) -> torch.Tensor:
        if self.int8 and self._kernels is None:
            t = time.thread_time()
            self._kernels = Int8NatureCNN.build(self.net, x, self.scale, rms)
            self.int8, self.build_s = self._kernels is not None, time.thread_time() - t
        t = time.thread_time()
        out = self._kernels(x) if self.int8 else float32_features(self.net, x, self.scale, rms)
        self.acting_s += time.thread_time() - t
        return out


class Int8Policy(_ActingCopy):
    """The actor's copy of `model` with each Nature CNN in int8 (spec.model.actorPrecision: int8,
    algos/int8.py); every other layer, and the observation normaliser, in float32. As with the bf16
    copy, actions and PPO's behaviour log-probs come from these outputs.

    A sync costs a kernel build at the next forward (quantizing and packing the CNN's weights, a
    float32 check on two rows): `due()` says whether one now keeps builds within BUILD_SHARE of the
    CNN's acting CPU time since the last, so that an actor whose learner publishes every few
    fragments (DQN) acts with a version a few behind rather than spending its CPU on builds; an
    on-policy actor syncs every version."""

    BUILD_SHARE = 0.1

    def __init__(self, source: nn.Module):
        super().__init__(source, _Int8NatureCNN)

    def due(self) -> bool:
        return all(m.acting_s * self.BUILD_SHARE >= m.build_s for m in self._cnns if m.int8)

    @property
    def refused(self) -> bool:
        """Whether a CNN's kernels refused (it acts in float32 from then on)."""
        return not all(m.int8 for m in self._cnns)

    def forward(self, obs: torch.Tensor):
        return self.inner(obs)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inner.logits(obs)


def auto_precision(algo: str, model: nn.Module) -> tuple[str, str]:
    """spec.model.actorPrecision auto before any build: int8 or float32, and why (ModelConfig's
    description). The caller still falls back to float32 where the int8 copy's first build refuses."""
    if algo != "dqn":
        return "float32", f"a {algo} actor stores behaviour log-probs, which must be the learner's policy's"
    if not any(type(m) is NatureCNN for m in model.modules()):
        return "float32", "no Nature CNN: int8 would run nothing"
    if int8_ops() is None or not vnni():
        return "float32", "no int8 kernels with 32-bit sums here (VNNI, AMX)"
    return "int8", "a DQN actor acts by the argmax of its Q-values and learns off-policy"


def actor_policy(model: nn.Module, precision: str) -> nn.Module:
    """What an actor acts with: `model` itself (float32, exact), its bf16 or its int8 copy."""
    if precision == "int8":
        return Int8Policy(model)
    return Bf16Policy(model) if precision == "bfloat16" else model


def state_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """A snapshot of the parameters for the wire. A copy, not a view: zero-copy sends leave
    later, from ZeroMQ's I/O thread, and the optimizer updates the live tensors in place."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}  # .cpu(): GPU learners


def load_arrays(model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load wire arrays into `model`; names, shapes and dtypes must match exactly."""
    own = model.state_dict()
    if set(arrays) != set(own):
        raise ValueError(f"parameter names differ: {sorted(set(arrays) ^ set(own))[:4]}")
    for k, t in own.items():
        a = arrays[k]
        if tuple(a.shape) != tuple(t.shape) or a.dtype != t.detach().cpu().numpy().dtype:
            raise ValueError(f"parameter {k}: {a.dtype}{list(a.shape)} != {t.dtype}{list(t.shape)}")
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(torch.from_numpy(np.asarray(arrays[k])))
