"""What a receiver accepts, array by array, value by value (torch-free: the buffer imports this).

`wire.decode` checks that a message is well-formed; this module checks that it
is *this job's* message: the exact set of arrays, each one's dtype and shape
against the env's spaces and the spec (numEnvs, fragmentLength, batch sizes),
actions inside the action space, booleans that are 0/1, every float finite
(observations included), log-probs and discounts in their ranges, and
policy versions inside what the learner has announced. Everything raises
WireError(reason), which the caller counts as a rejected message: nothing a
peer sends reaches storage or the weights unchecked.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from tianji.control.contracts import episodes
from tianji.control.contracts.episodes import EpisodeBounds
from tianji.runtime import framestack
from tianji.runtime.fields import BATCH, FRAGMENT, STEP_DTYPES
from tianji.runtime.wire import MAX_INT, Limits, Message, WireError

# A behaviour version may run ahead of the last version a buffer heard of (the learner publishes
# right after an update, before its next credit): by at most this many updates (version_slack).
SLACK_UPDATES = 2
# Log-probs of sampled actions: log(p) with p >= e^-50 (exp of a larger gap overflows the PPO ratio).
LOGP_MIN = -50.0
LOGP_MAX = 1e-5
MAX_CAPACITY_SPS = 1e9
# Continuous actions are stored unclipped (a Gaussian sample); an honest one stays within this many
# times the Box's largest finite bound (at least ACTION_ABS_MIN).
ACTION_BOUND_FACTOR = 100.0
ACTION_ABS_MIN = 1e3
# Normalisation statistics in the parameters (algos/normalize.py) that must be positive; the
# names are the model's attribute paths, kept here too because this module is torch-free.
POSITIVE_PARAMS = ("obs_rms.var", "obs_rms.count", "ret_rms.var", "ret_rms.count")
# Gaussian log-probs (algos/distributions.py): the density per dimension is at most that of the smallest
# std, e^-5, at its mean (5 - log sqrt(2 pi) = 4.08 nats); the floor leaves |z| <= ~9.7 at the widest std.
GAUSS_LOGP_MAX_PER_DIM = 4.1
GAUSS_LOGP_MIN_PER_DIM = -50.0
HEADER_ALLOWANCE = 64 * 1024


def ppo_batch_fragments(spec) -> int:
    """Whole fragments per PPO learner batch (the buffer concatenates them on the env axis)."""
    return max(1, spec.algorithm.batch_size // (spec.env.num_envs * spec.env.fragment_length))


def step_dtype(k: str, info) -> str:
    """dtype of a per-step array: actions are float32 for a continuous (Box) action space."""
    return "float32" if k == "actions" and info.continuous else STEP_DTYPES[k]


def step_shape(k: str, info, T: int, N: int) -> tuple:
    """[T, N] per step, [T, N, act_dim] for continuous actions."""
    return (T, N, *info.act_shape) if k == "actions" else (T, N)


def fragment_bytes(spec, info) -> int:
    """Bytes of one honest fragment (uncompressed observations): the base of every size cap."""
    T, N = spec.env.fragment_length, spec.env.num_envs
    obs = int(np.prod(info.obs_shape)) * np.dtype(info.obs_dtype).itemsize
    steps = sum(np.dtype(step_dtype(k, info)).itemsize * int(np.prod(step_shape(k, info, 1, 1)))
                for k in FRAGMENT[spec.algorithm.name] if k in STEP_DTYPES)
    return T * N * (obs + steps) + N * obs


def batch_bytes(spec, info) -> int:
    obs = int(np.prod(info.obs_shape)) * np.dtype(info.obs_dtype).itemsize
    if spec.algorithm.name == "ppo":
        return ppo_batch_fragments(spec) * (fragment_bytes(spec, info) + 8 * spec.env.num_envs)
    m = spec.algorithm.batch_size * spec.algorithm.steps_per_batch
    return m * (2 * obs + 8 + 4 + 4 + 8)


def limits_for(nbytes: int) -> Limits:
    """Wire limits for a socket whose honest messages are at most `nbytes` (2x headroom)."""
    cap = 2 * nbytes + HEADER_ALLOWANCE
    return Limits(max_frame_bytes=cap, max_total_bytes=cap)


def _exact(msg: Message, names) -> dict:
    have, want = set(msg.arrays), set(names)
    if have != want:
        raise WireError("fields", f"{msg.kind}: missing {sorted(want - have)}, unexpected {sorted(have - want)}")
    return msg.arrays


def _arr(a: dict, k: str, shape: tuple, dtype: str) -> np.ndarray:
    x = a[k]
    if tuple(x.shape) != tuple(shape):
        raise WireError("shape", f"{k} {list(x.shape)}, expected {list(shape)}")
    if x.dtype.name != dtype:
        raise WireError("dtype", f"{k} dtype {x.dtype}, expected {dtype}")
    return x


def _finite(k: str, x: np.ndarray) -> None:
    if x.dtype.kind == "f" and x.size and not np.isfinite(x).all():
        raise WireError("value", f"non-finite {k}")


def _bool(k: str, x: np.ndarray) -> None:
    if x.size and x.view(np.uint8).max() > 1:
        raise WireError("value", f"{k}: booleans must be 0 or 1")


def action_abs_max(info) -> float:
    bounds = [abs(b) for b in (*info.act_low, *info.act_high) if math.isfinite(b)]
    return max(ACTION_ABS_MIN, ACTION_BOUND_FACTOR * max(bounds, default=0.0))


def _actions(x: np.ndarray, info) -> None:
    if not x.size:
        return
    if info.continuous:
        if not np.isfinite(x).all() or np.abs(x).max() > action_abs_max(info):
            raise WireError("value", "continuous action not finite or out of range")
    elif x.min() < 0 or x.max() >= info.n_actions:
        raise WireError("value", "action out of range")


def _logp(x: np.ndarray, info) -> None:
    d = info.act_shape[0] if info.continuous else 0
    lo, hi = (GAUSS_LOGP_MIN_PER_DIM * d, GAUSS_LOGP_MAX_PER_DIM * d) if d else (LOGP_MIN, LOGP_MAX)
    if x.size and (x.min() < lo or x.max() > hi):
        raise WireError("value", "log-prob out of range")


def _versions(x, high: int) -> None:
    lo, hi = (int(np.min(x)), int(np.max(x))) if np.size(x) else (0, 0)
    if lo < 0 or hi > high:
        raise WireError("version", f"policy version {lo}..{hi} outside 0..{high}")


# The most updates a learner can honestly have made: 3 years at 100 updates a second, 500x the updates
# of a 200M-frame Atari run. A credit or a publish beyond it is refused, not believed.
MAX_POLICY_VERSION = 10 ** 10


def check_learner_version(v: int) -> None:
    """A version a learner announces (credits, parameters) is within MAX_POLICY_VERSION."""
    if not 0 <= v <= MAX_POLICY_VERSION:
        raise WireError("version", f"learner version {v} outside 0..{MAX_POLICY_VERSION}")


def version_slack(spec) -> int:
    """How far an honest behaviour version can be ahead of the learner's last credit: each credit
    carries the learner's version before the update it pays for, and the parameters published
    after that update are one update ahead (PPO: +1; DQN: +stepsPerBatch). SLACK_UPDATES of them."""
    per_update = 1 if spec.algorithm.name == "ppo" else spec.algorithm.steps_per_batch
    return SLACK_UPDATES * per_update


def check_policy_version(v: int, learner_high: int, slack: int) -> None:
    """A behaviour version can't be negative or ahead of what the learner has announced (+ slack)."""
    _versions(np.asarray([v]), learner_high + slack)


def check_fragment(msg: Message, spec, info) -> dict:
    """An actor's fragment against the job: returns {name: array} with `obs` rebuilt if it came
    frame-compressed (framestack.py). Raises WireError."""
    algo = spec.algorithm.name
    fields = FRAGMENT[algo]
    T, N = spec.env.fragment_length, spec.env.num_envs
    a = msg.arrays
    if "frames" in a:
        if not (info.is_image and info.obs_shape[0] > 1):
            raise WireError("fields", "frame-compressed fragment for an env without stacked frames")
        a = _exact(msg, [k for k in fields if k != "obs"] + list(framestack.FIELDS))
        S, H, W = info.obs_shape
        _arr(a, "frames", (T, N, H, W), info.obs_dtype)  # checks shape and dtype
        key = _arr(a, "key", (T, N), "bool")
        _bool("key", key)
        ks = a["keystacks"]
        if ks.ndim != 4 or ks.shape[0] > T * N:
            raise WireError("shape", f"keystacks {list(ks.shape)}")
        a = dict(a)
        a["obs"] = framestack.expand(a.pop("frames"), a.pop("key"), a.pop("keystacks"), S)
    else:
        a = _exact(msg, fields)
    obs = _arr(a, "obs", (T, N, *info.obs_shape), info.obs_dtype)
    _finite("obs", obs)
    last = _arr(a, "last_obs", (N, *info.obs_shape), info.obs_dtype)
    _finite("last_obs", last)
    for k in fields:
        if k in ("obs", "last_obs"):
            continue
        x = _arr(a, k, step_shape(k, info, T, N), step_dtype(k, info))
        if x.dtype.kind == "b":
            _bool(k, x)
        _finite(k, x)
    _actions(a["actions"], info)
    if "logp" in a:
        _logp(a["logp"], info)
    if (a["terminated"] & ~a["dones"]).any():
        raise WireError("value", "terminated without done")
    return {k: a[k] for k in fields}


def check_batch(msg: Message, spec, info) -> dict:
    """A buffer's batch against the job (shapes from the spec, values as for fragments). Versions
    were bounded by the buffer (check_policy_version); here they need only be non-negative int64s."""
    algo = spec.algorithm.name
    a = _exact(msg, BATCH[algo])
    if algo == "ppo":
        T, B = spec.env.fragment_length, spec.env.num_envs * ppo_batch_fragments(spec)
        _arr(a, "obs", (T, B, *info.obs_shape), info.obs_dtype)
        _arr(a, "last_obs", (B, *info.obs_shape), info.obs_dtype)
        for k in ("actions", "logp", "rewards", "dones", "terminated", "valid"):
            x = _arr(a, k, step_shape(k, info, T, B), step_dtype(k, info))
            if x.dtype.kind == "b":
                _bool(k, x)
        _logp(a["logp"], info)
        if not a["valid"].any():
            raise WireError("value", "batch without a valid step")
        _arr(a, "versions", (B,), "int64")
    else:
        M = spec.algorithm.batch_size * spec.algorithm.steps_per_batch
        _arr(a, "obs", (M, *info.obs_shape), info.obs_dtype)
        _arr(a, "next_obs", (M, *info.obs_shape), info.obs_dtype)
        _arr(a, "actions", (M,), "int64")
        _arr(a, "returns", (M,), "float32")
        d = _arr(a, "discounts", (M,), "float32")
        _arr(a, "versions", (M,), "int64")
        if d.size and not (np.isfinite(d).all() and d.min() >= 0.0 and d.max() <= 1.0):
            raise WireError("value", "discount outside [0, 1]")
    for k, x in a.items():
        _finite(k, x)
    _actions(a["actions"], info)
    _versions(a["versions"], MAX_INT)
    return a


def check_capacity(cap) -> Optional[float]:
    """The learner's advertised capacity (samples/s): a finite positive number under a sane cap, or None."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) \
            or cap <= 0 or cap > MAX_CAPACITY_SPS:
        raise WireError("meta", f"capacity_sps {cap!r}")
    return float(cap)


def check_params(msg: Message) -> None:
    """Every array finite; normalisation variances and counts positive (an actor divides by them)."""
    for k, x in msg.arrays.items():
        _finite(k, x)
        if k in POSITIVE_PARAMS and x.size and not x.min() > 0:
            raise WireError("value", f"{k} must be positive")


MAX_FEEDBACK = 1 << 40  # samples or fragments a buffer can honestly have seen between two batches
FEEDBACK_KEYS = ("received", "dropped", "fragments")
MIN_HEADROOM, MAX_HEADROOM = 0.1, 10.0
MAX_FRAMES = 1 << 53  # global frames: far beyond any run, still exact as a float


def _count(v, what: str, hi: int) -> int:
    if type(v) is not int or not 0 <= v <= hi:
        raise WireError("meta", f"{what} {v!r}")
    return v


def check_feedback(meta: dict) -> None:
    """A batch's pacing feedback (counts since the buffer's previous batch): exact keys, bounded ints.
    (Dropped may exceed received: a fragment received before the previous batch can age out after it.)
    Raises WireError."""
    extra = set(meta) - {"buffer", *FEEDBACK_KEYS}
    if extra:
        raise WireError("meta", f"unexpected batch meta {sorted(extra)}")
    for k in FEEDBACK_KEYS:
        _count(meta.get(k, 0), k, MAX_FEEDBACK)


def check_headroom(h) -> Optional[float]:
    """The pacing headroom a learner advertises: a finite number in [MIN_HEADROOM, MAX_HEADROOM], or None."""
    if h is None:
        return None
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h) \
            or not MIN_HEADROOM <= h <= MAX_HEADROOM:
        raise WireError("meta", f"headroom {h!r}")
    return float(h)


def check_frames(v) -> Optional[int]:
    """The global frame count a learner publishes with its parameters: a non-negative int, or None."""
    return None if v is None else _count(v, "frames", MAX_FRAMES)


# ------------------------------------------------------------------ episodes an env can produce
def episode_bounds(cfg) -> EpisodeBounds:
    """The bounds an env declares: its time limit (EnvSpec.max_episode_steps, or a max_episode_steps
    kwarg) and its per-step reward range (the env class's `reward_range`, else BUILTIN_REWARDS for
    a built-in with default kwargs), each field overridden by spec.env.episodeBounds. Nothing
    looked up for Atari or envs with wrappers (they may reshape rewards and time), nor for what
    cannot be looked up."""
    from tianji.envs import is_atari

    if is_atari(cfg.id) or cfg.wrappers:
        return episodes.declared(cfg)
    try:
        import gymnasium as gym

        from tianji.envs.custom import gym_id

        target = gym_id(cfg)
        spec = gym.spec(target) if isinstance(target, str) else target
    except Exception:  # noqa: BLE001 - an unknown env: no bounds, not an error here
        return episodes.declared(cfg)
    steps = cfg.kwargs.get("max_episode_steps", spec.max_episode_steps)
    steps = int(steps) if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None
    low = high = None
    try:
        creator = gym.envs.registration.load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) \
            else spec.entry_point
        declared = getattr(creator, "reward_range", None)
    except Exception:  # noqa: BLE001
        declared = None
    if declared is not None and len(declared) == 2:
        low, high = (float(x) if math.isfinite(float(x)) else None for x in declared)
    elif not cfg.kwargs and spec.id in episodes.BUILTIN:
        _, low, high = episodes.BUILTIN[spec.id]
    return EpisodeBounds(steps, low, high).merged(episodes.declared(cfg))
