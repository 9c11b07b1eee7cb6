"""One topology's predicted throughput, policy lag, bottleneck and time to target (paper §3.3).

The cost terms come from costmodel.py (learner curve, all-reduce, links, time to target) and
the links from placement.py; this module combines them into one learner update's critical
path. Notation as in plan.py:

    T_A = (B/r) / (TR_A / (g·n_l))     time for the actors to produce its new data
    T_L = B / (TR_L / (g·n_l))         time for the learner to consume it
    T_AR = k·A(W)                      the synchronous all-reduces of its k gradient steps
                                       (W = g·n_l; groupSync average: W = n_l,
                                       costmodel.group_sync_terms)
    T_P  = (1 + n_a/n_l)·P/(bw_copy·publish_every)
                                       the learner's CPU for the parameter broadcast (one
                                       serialisation, one copy per subscribed actor; bw_copy
                                       the measured loopback rate); each actor also spends
                                       P/(bw_copy·publish_every) of CPU per version taking
                                       parameters in, which lowers TR_A by that share
    T_C = max(μ·(B/r + B)/F · n_l/n_b / min(c_b, 1),  T_net)
                                       buffer time to receive those fragments and send the
                                       batch (fragment-sized units), or the busiest link's
                                       time incl. the parameter broadcast (T_net: within a
                                       group on placement.Links.group, the averaging bytes
                                       on Links.sync)
    T   = max(T_A, T_L + T_AR + T_P, T_C)

The bottleneck is communication-bound if T_C > max(T_A, T_L + T_AR + T_P) (messaging exceeds
the time budget of the slower side) or the learner is the limit and spends more time in
all-reduce and broadcast than computing (T_AR + T_P > T_L), else sample-bound if
T_A > T_L + T_AR + T_P, else training-bound. Predicted consumption is g·n_l·B/T; production is
TR_A, capped at pace_headroom·(learner capacity)/r when actors pace. On one shared host
(sharedhost.py) the roles take turns instead (`turns`): T = max(k·(T_A + T_learn), T_C),
production = consumption/r.

Time to target (costmodel.py): efficiency = 1/(ρ(W)·lag cost) with ρ the batch penalty at the
W = g·n_l learners of the batch (batchcurve.py, measured), effective progress E = consumed ×
efficiency ∝ 1/time to target, and time_to_target_s = F(B)·r/E where the job's own batch curve
gives its frames to target F(B) (else None: plans compare by E only).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from tianji.control.planner import batchcurve, costmodel
from tianji.control.planner.batchcurve import CurveUse
from tianji.control.planner.placement import Links
from tianji.control.planner.profile import Profile
from tianji.control.spec import TianJiJob

SAMPLE_BOUND = "sample-bound"
TRAINING_BOUND = "training-bound"
COMMUNICATION_BOUND = "communication-bound"
_EPS = 1e-9
LAG_SPREAD = 1.0  # versions the lags of one period spread around their mean (_lag_floor)


class Shape(NamedTuple):
    """A topology and its process sizes: g groups of n_a actors, n_b buffers and n_l learners,
    of c_a, c_b, c_l cores each, γ GPUs per learner."""

    g: int
    na: int
    nb: int
    nl: int
    ca: float
    cb: float
    cl: float
    gl: int

    @property
    def cores(self) -> float:
        return round(self.g * (self.na * self.ca + self.nb * self.cb + self.nl * self.cl), 6)

    @property
    def gpus(self) -> int:
        return self.g * self.nl * self.gl


def learner_rate(p: Profile, cl: float, gl: int) -> tuple[float, bool]:
    """Samples/s of one learner: GPU figure, or the CPU thread curve (costmodel.learner_sps)."""
    if gl:
        if p.learner_sps_per_gpu is None:
            raise ValueError("a GPU learner needs profile.learner_sps_per_gpu")
        return gl * p.learner_sps_per_gpu, False
    return costmodel.learner_sps(p.learner_sps_per_core, p.learner_thread_scaling, cl)


def _path_terms(job: TianJiJob, p: Profile, sh: Shape, links: Links, per_learner: float) -> dict:
    """The critical-path terms of one learner update except T_A (module docstring), in seconds."""
    s = job.spec
    r, B, F = s.replay_ratio, s.algorithm.batch_size, p.fragment_samples
    P = p.param_bytes or costmodel.param_bytes_estimate(job)
    ranks, batch_ranks, avg_bytes = costmodel.group_sync_terms(job, sh.g, sh.nl, P)
    ar_link = links.sync if ranks > sh.nl else links.group  # all-reduce across groups: between them
    a_one, ar_extra = costmodel.allreduce_seconds(p.allreduce_seconds, ranks, P, ar_link, links.measured)
    b_batch = p.bytes_per_sample * (2 if s.algorithm.name == "dqn" else 1)
    learner_bytes = sh.na / sh.nl * P / s.staleness.publish_every + B * b_batch
    buffer_bytes = (B / r * p.bytes_per_sample + B * b_batch) * sh.nl / sh.nb
    if links.sync == links.group:  # one link carries both
        t_net = max(learner_bytes + avg_bytes, buffer_bytes) / links.group.bytes_per_s + links.group.latency_s
    else:
        t_net = max(
            max(learner_bytes, buffer_bytes) / links.group.bytes_per_s + links.group.latency_s,
            avg_bytes / links.sync.bytes_per_s + links.sync.latency_s if avg_bytes else 0.0,
        )
    t_msg = p.message_seconds * (B / r + B) / F * sh.nl / sh.nb / min(sh.cb, 1.0)
    # Parameter broadcast on the CPUs: the learner serialises once and copies once per
    # subscribed actor; every actor receives every publish (PUB), whether it uses it or not.
    copy = P / (p.ipc_bytes_per_second or costmodel.LOOPBACK_BYTES_PER_S) / s.staleness.publish_every
    t_l = B / per_learner
    t_ar = costmodel.gradient_steps(job) * a_one
    t_pub = (1 + sh.na / sh.nl) * copy
    return {
        "t_l": t_l,
        "t_ar": t_ar,
        "t_pub": t_pub,
        "t_learn": t_l + t_ar + t_pub,
        "t_c": max(t_msg, t_net),
        "t_net": t_net,
        "copy": copy,
        "ranks": ranks,
        "batch_ranks": batch_ranks,
        "ar_extrapolated": ar_extra and ranks > 1,
        "ar_link": ar_link.name,
    }


def _time_and_kind(job: TianJiJob, sh: Shape, tr_a: float, tm: dict, turns: int) -> tuple[float, float, float, str]:
    """(T, T_A, TR_A after the actors' share of parameter intake, bottleneck kind)."""
    s = job.spec
    need = s.algorithm.batch_size / s.replay_ratio
    t_learn, t_c = tm["t_learn"], tm["t_c"]

    def total(t_a: float) -> float:
        return max(turns * (t_a + t_learn), t_c) if turns else max(t_a, t_learn, t_c)

    t_a = need / (tr_a / (sh.g * sh.nl))
    t = total(t_a)
    busy_params = min(0.95, tm["copy"] / t)  # share of an actor's CPU spent taking parameters in
    if busy_params > 0.01:
        tr_a *= 1 - busy_params
        t_a = need / (tr_a / (sh.g * sh.nl))
        t = total(t_a)
    work = turns * (t_a + t_learn) if turns else max(t_a, t_learn)
    if t_c > work + _EPS * t or ((turns or t_learn >= t_a) and tm["t_ar"] + tm["t_pub"] > tm["t_l"]):
        kind = COMMUNICATION_BOUND
    elif turns or t_a > t_learn * (1 + _EPS):
        kind = SAMPLE_BOUND
    else:
        kind = TRAINING_BOUND
    return t, t_a, tr_a, kind


def _policy_lag(job: TianJiJob, p: Profile, sh: Shape, t: float, produced: float, kind: str) -> float:
    """Expected policy lag, in learner versions, with U = 1/T updates per second:
      U·F/(TR_A/(g·n_a))      a fragment carries the version at its start
    + (publish_every − 1)/2   actors refresh parameters every few versions
    + credit_window if training-bound (full window queued) else 1/2
    + DQN only: U·N/(2·I), the mean age of a uniform draw from a full FIFO
      replay of N = replay_capacity with I = inserts/s per buffer."""
    s = job.spec
    u = 1.0 / t
    lag = u * p.fragment_samples / (produced / (sh.g * sh.na)) + (s.staleness.publish_every - 1) / 2
    lag += s.credit_window if kind == TRAINING_BOUND else 0.5
    if s.algorithm.name == "dqn":
        lag += u * s.algorithm.replay_capacity / (2 * produced / (sh.g * sh.nb))
    return lag


def _lag_floor(job: TianJiJob, p: Profile, sh: Shape, tr_a: float) -> float:
    """The shortest update period at which an on-policy learner's samples stay within maxPolicyLag.

    A fragment carries the version it started with, so it is consumed u·d_f versions late at u
    updates per second, d_f = F / (one actor's frames/s) the time it takes (_policy_lag). A learner
    faster than (L − LAG_SPREAD − c) / d_f versions per second does not train faster: what it
    would train on is dropped as stale. LAG_SPREAD: the lags of one period spread about a version
    around their mean (the phase of a fragment's start within an update, delivery jitter). On one
    H200 (docs/device/ab-trees-pong-ppo.json) a GPU learner that updates in 0.09 s ran 4.5 updates
    per second, idle 59 % of the time, at mean lag 2.6-3.0 with maxPolicyLag 4, 0.42-s fragments
    and a fifth of the production dropped as stale. 0 where nothing bounds it (DQN, no bound)."""
    s = job.spec
    max_lag = s.max_policy_lag
    if s.algorithm.name != "ppo" or max_lag is None or tr_a <= 0:
        return 0.0
    d_f = p.fragment_samples / (tr_a / (sh.g * sh.na))
    room = max_lag - LAG_SPREAD - (s.staleness.publish_every - 1) / 2 - 0.5
    return d_f / room if room > 0 else 0.0


def _extrapolated(job: TianJiJob, p: Profile, sh: Shape, beyond_curve: bool, tm: dict, curve: CurveUse) -> tuple:
    t_max = costmodel.thread_curve(p.learner_thread_scaling)[-1][0]
    w = tm["batch_ranks"]
    return tuple(
        x
        for x, flag in (
            (f"learner of {sh.cl:g} cores beyond the measured 1..{t_max} threads (held flat)", beyond_curve),
            (f"all-reduce at {tm['ranks']} ranks over {tm['ar_link']} (ring model)", tm["ar_extrapolated"]),
            ("GPU learner throughput assumed (built-in speed-up, not measured)", bool(sh.gl) and p.gpu_assumed),
            (
                f"frames to target at effective batch {w * job.spec.algorithm.batch_size:,} "
                "beyond the largest measured (McCandlish fit)",
                curve.beyond(w),
            ),
        )
        if flag
    )


def predict(
    job: TianJiJob,
    p: Profile,
    sh: Shape,
    links: Links,
    actor_share: Optional[float] = None,
    learner_rate_sps: Optional[float] = None,
    turns: int = 0,
    curve: Optional[CurveUse] = None,
) -> dict:
    """Throughput, staleness, bottleneck and time to target of one topology (module docstring).

    `actor_share`, `learner_rate_sps`: what one actor's CPU share and one learner actually get on
    a shared host (sharedhost.py); default: the requests c_a and s_L(c_l). `turns` = k ≥ 1: actors
    and learners take turns on one host, and so do the k synchronised groups
    (costmodel.host_turns): the learner waits out every actor phase (sample-bound unless
    communication-bound), and production is the consumption over r. `curve`: the batch penalty
    (default batchcurve.for_job(job)).
    """
    s = job.spec
    r, B = s.replay_ratio, s.algorithm.batch_size
    tr_a = sh.g * sh.na * (sh.ca if actor_share is None else actor_share) * p.actor_fps_per_core
    per_learner, beyond_curve = learner_rate(p, sh.cl, sh.gl)
    per_learner = per_learner if learner_rate_sps is None else learner_rate_sps
    tr_l = sh.g * sh.nl * per_learner
    tm = _path_terms(job, p, sh, links, per_learner)
    t, t_a, tr_a, kind = _time_and_kind(job, sh, tr_a, tm, turns)
    t_lag = 0.0 if turns else _lag_floor(job, p, sh, tr_a)
    lag_bound = t_lag > t
    if lag_bound:  # faster updates would outrun the fragments' age: their samples would go stale
        t, kind = t_lag, SAMPLE_BOUND
    consumed = sh.g * sh.nl * B / t
    if turns:  # actors produce only in their phase: what the learners take in, nothing more
        produced = consumed / r
    elif s.staleness.pace_actors:
        # Paced actors aim at headroom x what the learners can take (their advertised capacity).
        produced = min(tr_a, s.staleness.pace_headroom * min(tr_l, consumed * t / tm["t_learn"]) / r)
    else:
        produced = tr_a
    lag = _policy_lag(job, p, sh, t, produced, kind)
    curve = curve or batchcurve.for_job(job)
    rho, lag_cost = curve.ratio(tm["batch_ranks"]), costmodel.lag_factor(job, lag)
    eff = 1.0 / (rho * lag_cost)
    f_b = curve.absolute_frames(job)
    return {
        "produced_fps": produced,
        "consumed_sps": consumed,
        "replay_ratio": consumed / produced,
        "expected_policy_lag": lag,
        "bottleneck": kind,
        "tr_a": tr_a,
        "tr_l": tr_l,
        "sample_seconds": t_a,
        "train_seconds": tm["t_l"],
        "comm_seconds": tm["t_c"],
        "allreduce_seconds": tm["t_ar"],
        "publish_seconds": tm["t_pub"],
        "net_seconds": tm["t_net"],
        "efficiency": eff,
        "effective_sps": consumed * eff,
        "batch_ranks": tm["batch_ranks"],
        "frames_ratio": rho,
        "lag_cost": lag_cost,
        "time_to_target_s": f_b * r / (consumed * eff) if f_b and consumed > 0 else None,
        "group_link": links.group.name,
        "sync_link": links.sync.name,
        "learner_threads_measured": costmodel.thread_curve(p.learner_thread_scaling)[-1][0],
        "extrapolated": _extrapolated(job, p, sh, beyond_curve, tm, curve),
        "lag_floor_seconds": t_lag if lag_bound else 0.0,
    }
