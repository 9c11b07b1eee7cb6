"""A Nature CNN policy's input preprocessing, taken out of its ONNX graph and done in numpy.

In the graph, a Pong policy's uint8 frames go through one ONNX Runtime kernel per element-wise
step over the whole [B, 4, 84, 84] batch: Cast and Div (DQN) or Cast, Sub, Div and Clip (PPO's
per-pixel normaliser). numpy's in-place passes over one reused buffer cost less, and the 1/255 of
a DQN needs none: 2-5 µs per Pong frame of a 150-180 µs forward (docs/benchmarks.md, "ONNX
Runtime's input stage"). Here the exported graph starts at the first convolution and takes
float32; `InputStage.apply` fills the buffer:

* `pixels` (a NatureCNN that scales by 1/255 inside): a cast; the 1/255 rides in the first
  convolution's weights (`folded`, divided at every snapshot), conv(x, W/255) = conv(x/255, W) up to
  float32 rounding (the session's agreement check holds it to 1e-5).
* `standardize` (ActorCritic's observation normaliser): (x - mean) / sqrt(var + eps), clipped, with
  the version's statistics, the same float32 operations in the same order as
  RunningMeanStd.normalize, so the values are torch's bit for bit.

`lift` recognises TianJi's own two Nature CNN models and nothing else: a user's model (and every
MLP) is exported whole, its graph taking the observation as it is.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import numpy as np
from torch import nn

PIXEL_SCALE = np.float32(255.0)
MEAN, STD = "tianji.input.mean", "tianji.input.std"  # a snapshot's statistics, beside its weights


@dataclass(frozen=True)
class InputStage:
    kind: str  # "pixels" | "standardize"
    folded: tuple[str, ...] = ()  # pixels: the state keys of the weights that carry the 1/255
    rms: str = ""  # standardize: the state-key prefix of the normaliser
    eps: float = 0.0
    clip: float = 0.0

    def snapshot(self, state: dict, weights: dict[str, np.ndarray], keys: dict[str, str]) -> None:
        """Complete a version's `weights` (initializer name -> array, copies) from the model's `state`."""
        if self.kind == "pixels":
            for name, key in keys.items():
                if key in self.folded:
                    np.divide(weights[name], PIXEL_SCALE, out=weights[name])
            return
        var = state[f"{self.rms}.var"].detach().cpu().numpy()
        weights[MEAN] = state[f"{self.rms}.mean"].detach().cpu().numpy().astype(np.float32)
        weights[STD] = np.sqrt(var + self.eps).astype(np.float32)  # as RunningMeanStd._float32_stats

    def apply(self, obs: np.ndarray, stats: Optional[tuple[np.ndarray, np.ndarray]],
              scratch: Optional[dict] = None) -> np.ndarray:
        """The graph's float32 input for `obs`, in `scratch`'s buffer of that shape (one caller's:
        made on first use, then reused, as the session reads it only during its run)."""
        out = None if scratch is None else scratch.get(obs.shape)
        if out is None:
            out = np.empty(obs.shape, dtype=np.float32)
            if scratch is not None:
                scratch[obs.shape] = out
        np.copyto(out, obs, casting="safe")  # uint8 -> float32, exact
        if self.kind == "standardize":
            mean, std = stats
            np.subtract(out, mean, out=out)
            np.divide(out, std, out=out)
            np.clip(out, -self.clip, self.clip, out=out)
        return out


def _pixel_cnn(module: nn.Module, key: str) -> InputStage:
    """A NatureCNN that scales pixels itself: the twin's stops scaling (the fold takes it)."""
    module.scale = False
    return InputStage("pixels", folded=(f"{key}.net.0.weight",))


def lift(model: nn.Module, example: np.ndarray) -> tuple[nn.Module, Optional[InputStage]]:
    """A copy of `model` whose forward starts after the input stage, and the stage; (a copy, None)
    where the model is not one of TianJi's Nature CNN models on uint8 frames."""
    from tianji.algos.models import ActorCritic, NatureCNN, QNetwork

    twin = copy.deepcopy(model).eval()
    if example.dtype != np.uint8 or example.ndim != 4:
        return twin, None
    if type(twin) is QNetwork and type(twin.net[0]) is NatureCNN and twin.net[0].scale:
        return twin, _pixel_cnn(twin.net[0], "net.0")
    if type(twin) is not ActorCritic or type(twin.encoder) is not NatureCNN:
        return twin, None
    rms = twin.obs_rms
    if rms is None:
        return twin, (_pixel_cnn(twin.encoder, "encoder") if twin.encoder.scale else None)
    twin.obs_rms = None  # ActorCritic._features: the unscaled CNN on the float input
    return twin, InputStage("standardize", rms="obs_rms", eps=float(rms.eps), clip=float(rms.clip))
