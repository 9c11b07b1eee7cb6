"""What a user env may not send on: non-finite observations or rewards.

A fragment is trained on whole ([T, N] steps, GAE and n-step returns run across
them), so a fragment holding any NaN/inf observation or reward (raw, before
clipping) is dropped at the actor, counted (samples_dropped_total{reason="env_nonfinite"})
and never sent. If the envs' current observations are themselves non-finite, the
actor resets its envs: otherwise every later fragment would start from them.
"""
from __future__ import annotations

import numpy as np

DROP_REASON = "env_nonfinite"


def _bad(a: np.ndarray) -> np.ndarray:
    """Per-leading-index mask of non-finite entries (integer arrays cannot hold any)."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating):
        return np.zeros(a.shape[:2] if a.ndim >= 2 else a.shape[:1], dtype=bool)
    finite = np.isfinite(a)
    return ~finite.reshape(*a.shape[:2], -1).all(-1) if a.ndim > 2 else ~finite


def nonfinite_steps(fragment: dict, last_obs: np.ndarray) -> int:
    """Steps (t, env) whose observation or reward is not finite, plus envs whose last observation is not."""
    steps = _bad(fragment["obs"]) | _bad(fragment["rewards"])
    lo = np.asarray(last_obs)
    last = (~np.isfinite(lo).reshape(len(lo), -1).all(-1)) if np.issubdtype(lo.dtype, np.floating) else \
        np.zeros(len(lo), dtype=bool)
    return int(steps.sum() + last.sum())


def obs_finite(obs: np.ndarray) -> bool:
    obs = np.asarray(obs)
    return not np.issubdtype(obs.dtype, np.floating) or bool(np.isfinite(obs).all())
