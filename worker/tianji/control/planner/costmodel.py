"""The planner's cost terms (paper §3.3): learner curve, all-reduce, links, time to target.

Pure functions over a `profile.Profile`; `prediction.predict` combines them into one
learner update's critical path. Notation as in plan.py, plus

    P        parameter bytes per publish (PUB sends one copy per subscribed actor)
    b_s      bytes per sample on the wire (fragments; a DQN batch carries obs and
             next_obs, so 2·b_s per sample there)
    W        ranks of the learners' all-reduce, W = g·n_l
    k        gradient steps per B consumed samples: DQN 1; PPO
             epochs·⌈B / minibatchSize⌉ (one all-reduce each)
    bw, λ    link bandwidth (bytes/s) and one-way latency (s)

Learner throughput at c cores (threads = ⌊c⌋), from the measured thread curve
S(t) = learner_sps_per_core · learner_thread_scaling[t] (ratios measured side by
side by `tianji profile`):

    s_L(c) = c·S(1)                        c ≤ 1 (a CPU share)
           = S(t) interpolated linearly     between measured thread counts
           = S(t_max)                       c > t_max: flat, never extrapolated upward

so a learner bigger than the measured range is predicted no faster than the
largest measured one (`learner_sps` says when that happens).

All-reduce of the gradient (P bytes) at W ranks: the measured time A(W) where
measured (interpolated), else a ring (2(W−1) steps) scaled from the largest
measured point A(W₀), plus what a slower link adds:

    A(W) = A(W₀)·(W−1)/(W₀−1) + max(0, R(W, link) − R(W, loopback))      (W > W₀ or another link)
    R(W, l) = 2(W−1)/W·P/bw_l + 2(W−1)·λ_l

with A(1) = 0; with nothing measured, A(W) = R(W, link). Growing linearly in the
ring's steps is conservative: measured gloo all-reduces of small models are
dominated by per-step overhead, not bytes.

Link time of one update (the busiest process's link; latency once):

    learner:  n_a/n_l·P/publish_every + B·b_batch              bytes
    buffer:   (B/r·b_s + B·b_batch)·n_l/n_b                     bytes
    T_net   = max(learner, buffer)/bw + λ

Roles sharing one host (`tianji run`; sharedhost.predict_on_host): actors and learners take
turns, and so do synchronised groups (host_turns below, a measured rule): per batch

    T = max(g·(T_A(a) + T_learn(l)), T_C)

with a, l each role's max-min fair share of the cores within its own phase.

Time to target, the user's goal. The frames a run needs to reach its target grow with the
effective batch and, for on-policy learning, with policy lag:

    batch:  ρ(W) = F(W·B) / F(B), F the frames to target against effective batch, measured
            (batchcurve.py: docs/results/batch-curve-<job>.json, `python -m bench.batch_curve`;
            extrapolated from the measured jobs for a job without its own curve; (1 + W)/2,
            McCandlish et al. 2018 with B_noise = B, only when no curve exists), the learning
            rate not scaled with W
    lag:    PPO: 1 + LAG_COST·max(0, lag − 1);  DQN: 1 (off-policy by design). LAG_COST is a
            stated figure, not a measurement: plans name it among their assumptions
    time to target ∝ ρ·lag / consumed = 1/E,  E = efficiency·consumed (effective progress),
            efficiency = 1 / (ρ·lag); in seconds F(B)·r/E where the job's own curve gives F(B).

W synchronised learners buy progress only while ρ(W) grows slower than W and A(W)·k is small
beside the update's compute; what a plan may spend for it is the budget rule's call
(objective.py, spec.plan.minMarginalGain).

Group sync (spec.topology.groupSync, `group_sync_terms`). In `allreduce` mode all
g·n_l learners share each gradient step: W = g·n_l in A(W). In `average` mode a
step's all-reduce spans the n_l learners of one group only (W = n_l in A(W); none
with n_l = 1); groups average their parameters asynchronously every
I = intervalUpdates updates, a ring all-reduce of P bytes at g·n_l ranks that runs
beside training, off the critical path. Its stated cost is its bytes on the
learner's link, 2·P/I per update (T_net), nothing on the update's compute. The
batch penalty ρ keeps W = g·n_l in both modes: averaged groups are local SGD, which
needs no fewer samples than one synchronous batch of g·n_l·B (bench/groupsync.py
measured no fall in frames to target), so `average` buys consumption, not sample
efficiency; a penalty on n_l only would have the planner multiply groups for free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

LOOPBACK_BYTES_PER_S = 2e9  # when the profile measured no ipc bandwidth
# name -> (Gbit/s, one-way µs): nominal line rates; latency of a TCP hop in a pod network / IB verbs.
LINK_PRESETS = {"ethernet-10g": (10.0, 50.0), "infiniband-hdr": (200.0, 2.0)}
LAG_COST = 0.05  # PPO: each version of expected lag beyond one costs 5 % more samples (stated, not measured)


@dataclass(frozen=True)
class LinkModel:
    name: str
    bytes_per_s: float
    latency_s: float


def link_for(
    link, nodes: int, ipc_bytes_per_second: Optional[float], measured: Optional[tuple[float, float]] = None
) -> LinkModel:
    """`link` = spec.network.link, or None: loopback on one node; across nodes the link the
    profile measured between two hosts (`measured` = (bytes/s, one-way s)), else ethernet-10g."""
    if link is None and nodes > 1 and measured is not None:
        return LinkModel("measured", float(measured[0]), float(measured[1]))
    preset = link.preset if link is not None else ("loopback" if nodes <= 1 else "ethernet-10g")
    if link is not None and link.preset is None:
        return LinkModel("custom", link.bandwidth_gbps * 1e9 / 8, link.latency_us * 1e-6)
    if preset == "loopback":
        # Fixed per-message costs are in message_seconds (μ); here only bytes.
        return LinkModel("loopback", ipc_bytes_per_second or LOOPBACK_BYTES_PER_S, 0.0)
    gbps, us = LINK_PRESETS[preset]
    return LinkModel(preset, gbps * 1e9 / 8, us * 1e-6)


def thread_curve(scaling: Optional[dict]) -> list[tuple[int, float]]:
    """Sorted (threads, relative samples/s) with (1, 1.0) always present."""
    pts = {1: 1.0}
    pts.update({int(t): float(v) for t, v in (scaling or {}).items()})
    return sorted(pts.items())


def learner_sps(per_core: float, scaling: Optional[dict], cores: float) -> tuple[float, bool]:
    """s_L(c) (module docstring) and whether c lies beyond the measured thread range."""
    curve = thread_curve(scaling)
    if cores <= 1:
        return per_core * cores, False
    t_max, v_max = curve[-1]
    if cores >= t_max:
        return per_core * v_max, cores > t_max
    for (t0, v0), (t1, v1) in zip(curve, curve[1:]):
        if t0 <= cores <= t1:
            return per_core * (v0 + (v1 - v0) * (cores - t0) / (t1 - t0)), False
    return per_core * v_max, False  # unreachable: the curve covers [1, t_max]


def _ring(ranks: int, param_bytes: float, link: LinkModel) -> float:
    return 2 * (ranks - 1) / ranks * param_bytes / link.bytes_per_s + 2 * (ranks - 1) * link.latency_s


def allreduce_seconds(
    measured: Optional[dict], ranks: int, param_bytes: float, link: LinkModel, measured_link: LinkModel
) -> tuple[float, bool]:
    """A(W) (module docstring) and whether it is extrapolated beyond the measured ranks."""
    if ranks <= 1:
        return 0.0, False
    pts = sorted((int(w), float(s)) for w, s in (measured or {}).items() if int(w) >= 2)
    if not pts:
        return _ring(ranks, param_bytes, link), True
    pts = [(1, 0.0)] + pts
    w_max, a_max = pts[-1]
    if ranks <= w_max:
        for (w0, a0), (w1, a1) in zip(pts, pts[1:]):
            if w0 <= ranks <= w1:
                a = a0 + (a1 - a0) * (ranks - w0) / (w1 - w0)
                break
    else:
        a = a_max * (ranks - 1) / (w_max - 1)
    extra = max(0.0, _ring(ranks, param_bytes, link) - _ring(ranks, param_bytes, measured_link))
    return a + extra, ranks > w_max or link.name != measured_link.name


def gradient_steps(job) -> int:
    """k: all-reduces per B consumed samples (one learner version in plan.py's units):
    a DQN step consumes B samples; a PPO update of B makes epochs·⌈B/minibatch⌉ steps."""
    a = job.spec.algorithm
    if a.name == "dqn":
        return 1
    return a.epochs * math.ceil(a.batch_size / a.minibatch_size)


def lag_factor(job, lag: float) -> float:
    if job.spec.algorithm.name != "ppo":
        return 1.0
    return 1 + LAG_COST * max(0.0, lag - 1)


def param_bytes_estimate(job, obs_dim: int = 4, n_actions: int = 2) -> float:
    """float32 parameter bytes of the spec's model, when the profile did not measure them.
    MLP from hidden sizes (obs_dim and n_actions default to CartPole's); Nature CNN ~1.7M."""
    m = job.spec.model
    if getattr(m, "encoder", None) == "nature_cnn":
        return 4 * 1.7e6
    sizes = [obs_dim, *m.hidden, n_actions + 1]
    return 4.0 * sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def max_min_shares(demands: list[float], cores: float) -> list[float]:
    """Max-min fair CPU shares (what the Linux scheduler gives busy processes on a shared host):
    nobody gets more than it demands, the rest is split evenly among the others."""
    shares = [0.0] * len(demands)
    left, todo = cores, sorted(range(len(demands)), key=lambda i: demands[i])
    while todo:
        fair = left / len(todo)
        i = todo[0]
        if demands[i] <= fair:
            shares[i] = demands[i]
            left -= demands[i]
            todo.pop(0)
        else:
            for j in todo:
                shares[j] = fair
            break
    return shares


def host_turns(
    cores: float,
    actors: int,
    buffers: int,
    learners: int,
    learner_threads: float,
    buffer_demand: float,
    background: float = 0.0,
    actor_demand: float = 0.0,
) -> tuple[float, float, float]:
    """CPU shares (actor, buffer, learner; cores per process) when a job's roles share one host.

    Measured rule (bench/scaling.py, docs/results/scaling.json; DQN CartPole at replay ratio 2 on 2
    cores): co-located actors and learners take turns. They are coupled by the replay limiter,
    the credit window and actor pacing, and do not run side by side: per point the actors'
    busy wall share (their CPU over min(n_a, cores)) plus the learner's (its CPU over its
    threads) came to 0.97-1.2, while the roles together used only 1.2-1.8 of the 2 cores. So
    each role, in its phase, competes only with the buffers (which serve both phases) and
    other work, max-min fairly:

        actor phase:    max_min_shares([1]·n_a + [d_b]·n_b + bg, cores)    -> a (per actor)
        learner phase:  max_min_shares([t]·n_l + [d_b]·n_b + bg, cores)    -> l (per learner)
        buffer:         its share in the busier phase (the smaller of the two)

    with d_b the buffer's busy share, t the learner's threads and bg `background` busy
    processes (each a demand of at most one core). More actors thus take nothing from the
    learner; they only shorten the actor phase until it uses every core. A turn of one batch
    lasts T_A(a) + T_learn(l).

    Synchronised groups on one host take turns with each other too (arguments: one group's
    processes): every gradient step ends in an all-reduce that waits for all ranks, and the
    groups' turns were measured to add up, not overlap (2 groups of 1 actor, 1 buffer and 1
    learner on 2 cores consumed 14,972 samples/s, one group 21,702), so g groups take
    T = g·(T_A + T_learn) per batch of each (prediction.predict with turns=g). Averaging groups
    (groupSync average) never wait for each other: the arguments are then all groups'
    processes, which share each phase, and each group takes T = T_A + T_learn.

    `actor_demand` (cores per actor) is what the actors keep using during the learner's phase:
    paced actors go on producing the next batch while the learner trains. It only matters where
    the learner's threads and the actors' work together exceed the cores: a 2-thread learner
    of one group beside 2 actors on 2 cores got 1.47-1.59 cores and ran at 0.35-0.45x its
    profiled samples per CPU second (docs/benchmarks.md, "On quiet machines"), where the turns
    alone would give it both.
    """
    n_bg = int(math.ceil(background))
    bgd = [background / n_bg] * n_bg if n_bg else []
    ash = max_min_shares([1.0] * actors + [buffer_demand] * buffers + bgd, cores)
    lsh = max_min_shares(
        [learner_threads] * learners + [buffer_demand] * buffers + bgd + [actor_demand] * actors, cores
    )
    a = ash[0]
    b = min(ash[actors], lsh[learners]) if buffers else 0.0
    return a, b, lsh[0]


def group_sync_terms(job, groups: int, learners: int, param_bytes: float) -> tuple[int, int, float]:
    """(ranks of a gradient step's all-reduce, ranks in the batch penalty ρ, averaging bytes per update on
    the learner's link) for spec.topology.groupSync (module docstring)."""
    gs = job.spec.topology.group_sync
    if gs.mode == "allreduce" or groups <= 1:
        return groups * learners, groups * learners, 0.0
    return learners, groups * learners, 2.0 * param_bytes / gs.interval_updates
