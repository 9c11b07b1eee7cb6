"""Send each stacked frame once: fragments carry the newest frame per step, buffers rebuild stacks.

An Atari observation is a stack of the last S frames, so consecutive
observations of one env share S-1 frames:

    obs[t][:-1] == obs[t-1][1:]          (the stack shifted by one)

except after a reset (a fresh, zero-padded stack). The actor sends

    frames    [T, N, H, W]    obs[t][-1] for every step,
    key       [T, N] bool     True where obs[t][:-1] != obs[t-1][1:] (always at t = 0),
    keystacks [K, S-1, H, W]  obs[t][:-1] at the K key positions, in (t, n) order,

and the buffer rebuilds obs exactly. The rule is checked on the data, not
assumed from the env's reset semantics, so it is exact for any stacking
wrapper. Bytes per frame drop from S·H·W to about H·W (4x for Pong).
"""
from __future__ import annotations

import numpy as np

from tianji.runtime.wire import WireError

FIELDS = ("frames", "key", "keystacks")  # replace "obs" in a compressed fragment


def compress(obs: np.ndarray) -> dict[str, np.ndarray]:
    """[T, N, S, H, W] stacks → frames/key/keystacks (see module docstring)."""
    if obs.ndim != 5 or obs.shape[2] < 2:
        raise ValueError(f"expected [T, N, S>=2, H, W] stacks, got {obs.shape}")
    T, N = obs.shape[:2]
    key = np.ones((T, N), dtype=bool)
    if T > 1:
        same = (obs[1:, :, :-1] == obs[:-1, :, 1:]).reshape(T - 1, N, -1).all(-1)
        key[1:] = ~same
    return {"frames": np.ascontiguousarray(obs[:, :, -1]), "key": key,
            "keystacks": np.ascontiguousarray(obs[:, :, :-1][key])}


def expand(frames: np.ndarray, key: np.ndarray, keystacks: np.ndarray, stack: int) -> np.ndarray:
    """Inverse of `compress`; validates shapes (WireError) since the input crossed a socket."""
    if frames.ndim != 4 or key.shape != frames.shape[:2] or key.dtype != bool:
        raise WireError("shape", f"frames {list(frames.shape)} / key {list(key.shape)}")
    T, N, H, W = frames.shape
    if T and not key[0].all():
        raise WireError("value", "the first step of a fragment must be a key stack")
    k = int(key.sum())
    if keystacks.shape != (k, stack - 1, H, W) or keystacks.dtype != frames.dtype:
        raise WireError("shape", f"keystacks {list(keystacks.shape)}, expected [{k}, {stack - 1}, {H}, {W}]")
    obs = np.empty((T, N, stack, H, W), dtype=frames.dtype)
    obs[:, :, -1] = frames
    pos = np.cumsum(key.reshape(-1)).reshape(T, N) - 1  # index into keystacks for key positions
    for t in range(T):
        kt = key[t]
        if kt.any():
            obs[t, kt, :-1] = keystacks[pos[t, kt]]
        if t and (~kt).any():
            obs[t, ~kt, :-1] = obs[t - 1, ~kt, 1:]
    return obs
