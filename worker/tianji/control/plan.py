"""The balance planner (paper §3.3): pure functions, no I/O.

Notation (whole job unless said otherwise)
-----------------------------------------
    M            cores the job may use; G GPUs; K nodes of C_n cores each
    g            groups; per group n_a actors, n_b buffers, n_l learners
    c_a, c_b, c_l  cores per actor / buffer / learner process; γ GPUs per learner
    f_a          actor_fps_per_core        (env + inference frames/s per core)
    s_l          learner_sps_per_core      (samples/s per core at the batch size)
    s_g          learner_sps_per_gpu       (samples/s per GPU)
    μ            message_seconds           (send+receive cost of one fragment-sized message)
    F            fragment_samples;  B batch size (samples per learner update)
    r            target replay ratio = consumed / produced (job.spec.replay_ratio;
                 DQN: e.g. 32, PPO: 1 — a fresh sample is consumed about once)

    TR_A = g·n_a·c_a·f_a                          production capacity (frames/s)
    TR_L = g·n_l·(s_L(c_l)  or  γ·s_g)            consumption capacity (samples/s);
                                                  s_L: the measured thread curve (costmodel.py)

The planner solves

    maximise  efficiency · consumed     (= minimise predicted time to target, costmodel.py;
                                         consumed ≤ min(TR_L, r·TR_A), lowered by the
                                         communication and all-reduce terms below)
    s.t.      g·(n_a·c_a + n_b·c_b + n_l·c_l) ≤ M,   g·n_l·γ ≤ G,
              every process fits on one node (first-fit packing into K nodes),
              n_a ≥ n_b ≥ n_l ≥ 1  (the spec's Topology validator),

i.e. the paper's M_L + M_A = M with production TR_A ≈ TR_L / r. It enumerates a
small grid of process sizes and group counts; for each it picks the fewest
actors that reach TR_A ≥ TR_L / r (or as many as fit). Plans whose expected
policy lag exceeds spec.maxPolicyLag are dropped when any plan meets it (the
buffer would discard their samples); among the rest, the plans within 2 % of
the best objective, it keeps the one with the fewest cores, then fewest
learners, then fewest processes.

Critical path (paper eq. 1) of one synchronous learner update (one batch of B):

    T_A = (B/r) / (TR_A / (g·n_l))     time for the actors to produce its new data
    T_L = B / (TR_L / (g·n_l))         time for the learner to consume it
    T_AR = k·A(g·n_l)                  the synchronous all-reduces of its k gradient steps
                                       (groupSync average: k·A(n_l), costmodel.group_sync_terms)
    T_P  = (1 + n_a/n_l)·P/(bw_copy·publish_every)
                                       the learner's CPU for the parameter broadcast (one
                                       serialisation, one copy per subscribed actor; bw_copy
                                       the measured loopback rate); each actor also spends
                                       P/(bw_copy·publish_every) of CPU per version taking
                                       parameters in, which lowers TR_A by that share
    T_C = max(μ·(B/r + B)/F · n_l/n_b / min(c_b, 1),  T_net)
                                       buffer time to receive those fragments and
                                       send the batch (fragment-sized units), or the
                                       busiest link's time incl. the parameter
                                       broadcast (T_net, costmodel.py)
    T   = max(T_A, T_L + T_AR + T_P, T_C)

The bottleneck (paper §3.3) is communication-bound if T_C > max(T_A, T_L + T_AR + T_P)
(messaging exceeds the time budget of the slower side) or the learner is the limit
and spends more time in all-reduce and broadcast than computing (T_AR + T_P > T_L),
else sample-bound if T_A > T_L + T_AR + T_P, else training-bound. Predicted consumption is g·n_l·B/T;
production is TR_A, capped at pace_headroom·(learner capacity)/r when actors pace.
On one shared host (`predict_on_host`, what `tianji run` gets) the roles take turns
instead (costmodel.host_turns): T = max(g·(T_A + T_learn), T_C), production = consumption/r.

Design choice (issue 13): groups synchronise by a blocking all-reduce per gradient
step and grow the effective batch with the learning rate unchanged. The objective
charges both (T_AR, and the batch factor (1 + g·n_l)/2), so for small models the
planner keeps one group and grows the learner along its measured thread curve and
the actors; it proposes more groups only where a single learner is capped and the
all-reduce is cheap beside its compute. Plans state where they extrapolate
(`Plan.extrapolated`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Optional

from tianji.control import costmodel
from tianji.control.spec import TianJiJob

# Process-size grid the planner searches (cores). Actors step envs in one
# thread, so they stay at <= 1 core; a learner gains little from intra-op
# threads beyond a few cores; a buffer is one event loop (<= 1 core useful).
ACTOR_CORES = (0.5, 1.0)
BUFFER_CORES = (0.25, 0.5, 1.0)
LEARNER_CORES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
GPU_LEARNER_CORES = 1.0  # host cores of a GPU learner (feeding and launching kernels)
BUFFER_COUNTS = (1, 2, 3, 4, 6, 8)
MAX_GROUPS, MAX_ACTORS = 1024, 4096  # spec.Topology's upper bounds
NEAR_BEST = 0.02  # plans within this fraction of the best objective are "as good"
_EPS = 1e-9

SAMPLE_BOUND = "sample-bound"
TRAINING_BOUND = "training-bound"
COMMUNICATION_BOUND = "communication-bound"


class PlanError(ValueError):
    """Inputs with no feasible plan; the message says which and why."""


# ----------------------------------------------------------------- profile
OPTIONAL_PROFILE_KEYS = ("learner_thread_scaling", "param_bytes", "allreduce_seconds", "ipc_bytes_per_second",
                         "gpu_assumed", "link_bytes_per_second", "link_latency_s")


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

    def __post_init__(self) -> None:
        for name in ("learner_thread_scaling", "allreduce_seconds"):
            d = getattr(self, name)
            if d is None:
                continue
            if not isinstance(d, dict) or not all(
                    int(k) >= 1 and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for k, v in d.items()):
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

    @classmethod
    def from_json(cls, d: dict) -> "Profile":
        """Build from `to_json()` output. Accepts camelCase keys, ignores unknown
        keys (profiler metadata), and unwraps a top-level {"profile": {...}}."""
        if not isinstance(d, dict):
            raise ValueError(f"profile: expected a JSON object, got {type(d).__name__}")
        if isinstance(d.get("profile"), dict):
            d = d["profile"]
        camel = {"".join(w.capitalize() if i else w for i, w in enumerate(k.split("_"))): k
                 for k in cls.__dataclass_fields__}
        d = {camel.get(k, k): v for k, v in d.items()}
        optional = {"learner_sps_per_gpu", *OPTIONAL_PROFILE_KEYS}
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k not in optional]
        if missing:
            raise ValueError(f"profile: missing {', '.join(missing)}")
        gpu = d.get("learner_sps_per_gpu")
        try:
            return cls(
                actor_fps_per_core=float(d["actor_fps_per_core"]),
                learner_sps_per_core=float(d["learner_sps_per_core"]),
                learner_sps_per_gpu=None if gpu is None else float(gpu),
                message_seconds=float(d["message_seconds"]),
                fragment_samples=int(d["fragment_samples"]),
                bytes_per_sample=float(d["bytes_per_sample"]),
                **{k: (d[k] if isinstance(d[k], (dict, bool)) else float(d[k])) for k in OPTIONAL_PROFILE_KEYS
                   if d.get(k) is not None},
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
        return Profile.from_json(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _is_atari(job: TianJiJob) -> bool:
    s = job.spec
    return s.env.id.startswith("ALE/") or "NoFrameskip" in s.env.id or s.model.encoder == "nature_cnn"


def default_profile(job: TianJiJob) -> Profile:
    """Built-in estimates when nothing was measured, from `tianji profile` on a shared 2-core
    AMD EPYC dev machine (2026-11), rounded down.

    MLP/classic control: actor 10k frames/s/core (measured 12.3k); learner per core
    90k sample-passes/s (PPO divides by `epochs`; measured 9.2k samples/s at 10 epochs),
    DQN 20k samples/s; ~64 B/sample.
    Atari (ALE/..., Nature CNN): actor 800 frames/s/core (measured 930: CNN inference costs
    as much as the ALE step); learner per core 600 sample-passes/s (PPO / epochs; measured
    150 samples/s at 4 epochs), DQN 360; GPU 20x; 84·84·frame_stack B/sample.
    Message cost μ = 100 µs + fragment bytes / 0.5 GB/s.
    Pong actors: 1,300 frames/s/core (measured 1,350–1,500 on this machine).
    All-reduce at 2 ranks: 0.4 ms + P / 0.5 GB/s (gloo, loopback: 0.77 ms measured for the
    270 KB CartPole DQN model).
    Learner thread curve (issue 13, measured side by side): MLP PPO 2 threads = 0.83× one
    thread, DQN 0.58×; Atari: one thread only (flat beyond it). GPU: an assumed speed-up
    (20× Atari, 3× MLP), never measured: plans using it say so (`Plan.extrapolated`);
    `tianji profile` on the GPU machine replaces it.
    """
    s = job.spec
    algo = s.algorithm
    F = s.env.num_envs * s.env.fragment_length
    if _is_atari(job):
        fps, ppo_pass, dqn, gpu_x = 1300.0, 600.0, 360.0, 20.0
        bps = 84 * 84 * s.env.frame_stack + 32.0
        scaling = None
    else:
        fps, ppo_pass, dqn, gpu_x = 10_000.0, 90_000.0, 20_000.0, 3.0
        bps = 64.0
        scaling = {2: 0.83 if algo.name == "ppo" else 0.58}
    sps = ppo_pass / algo.epochs if algo.name == "ppo" else dqn
    pbytes = costmodel.param_bytes_estimate(job)
    return Profile(
        actor_fps_per_core=fps,
        learner_sps_per_core=sps,
        learner_sps_per_gpu=sps * gpu_x,
        gpu_assumed=True,
        message_seconds=100e-6 + F * bps / 0.5e9,
        fragment_samples=F,
        bytes_per_sample=bps,
        learner_thread_scaling=scaling,
        param_bytes=pbytes,
        allreduce_seconds={2: 4e-4 + pbytes / 0.5e9},
    )


# ----------------------------------------------------------------- plan
@dataclass(frozen=True)
class RolePlan:
    """Per-process request; the same fields as spec.resources.<role>."""

    cpu: float
    memory: str
    gpu: int
    threads: int


@dataclass(frozen=True)
class Plan:
    groups: int
    actors: int  # per group
    buffers: int  # per group
    learners: int  # per group
    actor: RolePlan
    buffer: RolePlan
    learner: RolePlan
    batch_size: int
    produced_fps: float  # predicted, whole job
    consumed_sps: float  # predicted, whole job
    replay_ratio: float  # predicted consumed / produced
    expected_policy_lag: float  # learner versions
    bottleneck: str
    cpus_used: float
    gpus_used: int
    # Critical-path terms of one learner update (seconds), see the module docstring.
    sample_seconds: float = 0.0
    train_seconds: float = 0.0  # learner compute
    comm_seconds: float = 0.0  # buffer messages / link, whichever is longer
    allreduce_seconds: float = 0.0  # k all-reduces across the g·n_l learners (average mode: n_l)
    efficiency: float = 1.0  # 1 / (batch factor · lag factor), costmodel.py
    effective_sps: float = 0.0  # consumed · efficiency: what the planner maximises
    learner_threads_measured: int = 1  # the thread curve's range is 1..this
    extrapolated: tuple = ()  # terms predicted beyond what the profile measured

    def topology(self) -> dict:
        """Usable as spec.topology (keys are the same in camelCase)."""
        return {"groups": self.groups, "actors": self.actors, "buffers": self.buffers, "learners": self.learners}

    def to_json(self) -> dict:
        d = asdict(self)
        d["topology"] = self.topology()
        return d


def _threads(cpu: float) -> int:
    return max(1, int(math.floor(cpu + _EPS)))


def _pack(items: list[tuple[float, int, int]], node_cpus: list[float], node_gpus: list[int]) -> bool:
    """First-fit decreasing of (cpu, gpu, count) classes into nodes; True if all fit."""
    free_c, free_g = list(node_cpus), list(node_gpus)
    for cpu, gpu, count in sorted(items, key=lambda t: (-t[1], -t[0])):
        left = count
        for i in range(len(free_c)):
            if left == 0:
                break
            k = int((free_c[i] + _EPS) // cpu)
            if gpu:
                k = min(k, free_g[i] // gpu)
            k = min(k, left)
            free_c[i] -= k * cpu
            free_g[i] -= k * gpu
            left -= k
        if left:
            return False
    return True


def _learner_rate(p: Profile, cl: float, gl: int) -> tuple[float, bool]:
    """Samples/s of one learner: GPU figure, or the CPU thread curve (costmodel.learner_sps)."""
    if gl:
        return gl * p.learner_sps_per_gpu, False
    return costmodel.learner_sps(p.learner_sps_per_core, p.learner_thread_scaling, cl)


def _predict(job: TianJiJob, p: Profile, g: int, na: int, nb: int, nl: int,
             ca: float, cb: float, cl: float, gl: int, nodes: int = 1,
             actor_share: Optional[float] = None, learner_rate: Optional[float] = None,
             turns: int = 0) -> dict:
    """Throughput, staleness, bottleneck and efficiency of one topology (module docstrings).

    `actor_share`, `learner_rate`: what one actor's CPU share and one learner actually get on a
    shared host (predict_on_host); default: the requests c_a and s_L(c_l). `turns` = k ≥ 1:
    actors and learners take turns on one host, and so do the k synchronised groups
    (costmodel.host_turns): T = max(k·(T_A + T_learn), T_C), the learner waits out every
    actor phase (sample-bound unless communication-bound), and production is the
    consumption over r.

    Expected policy lag, in learner versions, with U = 1/T updates per second:
        U·F/(TR_A/(g·n_a))      a fragment carries the version at its start
      + (publish_every − 1)/2   actors refresh parameters every few versions
      + credit_window if training-bound (full window queued) else 1/2
      + DQN only: U·N/(2·I), the mean age of a uniform draw from a full FIFO
        replay of N = replay_capacity with I = inserts/s per buffer.
    """
    s = job.spec
    r = s.replay_ratio
    B = s.algorithm.batch_size
    F = p.fragment_samples
    tr_a = g * na * (ca if actor_share is None else actor_share) * p.actor_fps_per_core
    per_learner, beyond_curve = _learner_rate(p, cl, gl)
    per_learner = per_learner if learner_rate is None else learner_rate
    tr_l = g * nl * per_learner
    link = costmodel.link_for(s.network.link, nodes, p.ipc_bytes_per_second, p.measured_link())
    loopback = costmodel.link_for(None, 1, p.ipc_bytes_per_second)  # where all-reduce was measured
    P = p.param_bytes or costmodel.param_bytes_estimate(job)
    # groupSync (costmodel.group_sync_terms): in `average` mode only a group's learners all-reduce
    # per step, and the asynchronous cross-group averaging adds link bytes, not critical-path time.
    ranks, batch_ranks, avg_bytes = costmodel.group_sync_terms(job, g, nl, P)
    a_one, ar_extra = costmodel.allreduce_seconds(p.allreduce_seconds, ranks, P, link, loopback)
    t_a = (B / r) / (tr_a / (g * nl))
    t_l = B / per_learner
    t_ar = costmodel.gradient_steps(job) * a_one
    b_batch = p.bytes_per_sample * (2 if s.algorithm.name == "dqn" else 1)
    learner_bytes = na / nl * P / s.staleness.publish_every + B * b_batch + avg_bytes
    buffer_bytes = (B / r * p.bytes_per_sample + B * b_batch) * nl / nb
    t_net = max(learner_bytes, buffer_bytes) / link.bytes_per_s + link.latency_s
    t_msg = p.message_seconds * (B / r + B) / F * nl / nb / min(cb, 1.0)
    t_c = max(t_msg, t_net)
    # Parameter broadcast on the CPUs: the learner serialises once and copies once per
    # subscribed actor; every actor receives every publish (PUB), whether it uses it or not.
    copy = P / (p.ipc_bytes_per_second or costmodel.LOOPBACK_BYTES_PER_S) / s.staleness.publish_every
    t_pub = (1 + na / nl) * copy
    t_learn = t_l + t_ar + t_pub

    def total(t_a: float) -> float:
        return max(turns * (t_a + t_learn), t_c) if turns else max(t_a, t_learn, t_c)

    t = total(t_a)
    busy_params = min(0.95, copy / t)  # share of an actor's CPU spent taking parameters in
    if busy_params > 0.01:
        tr_a *= 1 - busy_params
        t_a = (B / r) / (tr_a / (g * nl))
        t = total(t_a)
    work = turns * (t_a + t_learn) if turns else max(t_a, t_learn)
    if t_c > work + _EPS * t or ((turns or t_learn >= t_a) and t_ar + t_pub > t_l):
        kind = COMMUNICATION_BOUND
    elif turns or t_a > t_learn * (1 + _EPS):
        kind = SAMPLE_BOUND
    else:
        kind = TRAINING_BOUND
    consumed = g * nl * B / t
    if turns:  # actors produce only in their phase: what the learners take in, nothing more
        produced = consumed / r
    elif s.staleness.pace_actors:
        # Paced actors aim at headroom x what the learners can take (their advertised capacity).
        produced = min(tr_a, s.staleness.pace_headroom * min(tr_l, consumed * t / t_learn) / r)
    else:
        produced = tr_a
    u = 1.0 / t
    lag = u * F / (produced / (g * na)) + (s.staleness.publish_every - 1) / 2
    lag += s.credit_window if kind == TRAINING_BOUND else 0.5
    if s.algorithm.name == "dqn":
        lag += u * s.algorithm.replay_capacity / (2 * produced / (g * nb))
    eff = 1.0 / (costmodel.batch_factor(batch_ranks) * costmodel.lag_factor(job, lag))
    extrapolated = tuple(x for x, flag in (
        (f"learner of {cl:g} cores beyond the measured 1..{costmodel.thread_curve(p.learner_thread_scaling)[-1][0]} "
         "threads (held flat)", beyond_curve),
        (f"all-reduce at {ranks} ranks over {link.name} (ring model)", ar_extra and ranks > 1),
        ("GPU learner throughput assumed (built-in speed-up, not measured)", bool(gl) and p.gpu_assumed)) if flag)
    return {"produced_fps": produced, "consumed_sps": consumed, "replay_ratio": consumed / produced,
            "expected_policy_lag": lag, "bottleneck": kind, "tr_a": tr_a, "tr_l": tr_l,
            "sample_seconds": t_a, "train_seconds": t_l, "comm_seconds": t_c, "allreduce_seconds": t_ar,
            "publish_seconds": t_pub,
            "net_seconds": t_net, "efficiency": eff, "effective_sps": consumed * eff,
            "learner_threads_measured": costmodel.thread_curve(p.learner_thread_scaling)[-1][0],
            "extrapolated": extrapolated}


def _make_plan(job: TianJiJob, pred: dict, g: int, na: int, nb: int, nl: int,
               ca: float, cb: float, cl: float, gl: int) -> Plan:
    res = job.spec.resources
    return Plan(
        groups=g, actors=na, buffers=nb, learners=nl,
        actor=RolePlan(ca, res.actor.memory, 0, _threads(ca)),
        buffer=RolePlan(cb, res.buffer.memory, 0, _threads(cb)),
        learner=RolePlan(cl, res.learner.memory, gl, _threads(cl)),
        batch_size=job.spec.algorithm.batch_size,
        produced_fps=pred["produced_fps"], consumed_sps=pred["consumed_sps"],
        replay_ratio=pred["replay_ratio"], expected_policy_lag=pred["expected_policy_lag"],
        bottleneck=pred["bottleneck"],
        cpus_used=round(g * (na * ca + nb * cb + nl * cl), 6), gpus_used=g * nl * gl,
        sample_seconds=pred["sample_seconds"], train_seconds=pred["train_seconds"],
        comm_seconds=pred["comm_seconds"], allreduce_seconds=pred["allreduce_seconds"],
        efficiency=pred["efficiency"], effective_sps=pred["effective_sps"],
        learner_threads_measured=pred["learner_threads_measured"], extrapolated=pred["extrapolated"],
    )


def _group_candidates(gmax: int) -> list[int]:
    """1..32, then geometric steps (x1.15) up to gmax: keeps the search small for large M."""
    out, g = [], 1
    while g <= gmax:
        out.append(g)
        g = g + 1 if g < 32 else max(g + 1, int(g * 1.15))
    if gmax >= 1 and out[-1] != gmax:
        out.append(gmax)
    return out


def plan(job: TianJiJob, cpus: float, gpus: int = 0, nodes: int = 1,
         cpus_per_node: Optional[float] = None, profile: Optional[Profile] = None) -> Plan:
    """Size `job` for M = `cpus` cores and G = `gpus` GPUs (see the module docstring).

    Preconditions (PlanError otherwise): M > 0; G ≥ 0; K = nodes ≥ 1; C_n =
    cpus_per_node > 0 (default M/K; usable cores are min(M, K·C_n)); M holds at
    least one actor + buffer + learner; a spec that asks for γ =
    resources.learner.gpu > 0 GPUs per learner gets G ≥ γ and a profile with a
    GPU figure. GPUs are spread evenly over the nodes.
    """
    if not (isinstance(cpus, (int, float)) and cpus > 0):
        raise PlanError(f"cpus must be > 0 (the total cores M the job may use), got {cpus!r}")
    if gpus < 0:
        raise PlanError(f"gpus must be >= 0, got {gpus}")
    if nodes < 1:
        raise PlanError(f"nodes must be >= 1, got {nodes}")
    if cpus_per_node is not None and not cpus_per_node > 0:
        raise PlanError(f"cpus_per_node must be > 0, got {cpus_per_node!r}")
    p = profile or default_profile(job)
    cn = float(cpus_per_node) if cpus_per_node is not None else cpus / nodes
    m = min(float(cpus), nodes * cn)
    node_cpus = [cn] * nodes
    node_gpus = [gpus // nodes + (1 if i < gpus % nodes else 0) for i in range(nodes)]

    want_gpu = job.spec.resources.learner.gpu
    if want_gpu and gpus == 0:
        raise PlanError(f"spec.resources.learner.gpu asks {want_gpu} GPU(s) per learner but no GPUs were given "
                        "(pass --gpus, or set resources.learner.gpu: 0)")
    if want_gpu and want_gpu > max(node_gpus):
        raise PlanError(f"a learner needs {want_gpu} GPU(s) but a node has at most {max(node_gpus)} "
                        f"({gpus} GPU(s) over {nodes} node(s))")
    if want_gpu and p.learner_sps_per_gpu is None:
        raise PlanError("spec.resources.learner.gpu > 0 but the profile has no GPU figure (learner_sps_per_gpu); "
                        "profile on a GPU machine or omit --profile")
    modes = [want_gpu] if want_gpu else [0] + ([1] if gpus and p.learner_sps_per_gpu is not None else [])

    a_min, b_min = min(ACTOR_CORES), min(BUFFER_CORES)
    l_min = GPU_LEARNER_CORES if want_gpu else min(LEARNER_CORES)
    need = a_min + b_min + l_min
    if m + _EPS < need:
        raise PlanError(f"{m:g} cores cannot hold one actor ({a_min:g}) + one buffer ({b_min:g}) + one learner "
                        f"({l_min:g}): need at least {need:g} cores")

    r = job.spec.replay_ratio
    cands = []  # (predicted consumption, (g, na, nb, nl, ca, cb, cl, gl), prediction)
    for gl in modes:
        lcores = (GPU_LEARNER_CORES,) if gl else LEARNER_CORES
        for cl in lcores:
            if cl > cn + _EPS:
                continue
            per_learner = _learner_rate(p, cl, gl)[0]
            for ca in ACTOR_CORES:
                for cb in BUFFER_CORES:
                    if max(ca, cb) > cn + _EPS:
                        continue
                    gmax = min(MAX_GROUPS, int((m + _EPS) // (cl + ca + cb)))
                    if gl:
                        gmax = min(gmax, gpus // gl)
                    for g in _group_candidates(gmax):
                        for nb in BUFFER_COUNTS:
                            left = m - g * (cl + nb * cb)
                            na_fit = min(MAX_ACTORS, int((left + _EPS) // (g * ca)))
                            if na_fit < nb:
                                break
                            na_need = actors_for(per_learner, r, ca * p.actor_fps_per_core)
                            na = max(nb, min(na_fit, na_need))
                            na = _max_packable(na, nb, g, ca, cb, cl, gl, node_cpus, node_gpus)
                            if na is None:
                                continue
                            pred = _predict(job, p, g, na, nb, 1, ca, cb, cl, gl, nodes)
                            cands.append((pred["effective_sps"], (g, na, nb, 1, ca, cb, cl, gl), pred))
    if not cands:
        raise PlanError(f"no topology fits {m:g} cores on {nodes} node(s) of {cn:g} cores"
                        + (f" with {gpus} GPU(s)" if gpus else ""))
    # Staleness first: samples past maxPolicyLag are dropped, so a plan beyond it
    # does not deliver its throughput. Fall back to all plans if none meets it.
    max_lag = job.spec.max_policy_lag
    if max_lag is not None:
        cands = [c for c in cands if c[2]["expected_policy_lag"] <= max_lag] or cands
    # Objective: predicted time to target, i.e. consumption (min(TR_L, r·TR_A) degraded by
    # communication and all-reduce) times efficiency (batch growth, lag: costmodel.py).
    best = max(c[0] for c in cands)
    pool = [c for c in cands if c[0] >= (1 - NEAR_BEST) * best]

    def cost(c):
        g, na, nb, nl, ca, cb, cl, gl = c[1]
        return (round(g * (na * ca + nb * cb + nl * cl), 6), g * nl * gl, g * nl, g * (na + nb + nl), -c[0])

    _, shape, pred = min(pool, key=cost)
    return _make_plan(job, pred, *shape)


def _max_packable(na: int, nb: int, g: int, ca: float, cb: float, cl: float, gl: int,
                  node_cpus: list[float], node_gpus: list[int]) -> Optional[int]:
    """Largest n ≤ na (n ≥ nb) whose processes pack onto the nodes, or None."""
    def fits(n: int) -> bool:
        return _pack([(cl, gl, g), (ca, 0, g * n), (cb, 0, g * nb)], node_cpus, node_gpus)

    if fits(na):
        return na
    lo, hi = nb, na - 1
    if lo > hi or not fits(lo):
        return None
    while lo < hi:  # invariant: fits(lo)
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_for_job(job: TianJiJob, profile: Optional[Profile] = None) -> Plan:
    """The plan a launcher or the operator uses for `job`.

    topology.auto: plan(job, cpus = resources.cpus or 2, gpus, nodes, cpus_per_node).
    Otherwise the explicit topology and per-role requests (resources.actor/buffer/
    learner) are described as a Plan with the same predictions. PlanError if the
    explicit topology has more learners than resources.cpus cores, needs more
    cores than resources.cpus, or more GPUs than resources.gpus (when set), or a
    process larger than resources.cpusPerNode. With spec.evaluation, the evaluator's
    resources.evaluator.cpu is taken off resources.cpus first (auto) or counted in (explicit).
    """
    s = job.spec
    res = s.resources
    # spec.evaluation's evaluator takes resources.evaluator.cpu of the cores, not the planner's to give
    evaluator = res.evaluator.cpu if s.evaluation.enabled else 0.0
    if s.topology.auto:
        cpus = (res.cpus or 2) - evaluator
        if cpus <= 0:
            raise PlanError(f"resources.evaluator.cpu ({evaluator:g}) leaves no cores of resources.cpus "
                            f"({res.cpus or 2:g}) for training")
        return plan(job, cpus=cpus, gpus=res.gpus, nodes=res.nodes,
                    cpus_per_node=res.cpus_per_node, profile=profile)
    p = profile or default_profile(job)
    t = s.topology
    g, na, nb, nl = t.groups, t.actors, t.buffers, t.learners
    ca, cb, cl, gl = res.actor.cpu, res.buffer.cpu, res.learner.cpu, res.learner.gpu
    used = g * (na * ca + nb * cb + nl * cl) + evaluator
    if res.cpus is not None:
        if g * nl > res.cpus:
            raise PlanError(f"more learners ({g * nl} = {g} groups x {nl}) than cores (resources.cpus = {res.cpus:g})")
        if used > res.cpus + _EPS:
            raise PlanError(f"the topology requests {used:g} cores but resources.cpus is {res.cpus:g}")
    if res.gpus and g * nl * gl > res.gpus:
        raise PlanError(f"the topology requests {g * nl * gl} GPUs but resources.gpus is {res.gpus}")
    if gl and p.learner_sps_per_gpu is None:
        raise PlanError("resources.learner.gpu > 0 but the profile has no GPU figure (learner_sps_per_gpu)")
    if res.cpus_per_node is not None and max(ca, cb, cl) > res.cpus_per_node + _EPS:
        raise PlanError(f"a process of {max(ca, cb, cl):g} cores does not fit a node of "
                        f"{res.cpus_per_node:g} (resources.cpusPerNode)")
    pred = _predict(job, p, g, na, nb, nl, ca, cb, cl, gl, res.nodes)
    out = _make_plan(job, pred, g, na, nb, nl, ca, cb, cl, gl)
    threads = {r: getattr(res, r).threads for r in ("actor", "buffer", "learner")}
    if any(threads.values()):  # keep explicit thread counts from the spec
        out = replace(out, **{r: replace(getattr(out, r), threads=n) for r, n in threads.items() if n})
    return out


# ----------------------------------------------------------------- live rebalancing
@dataclass(frozen=True)
class GroupThroughput:
    """Observed rates of one group over a window: actors' frames/s, buffer
    receive samples/s, learner consume samples/s, and its current actor count."""

    produced_fps: float
    received_sps: float
    consumed_sps: float
    actors: int
    # The learners' measured capacity (samples per busy second, learner_capacity_sps): what
    # they could take. None: only `consumed` is known.
    capacity_sps: Optional[float] = None

    def __post_init__(self) -> None:
        for n in ("produced_fps", "received_sps", "consumed_sps"):
            if not getattr(self, n) >= 0:
                raise ValueError(f"GroupThroughput.{n} must be >= 0, got {getattr(self, n)!r}")
        if self.capacity_sps is not None and not (math.isfinite(self.capacity_sps) and self.capacity_sps >= 0):
            raise ValueError(f"GroupThroughput.capacity_sps must be finite and >= 0, got {self.capacity_sps!r}")
        if self.actors < 0:
            raise ValueError(f"GroupThroughput.actors must be >= 0, got {self.actors}")


@dataclass(frozen=True)
class RebalancePolicy:
    target_ratio: float  # consumed / produced the job aims at (spec.replay_ratio)
    band: float  # relative hysteresis band, 0 <= band < 1
    min_actors: int
    max_actors: int
    max_step: int = 4  # most actors added or removed per group per decision

    def __post_init__(self) -> None:
        if not self.target_ratio > 0:
            raise ValueError(f"target_ratio must be > 0, got {self.target_ratio!r}")
        if not 0 <= self.band < 1:
            raise ValueError(f"band must be in [0, 1), got {self.band!r}")
        if self.min_actors < 1:
            raise ValueError(f"min_actors must be >= 1, got {self.min_actors}")
        if self.max_actors < self.min_actors:
            raise ValueError(f"max_actors ({self.max_actors}) < min_actors ({self.min_actors})")
        if self.max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {self.max_step}")


def actors_for(learner_sps: float, ratio: float, per_actor_fps: float, band: float = 0.0) -> int:
    """Fewest actors whose production feeds `learner_sps` at replay ratio `ratio` to within
    `band`: n·per_actor_fps ≥ (1 − band)·learner_sps/ratio, i.e. ⌈(1 − band)·need/p⌉
    (the planner's balance with band 0; rebalance uses it with measured rates and its band)."""
    need = learner_sps / ratio
    return max(1, math.ceil((1 - band) * need / per_actor_fps - _EPS))


def observed_bottleneck(o: GroupThroughput, ratio: float, band: float) -> str:
    """The §3.3 kind from measured rates: communication if the buffers receive less than
    (1 − band) of what the actors produce; sample if production is below (1 − band) of what
    the learners could take (their capacity, else their consumption) over `ratio`; else training."""
    if o.produced_fps > 0 and o.received_sps < (1 - band) * o.produced_fps:
        return COMMUNICATION_BOUND
    take = max(o.capacity_sps or 0.0, o.consumed_sps)
    return SAMPLE_BOUND if o.produced_fps < (1 - band) * take / ratio else TRAINING_BOUND


def rebalance(observed: dict[int, GroupThroughput], policy: RebalancePolicy) -> dict[int, int]:
    """Desired actor count per group from observed throughput, by the planner's model.

    The learners can take L = max(capacity, consumed) samples/s (capacity: their measured
    samples per busy second; a learner held back by the replay ratio consumes only
    ratio·produced, so `consumed` alone would hide a sample-bound group). With
    x = produced / (L / target_ratio), for a group with n actors producing p = produced/n each:

      communication-bound (observed_bottleneck)  → n: more actors would not be received;
      x < 1 − band  → n + clamp(actors_for(L, target_ratio, p, band) − n, 1, max_step)
                      (nothing produced yet: + max_step);
      x > 1 + band  → n − clamp(n − actors_for(L, target_ratio, p, band), 1, max_step);
      otherwise, or L = 0 (learner not started), → n;

    then clamped to [min_actors, max_actors]. When actors pace themselves
    (spec.staleness.paceActors) `produced` is capped at headroom·needed; pass
    target_ratio / headroom as target_ratio, or the unpaced capacity.
    """
    out: dict[int, int] = {}
    for group, o in observed.items():
        n = o.actors
        take = max(o.capacity_sps or 0.0, o.consumed_sps)
        if take > 0 and observed_bottleneck(o, policy.target_ratio, policy.band) != COMMUNICATION_BOUND:
            x = o.produced_fps / (take / policy.target_ratio)
            if x < 1 - policy.band:
                if x == 0 or n == 0:
                    step = policy.max_step
                else:
                    step = actors_for(take, policy.target_ratio, o.produced_fps / n, policy.band) - n
                n += min(max(step, 1), policy.max_step)
            elif x > 1 + policy.band:
                step = n - actors_for(take, policy.target_ratio, o.produced_fps / n, policy.band)
                n -= min(max(step, 1), policy.max_step)
        out[group] = min(max(n, policy.min_actors), policy.max_actors)
    return out


def pace_fps(learner_capacity_sps: float, ratio: float, actors: int, headroom: float) -> float:
    """Per-actor production rate that feeds the learner with some headroom:

        fps = learner_capacity_sps / ratio · headroom / actors

    Preconditions: capacity > 0, ratio > 0, actors ≥ 1, headroom > 0.
    """
    if not learner_capacity_sps > 0:
        raise ValueError(f"learner_capacity_sps must be > 0, got {learner_capacity_sps!r}")
    if not ratio > 0:
        raise ValueError(f"ratio must be > 0, got {ratio!r}")
    if actors < 1:
        raise ValueError(f"actors must be >= 1, got {actors}")
    if not headroom > 0:
        raise ValueError(f"headroom must be > 0, got {headroom!r}")
    return learner_capacity_sps / ratio * headroom / actors


def resolve(job: TianJiJob, profile: Optional[Profile] = None) -> tuple[TianJiJob, Plan]:
    """The job as it will run, and its plan: the one entry point of both engines.

    Always plans, so an explicit topology is validated exactly like `topology: auto`
    (a manifest `tianji run` accepts is one the operator accepts). The resolved job has
    the planned topology (`auto: false`), per-role requests and batch size; workers read
    it (run dir job.yaml, or the ConfigMap), so every process agrees on the topology.
    PlanError names the spec field at fault.
    """
    try:
        p = plan_for_job(job, profile)
    except PlanError as e:
        where = "spec.resources" if job.spec.topology.auto else "spec.topology"
        raise PlanError(f"{where}: {e}") from None
    doc = job.to_manifest()  # `spec` and `spec.resources` always there: defaults are dumped
    spec = doc["spec"]
    spec["topology"] = {**spec["topology"], "auto": False, **p.topology()}  # keeps groupSync
    for role in ("actor", "buffer", "learner"):
        rp = getattr(p, role)
        spec["resources"][role] = {"cpu": rp.cpu, "memory": rp.memory, "gpu": rp.gpu, "threads": rp.threads}
    # No batch size here: the planner takes the spec's (Plan.batch_size is algorithm.batchSize).
    return TianJiJob.model_validate(doc), p


# ----------------------------------------------------------------- one shared host
def predict_on_host(job: TianJiJob, profile: Profile, cores: float, background: float = 0.0,
                    learner_threads: Optional[int] = None) -> dict:
    """The same model for `tianji run` on one machine, where processes are not limited to
    their requests. Co-located actors and learners take turns, and so do synchronised groups
    (costmodel.host_turns): per batch the actors' phase and the learner's phase add up, over
    the g groups, T = max(g·(T_A + T_learn), T_C). Averaging groups (groupSync average) run
    side by side instead: T = max(T_A + T_learn, T_C), with all g groups' processes sharing
    each phase (measured 2026-11-24: 2 averaging groups produced 1.5× one group on 2 cores,
    where turns would give 1×). Each phase gets a max-min fair share
    of the `cores` (costmodel.max_min_shares) beside `background` busy processes of other
    work and the buffers' busy share:

        actor phase:    n_a actors of a group (demand 1 core each)  -> share a of a core each
        learner phase:  n_l learners of a group (demand t threads)   -> share l each

    A buffer's capacity (for T_C) is the share it would get busy (demand 1) in those phases.

    A learner given l of its t threads runs at s_L(t)·l/t. Returns _predict's dict plus the
    shares used (actor_share, learner_share: per process within its phase)."""
    s = job.spec
    t = s.topology
    g, na, nb, nl = t.groups, t.actors, t.buffers, t.learners
    threads = learner_threads or s.resources.learner.threads or _threads(s.resources.learner.cpu)
    full = costmodel.learner_sps(profile.learner_sps_per_core, profile.learner_thread_scaling, threads)[0]
    bg = max(0.0, background)
    # Synchronised groups take turns with each other (one group's processes per phase, g turns);
    # averaging groups never wait for each other, so they run side by side: every group's
    # processes share each phase (all in the same phase: the contended case), one turn each.
    side_by_side = g > 1 and t.group_sync.mode == "average"
    k, turns = (g, 1) if side_by_side else (1, g)
    d_b = 0.1
    pred: dict = {}
    for _ in range(5):  # the buffers' share depends on the rates: a few rounds reach the fixed point
        sa, sb, sl = costmodel.host_turns(cores, k * na, k * nb, k * nl, float(threads), d_b, bg)
        cb = costmodel.host_turns(cores, k * na, k * nb, k * nl, float(threads), 1.0, bg)[1]  # were it busy
        pred = _predict(job, profile, g, na, nb, nl, 1.0, max(cb, _EPS), float(threads), 0,
                        actor_share=sa, learner_rate=full * min(1.0, sl / threads), turns=turns)
        msgs = (pred["produced_fps"] + pred["consumed_sps"]) / profile.fragment_samples / (g * nb)
        d_b = min(1.0, max(0.05, msgs * profile.message_seconds))
    pred.update({"actor_share": sa, "buffer_share": sb, "learner_share": sl, "host_cores": cores,
                 "background": bg})
    return pred


def plan_on_host(job: TianJiJob, p: Plan, profile: Profile, cores: float, background: float = 0.0) -> dict:
    """predict_on_host for the topology `p` (what `tianji run` starts on one machine of `cores`):
    the figures `tianji plan` shows beside the plan's own when everything shares one host."""
    doc = job.to_manifest()
    doc["spec"]["topology"] = {"auto": False, **p.topology()}
    doc["spec"]["algorithm"]["batchSize"] = p.batch_size
    return predict_on_host(TianJiJob.model_validate(doc), profile, cores, background,
                           learner_threads=p.learner.threads)


def predict_with_shares(job: TianJiJob, profile: Profile, actor_share: float, buffer_share: float,
                        learner_share: float, learner_threads: int = 1) -> dict:
    """The model given the CPU each process was measured to get (cores, per process of the role):
    separates the cost model from the scheduler's split on a host with unknown other load.
    (A paced actor that keeps pace uses share·f_a = headroom·capacity/r: then T_A < T_L and
    the kind is training-bound, as it should be.)"""
    t = job.spec.topology
    full = costmodel.learner_sps(profile.learner_sps_per_core, profile.learner_thread_scaling, learner_threads)[0]
    return _predict(job, profile, t.groups, t.actors, t.buffers, t.learners, 1.0, max(buffer_share, _EPS),
                    float(learner_threads), 0, actor_share=actor_share,
                    learner_rate=full * min(1.0, learner_share / learner_threads))
