"""What the planner knows about a job's processes: a `tianji profile` measurement, or built-in
estimates (`default_profile`). First link of the planner's one-way flow:
profile -> cost terms (costmodel.py) -> prediction (prediction.py) -> search (search.py)
-> objective (objective.py) -> plan (plan.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from tianji.control.planner import costmodel, measured
from tianji.control.spec import TianJiJob

OPTIONAL_PROFILE_KEYS = (
    "learner_thread_scaling",
    "param_bytes",
    "allreduce_seconds",
    "ipc_bytes_per_second",
    "gpu_assumed",
    "link_bytes_per_second",
    "link_latency_s",
    "gpu_device",
    "gpu_source",
    "cpu_assumed",
    "source",
)
_TEXT_KEYS = ("gpu_device", "gpu_source", "source")


@dataclass(frozen=True)
class Profile:
    """Per-core throughput figures, from `tianji profile` or `default_profile`."""

    actor_fps_per_core: float
    learner_sps_per_core: float
    learner_sps_per_gpu: Optional[float]
    message_seconds: float
    fragment_samples: int
    bytes_per_sample: float
    # Measured by `tianji profile` (costmodel.py); None: the built-in assumptions there.
    learner_thread_scaling: Optional[dict] = None  # threads -> samples/s relative to 1 thread
    param_bytes: Optional[float] = None  # bytes of one parameter publish
    allreduce_seconds: Optional[dict] = None  # ranks -> seconds of one gradient all-reduce (gloo, loopback)
    ipc_bytes_per_second: Optional[float] = None  # loopback bandwidth seen by one fragment message
    gpu_assumed: bool = False  # learner_sps_per_gpu is a built-in guess (default_profile), not measured
    # Measured between two hosts (`tianji profile --link-measure`); None: the spec's link or ethernet-10g.
    link_bytes_per_second: Optional[float] = None
    link_latency_s: Optional[float] = None
    # Where the figures come from: the GPU learner_sps_per_gpu was measured on and the file it was
    # read from; whether the per-core figures are built-in (default_profile); the profile's file.
    gpu_device: Optional[str] = None
    gpu_source: Optional[str] = None
    cpu_assumed: bool = False
    source: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("learner_thread_scaling", "allreduce_seconds"):
            d = getattr(self, name)
            if d is None:
                continue
            if not isinstance(d, dict) or not all(
                int(k) >= 1 and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for k, v in d.items()
            ):
                raise ValueError(f"profile.{name} must map counts >= 1 to finite numbers >= 0, got {d!r}")
            object.__setattr__(self, name, {int(k): float(v) for k, v in d.items()})
        for name in ("param_bytes", "ipc_bytes_per_second", "link_bytes_per_second"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"profile.{name} must be > 0 or null, got {v!r}")
        lat = self.link_latency_s
        if lat is not None and not (math.isfinite(lat) and 0 <= lat <= 10):
            raise ValueError(f"profile.link_latency_s must be in [0, 10] seconds or null, got {lat!r}")
        if (self.link_bytes_per_second is None) != (lat is None):
            raise ValueError("profile: give both link_bytes_per_second and link_latency_s, or neither")
        for name in ("actor_fps_per_core", "learner_sps_per_core"):
            if not getattr(self, name) > 0:
                raise ValueError(f"profile.{name} must be > 0, got {getattr(self, name)!r}")
        if self.learner_sps_per_gpu is not None and not self.learner_sps_per_gpu > 0:
            raise ValueError(f"profile.learner_sps_per_gpu must be > 0 or null, got {self.learner_sps_per_gpu!r}")
        if not self.message_seconds >= 0:
            raise ValueError(f"profile.message_seconds must be >= 0, got {self.message_seconds!r}")
        if not (isinstance(self.fragment_samples, int) and self.fragment_samples >= 1):
            raise ValueError(f"profile.fragment_samples must be an integer >= 1, got {self.fragment_samples!r}")
        if not self.bytes_per_sample >= 0:
            raise ValueError(f"profile.bytes_per_sample must be >= 0, got {self.bytes_per_sample!r}")
        for name in _TEXT_KEYS:
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v.strip() and len(v) <= 300):
                raise ValueError(
                    f"profile.{name} must be a non-empty string of at most 300 characters or null, got {v!r}"
                )

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        """Build from `to_json()` output. Accepts camelCase keys, ignores unknown
        keys (profiler metadata), and unwraps a top-level {"profile": {...}}."""
        if not isinstance(d, dict):
            raise ValueError(f"profile: expected a JSON object, got {type(d).__name__}")
        if isinstance(d.get("profile"), dict):
            d = d["profile"]
        camel = {
            "".join(w.capitalize() if i else w for i, w in enumerate(k.split("_"))): k for k in cls.__dataclass_fields__
        }
        d = {camel.get(k, k): v for k, v in d.items()}
        optional = {"learner_sps_per_gpu", *OPTIONAL_PROFILE_KEYS}
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k not in optional]
        if missing:
            raise ValueError(f"profile: missing {', '.join(missing)}")
        gpu = d.get("learner_sps_per_gpu")
        if gpu is not None and d.get("gpu_device") is None:  # `tianji profile` names it in learner_gpu
            d["gpu_device"] = measured.device_name(d)
        try:
            extra: dict[str, Any] = {
                k: (d[k] if isinstance(d[k], (dict, bool)) or k in _TEXT_KEYS else float(d[k]))
                for k in OPTIONAL_PROFILE_KEYS
                if d.get(k) is not None
            }
            return cls(
                actor_fps_per_core=float(d["actor_fps_per_core"]),
                learner_sps_per_core=float(d["learner_sps_per_core"]),
                learner_sps_per_gpu=None if gpu is None else float(gpu),
                message_seconds=float(d["message_seconds"]),
                fragment_samples=int(d["fragment_samples"]),
                bytes_per_sample=float(d["bytes_per_sample"]),
                **extra,
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"profile: {e}") from None

    def to_json(self) -> dict:
        return asdict(self)

    def measured_link(self) -> Optional[tuple[float, float]]:
        """(bytes/s, one-way latency s) measured between two hosts, or None."""
        if self.link_bytes_per_second is None or self.link_latency_s is None:
            return None
        return self.link_bytes_per_second, self.link_latency_s


def load_profile(path) -> Profile:
    """A `tianji profile` JSON file (what `tianji plan/run --profile` and the operator read);
    ValueError naming the file when it is missing or malformed."""
    import json
    from pathlib import Path

    try:
        p = Profile.from_json(json.loads(Path(path).read_text()))
        where = measured.cite_path(Path(path))
        return replace(p, source=where, gpu_source=(p.gpu_source or where) if p.learner_sps_per_gpu else None)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _is_atari(job: TianJiJob) -> bool:
    s = job.spec
    return s.env.id.startswith("ALE/") or "NoFrameskip" in s.env.id or s.model.encoder == "nature_cnn"


def _builtin_gpu_speedup(job: TianJiJob) -> float:
    """The assumed GPU speed-up over one core (default_profile's docstring): never measured."""
    return 20.0 if _is_atari(job) else 3.0


def with_gpu_figure(
    job: TianJiJob, p: Profile, model: Optional[str] = None, figures: Optional[tuple] = None
) -> Profile:
    """`p` with the best GPU figure there is for `job`: its own when measured (on a GPU named like
    `model`, when given); else one measured for the job in the device results
    (measured.find_gpu_figure; `figures` default: docs/device); else the built-in speed-up over
    p's per-core learner rate, marked assumed (gpu_device: `model`, the GPU nobody measured)."""
    own = p.learner_sps_per_gpu is not None and not p.gpu_assumed
    if own and (model is None or (p.gpu_device and model.lower() in p.gpu_device.lower())):
        return p
    fig = measured.find_gpu_figure(job, model, figures)
    if fig is not None:
        return replace(
            p, learner_sps_per_gpu=fig.samples_per_s, gpu_assumed=False, gpu_device=fig.device, gpu_source=fig.cite()
        )
    return replace(
        p,
        learner_sps_per_gpu=p.learner_sps_per_core * _builtin_gpu_speedup(job),
        gpu_assumed=True,
        gpu_device=model,
        gpu_source=None,
    )


def default_profile(job: TianJiJob, gpu_figures: Optional[tuple] = None) -> Profile:
    """Built-in estimates when nothing was measured, from `tianji profile` on a shared 2-core
    AMD EPYC dev machine (2026-11), rounded down (`cpu_assumed`: not measured where the job runs).

    MLP/classic control: actor 10k frames/s/core (measured 12.3k); learner per core
    90k sample-passes/s (PPO divides by `epochs`; measured 9.2k samples/s at 10 epochs),
    DQN 20k samples/s; ~64 B/sample.
    Atari (ALE/..., Nature CNN): actor 800 frames/s/core (measured 930: CNN inference costs
    as much as the ALE step); learner per core 600 sample-passes/s (PPO / epochs; measured
    150 samples/s at 4 epochs), DQN 360; 84·84·frame_stack B/sample.
    Message cost μ = 100 µs + fragment bytes / 0.5 GB/s.
    Pong actors: 1,300 frames/s/core (measured 1,350–1,500 on this machine).
    All-reduce at 2 ranks: 0.4 ms + P / 0.5 GB/s (gloo, loopback: 0.77 ms measured for the
    270 KB CartPole DQN model).
    Learner thread curve (issue 13, measured side by side): MLP PPO 2 threads = 0.83× one
    thread, DQN 0.58×; Atari: one thread only (flat beyond it).
    GPU: the learner GPU samples/s measured for this job on a GPU machine (docs/device, or
    `gpu_figures`; with_gpu_figure) where there is one; else an assumed speed-up over one core
    (20× Atari, 3× MLP), `gpu_assumed`, which every plan using it names on its first line.
    """
    s = job.spec
    algo = s.algorithm
    F = s.env.num_envs * s.env.fragment_length
    if _is_atari(job):
        fps, ppo_pass, dqn = 1300.0, 600.0, 360.0
        bps = 84 * 84 * s.env.frame_stack + 32.0
        scaling = None
    else:
        fps, ppo_pass, dqn = 10_000.0, 90_000.0, 20_000.0
        bps = 64.0
        scaling = {2: 0.83 if algo.name == "ppo" else 0.58}
    sps = ppo_pass / algo.epochs if algo.name == "ppo" else dqn
    pbytes = costmodel.param_bytes_estimate(job)
    base = Profile(
        actor_fps_per_core=fps,
        learner_sps_per_core=sps,
        learner_sps_per_gpu=None,
        cpu_assumed=True,
        message_seconds=100e-6 + F * bps / 0.5e9,
        fragment_samples=F,
        bytes_per_sample=bps,
        learner_thread_scaling=scaling,
        param_bytes=pbytes,
        allreduce_seconds={2: 4e-4 + pbytes / 0.5e9},
    )
    return with_gpu_figure(job, base, figures=gpu_figures)
