"""Actor pacing feedback: how much faster than the learner's capacity actors should produce.

The learner advertises its capacity C (samples per busy second) and a
headroom h with each parameter publish; an actor produces at most
C / replayRatio * h / actors frames/s (control/planner/plan.pace_fps). A fixed h
either wastes (production the learner cannot take ages out and is dropped as
stale, or is refused by the replay limiter) or starves the learner. So h is
driven by what the learner observes over each control period:

    drop fraction d = samples dropped / samples received by its buffers
                      (stale, overflow, replay-ratio refusals, and its own stale drops)
    excess lag    e = mean policy lag of what it consumed - the lag overlapping alone makes
                      (on-policy only: `lag_target`, below; 0 when nothing was consumed)
    idle fraction u = share of the period the learner had no batch to train on

    d > 0.8 target                    h <- h * max(1 - 2d, 1 / 2)     (waste: slow down, harder the more)
    else e > LAG_SLACK and u <= starved  h <- h * max(1 - e / 2, 1 / 2)  (a standing queue: slow down before it ages)
    else u > starved                  h <- h * (1 + u / 2)            (the learner waits: speed up, harder the more)
    then h is clamped to [MIN_HEADROOM, MAX_HEADROOM]

The lag rule reads a lag above the overlap's as a queue, and only a learner that never waits has
one. A learner that waits sees lag from how long a fragment takes instead: a fragment carries the
version it started with, and Pong's (8 envs x 64 steps) took 0.5 s on a GPU machine while the
learner published 4 versions a second, so it was consumed at lag 2.8 with the learner idle half
the time. Slowing the actors down for that lag only starved the learner further.

Aiming under the target keeps the steady-state drop fraction under it
while the idle rule keeps the learner fed. Drops alone are not enough for an
on-policy learner: they only start once data is maxPolicyLag versions old, so a
controller that waits for them settles with a queue that deep. On Acrobot with
rl-zoo's settings (a version is 256 Adam steps) it settled at mean lag 1.76, the
queue holding a second batch, where overlapping needs 1. The lag rule keeps the
queue at what the next update takes. Pure and socket-free (tested directly).
"""
from __future__ import annotations

import os
from fractions import Fraction
from typing import Optional

from tianji.control.contracts.addressing import learner_for_actor
from tianji.control.spec.lagbound import overlap_lag

MIN_HEADROOM = 0.5
MAX_HEADROOM = 4.0
DROP_TARGET = 0.05  # the stale-drop fraction to stay under at steady state
STARVED = 0.15  # idle share of a period above which the learner counts as starved
LAG_SLACK = 0.25  # mean consumed lag tolerated above the overlap's own before production slows
ENV_BENCH_DEPTH = "TIANJI_BENCH_QUOTA_DEPTH"  # quota_depth's benchmark override
RELEASE_MIN_S = 0.1  # VersionQuota: the shortest wait for a late version (2 QUOTA_POLL_S probes of the actor's)
RELEASE_UNKNOWN_S = 2.0  # ... before the learner has advertised a capacity


class HeadroomController:
    def __init__(self, headroom: float, target: float = DROP_TARGET, starved: float = STARVED,
                 lag_target: Optional[float] = None):
        """`lag_target`: the mean policy lag overlapping makes by itself (lag_target(spec)); None: no lag rule."""
        if not 0 < target < 1:
            raise ValueError(f"target must be in (0, 1), got {target!r}")
        self.headroom = min(MAX_HEADROOM, max(MIN_HEADROOM, float(headroom)))
        self.target, self.starved, self.lag_target = target, starved, lag_target

    def update(self, received: int, dropped: int, idle_fraction: float, lag: Optional[float] = None) -> float:
        """One control period's observations in, the new headroom out. `lag`: the mean policy lag of
        the samples consumed in the period (None: nothing consumed)."""
        d = dropped / received if received > 0 else 0.0
        excess = lag - self.lag_target if lag is not None and self.lag_target is not None else 0.0
        starved = idle_fraction > self.starved
        if d > 0.8 * self.target:
            self.headroom *= max(1.0 - 2 * d, 0.5)
        elif excess > LAG_SLACK and not starved:  # a learner that waits has no queue to shorten
            self.headroom *= max(1.0 - excess / 2, 0.5)
        elif starved:
            self.headroom *= 1.0 + min(idle_fraction, 1.0) / 2
        self.headroom = min(MAX_HEADROOM, max(MIN_HEADROOM, self.headroom))
        return self.headroom


def lag_target(spec) -> Optional[float]:
    """The mean lag the lag rule aims at: what overlapping alone makes (control/spec/lagbound.py)."""
    lag = overlap_lag(spec)
    return None if lag is None else float(lag)


def startup_frames(spec, peers: int) -> int:
    """Frames an actor may produce before its learner has advertised a capacity (is training).

    Production before the first update is only worth what the learner can use once it starts:
    PPO, the batches it consumes at no more lag than overlapping makes (lag_target, within
    maxPolicyLag): the first, and one per version of that lag; more would be consumed later
    still, or dropped. DQN, the replay warm-up plus what the limiter lets in before the first
    sample (replayErrorBuffer / replayRatio). Shared among the `peers` actors of that learner;
    anything beyond would be dropped (stale, overflow, ratio) or trained on late while the
    learner starts up.
    """
    a = spec.algorithm
    if a.name == "ppo":
        samples = (min(spec.max_policy_lag, overlap_lag(spec)) + 1) * a.batch_size
    else:
        lim = spec.replay_limiter()
        samples = lim.min_size_to_sample + lim.error_buffer / lim.samples_per_insert
    return max(spec.env.num_envs * spec.env.fragment_length, int(samples // max(peers, 1)))


class VersionQuota:
    """On-policy production clocked by versions: an actor sends its share of the batches one
    published version trains on, per version, and keeps at most `depth` shares ahead of the learner.

    A relaxed PPO learner consumes one batch per update. With one share per version and nothing
    ahead (depth 1) the job runs in lock step: the learner publishes, waits while the actors
    produce the next batch with that version, trains on it, publishes again. Learner and actors
    then take turns: traced on CartPole (2 actors, 2 cores), the learner sat idle 48 % of the time
    and consumed at lag 0.07. With depth 2 one batch trains while the next is produced: the
    share sent with version v is what the update after the current one trains on (lag 1, what
    `overlap_lag` allows for creditWindow 1), and neither side waits on the other.
    `depth` = creditWindow + 1: the batch training and the ones its credit window queues.

    A rate (the token bucket above) cannot hold production to one batch per update when an update
    takes seconds and the control period one: it overshoots, then drops. The version clock can.
    A version that skips some (the subscription keeps only the newest) brings a share for each,
    within the depth, so a batch still completes.

    It is pacing, not a wait on a peer: when the next version is late (a share lost with a
    restarted buffer, a dead or slow peer whose share the batch still lacks), the quota reopens
    `release_s` after the version arrived, one fragment per `release_s / share` (a whole missing
    share in another `release_s`; a version merely late costs a few fragments, not a share).

    `share` counts fragments, exactly: this actor's part of publishEvery batches (quota_share), a
    fraction where the peers outnumber a batch's fragments or do not divide them. A fraction
    accrues: with 6 actors and 2 fragments a batch each actor sends one fragment every third
    version. Rounded up to a whole fragment, each would send one every version, 3x what the
    learner takes: on 16 idle cores 6 such actors made 28k frames/s for a learner taking 9.4k,
    and the buffer dropped 96k samples as stale in 14 s (docs/device/trace-cartpole-ppo.json).
    `phase` staggers the peers (quota_phase): each starts that far into its next fragment, so
    every version gets its batch from some of them, not all of them every third version. A
    fragment goes out when a whole one is due; `cap`, the most due at once, is `depth` shares
    and the phase, and at least one fragment.
    """

    def __init__(self, share: Fraction | int, depth: int = 1, phase: Fraction | int = 0):
        share, phase = Fraction(share), Fraction(phase)
        if share <= 0 or depth < 1 or not 0 <= phase < 1:
            raise ValueError(f"share > 0, depth >= 1 and 0 <= phase < 1, got {share!r}, {depth!r}, {phase!r}")
        self.share, self.depth, self.phase = share, depth, phase
        self.cap = max(depth * share + phase, Fraction(1))
        self.budget = Fraction(0)  # fragments due before the next version; below 0: released beyond it
        self.since: Optional[float] = None  # when the current version arrived (None: none yet, nothing held back)
        self.released = 0  # fragments let out beyond the budget because the next version was late

    def new_version(self, now: float, advanced: int = 1) -> None:
        """A version `advanced` versions past the last one arrived (the first: `depth` shares)."""
        first = self.depth * self.share + self.phase
        grant = first if self.since is None else max(self.budget, 0) + max(advanced, 1) * self.share
        self.budget, self.since = min(grant, self.cap), now

    def add(self, fragments: int = 1) -> None:
        self.budget -= fragments

    def open(self, now: float, release_s: float) -> bool:
        """May another fragment go out?"""
        if self.since is None or self.budget >= 1:
            return True
        extra = max(-self.budget, 0)  # fragments already released for this version
        if now - self.since >= release_s * (1 + extra / self.share):
            self.released += 1
            return True
        return False


def lag_room(spec) -> bool:
    """Does maxPolicyLag admit a version of lag beyond what overlapping makes (overlap_lag)? Where it
    does, a version-clocked actor may run its quota ahead at once (a new version ends even the token
    bucket's rest: the learner, when it is the bottleneck, then consumes a version later); where it
    does not, such samples would be dropped as stale, and a late ONNX session too."""
    lag = spec.max_policy_lag
    return lag is None or lag > (overlap_lag(spec) or 0)


def quota_depth(spec) -> int:
    """Shares an actor keeps ahead of its learner (VersionQuota): the batch training and the
    creditWindow batches queued behind it. Strict jobs have no quota. ENV_BENCH_DEPTH overrides it
    for a side-by-side benchmark (bench/device/run.py's lock-step arm), nothing else."""
    forced = os.environ.get(ENV_BENCH_DEPTH, "")
    return int(forced) if forced.isdigit() and int(forced) >= 1 else spec.credit_window + 1


def quota_share(spec, peers: int) -> Fraction:
    """Fragments one of `peers` actors sends per published version (VersionQuota), exactly."""
    frag = spec.env.num_envs * spec.env.fragment_length
    batches = spec.staleness.publish_every * max(1, spec.algorithm.batch_size // frag)
    return Fraction(batches, max(peers, 1))


def quota_rank(actor: int, topology) -> int:
    """The place of `actor` among the actors that feed its learner, in index order (quota_phase's
    `peer_index`). Counted below its own index, so an actor the autoscaler added beyond
    spec.topology.actors has one too."""
    learner = learner_for_actor(actor, topology.buffers, topology.learners)
    return sum(1 for a in range(actor) if learner_for_actor(a, topology.buffers, topology.learners) == learner)


def quota_phase(share: Fraction, peer_index: int) -> Fraction:
    """How far into its next fragment the `peer_index`-th actor of a learner starts (VersionQuota):
    spread evenly, so that every version has about `share` x peers fragments due."""
    return (peer_index * share) % 1


def release_after(batch_size: int, capacity_sps: float, share_s: float = 0.0) -> float:
    """How long after a version arrives its successor counts as late: twice the longer of the
    update the learner's advertised capacity implies and the time this actor takes to produce its
    own share (`share_s`: what a batch takes when every peer is as quick), and at least
    RELEASE_MIN_S. A peer slower than that (a busy core, env code that spins in its process) then
    does not set the others' pace: they release fragments that complete the batches. Measured with
    a fixed 2 s floor instead, one actor spinning in its own cgroup cut the other's throughput to
    0.08-0.23 of a clean run's (docs/benchmarks.md#one-actor-flooding-its-buffer)."""
    if capacity_sps <= 0:
        return RELEASE_UNKNOWN_S
    return max(RELEASE_MIN_S, 2.0 * batch_size / capacity_sps, 2.0 * share_s)
