"""Actor: policy inference + simulation in one loop (dependency II stays local).

Per fragment: step N vectorised envs for T steps with the local policy (rollout.py),
push the fragment to the group's buffer (NOBLOCK: a full queue drops the
fragment and counts it), then probe the parameter subscription without
waiting and swap in the newest version. The fragment carries the
`policy_version` that produced every one of its steps.

Pacing: the learner advertises its consumption capacity C (samples per busy
second) and a headroom h (adapted to what is dropped, runtime/pacing.py) with
each parameter publish; an actor sharing that learner with k others produces
at most C / ratio * h / k frames/s (planner.pace_fps). That is a local token
bucket, not a wait on another role: it keeps production near the balance so
2-core machines don't spend their cycles on samples that would only be dropped.
Until the first capacity advert (the learner is still starting), an actor
produces its share of what the learner can use when it starts
(pacing.startup_frames) at INITIAL_FPS, then slows to that share (DQN) or one fragment (PPO) per
STARTUP_TRICKLE_S.
Relaxed PPO is also clocked by versions (pacing.VersionQuota): per version it holds, an actor
sends its share of a batch and keeps at most creditWindow + 1 shares ahead of the learner, then
rests until the next version (or, when that is late, sends another share): one batch trains while
the next is produced. The version is its clock: a new one ends any rest at once, the token
bucket's too where maxPolicyLag admits the lag that adds (above creditWindow x publishEvery).
A rest run to its end held each version's first fragment back 10-22 ms; the learner, waiting
for it, sat idle half the time and consumed at lag 0.4 (traced on CartPole,
bench/pipeline_trace.py). Now CartPole consumes at lag 0.9-1.6, and Pong's CPU preset, where
the learner is the bottleneck, at 2.0.

`spec.dependencies: strict` (the paper's strictly ordered baseline, for bench/ablation.py) turns
this into the classic synchronous loop on the same sockets: an actor waits for parameters it has
not rolled out with, rolls out its share of one batch (batchSize / actors per buffer samples) with
them, sends it, and waits again; no pacing. The learner, training only on complete batches and
dropping any sample with lag > 0 (spec.max_policy_lag is 0), then trains on exactly the last
rollout of every actor.

Exploration follows the learner's global frame count, published with the
parameters (a restarted actor carries on where the job is, not at epsilon = 1).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Optional

import numpy as np
import zmq

from tianji.algos.models import load_arrays, state_arrays
from tianji.control.contracts.addressing import buffer_for_actor, learner_for_actor
from tianji.control.planner.plan import pace_fps
from tianji.runtime import envguard, framestack
from tianji.runtime.pacing import (
    VersionQuota,
    lag_room,
    quota_depth,
    quota_phase,
    quota_rank,
    quota_share,
    release_after,
    startup_frames,
)
from tianji.runtime.roles.base import Role
from tianji.runtime.rollout import Rollout
from tianji.runtime.validate import (
    check_capacity,
    check_frames,
    check_headroom,
    check_learner_version,
    check_params,
    limits_for,
    ppo_batch_fragments,
)
from tianji.runtime.wire import WireError

log = logging.getLogger("tianji")
INITIAL_FPS = 2000.0  # per actor, until the learner has measured its capacity
STARTUP_TRICKLE_S = 1.0  # after its start-up share, an actor sends that share (DQN) or a fragment (PPO) per this
QUOTA_POLL_S = 0.05  # while this version's share is sent: how often to look for the next version
FRAGMENT_EWMA = 0.2  # weight of the newest fragment in the fragment-time average
STRICT_RESEND_S = 60.0  # dependencies: strict: a round open this long (and 4x the longest so far) was lost


class Pacer:
    """Token bucket on frames: each frame costs 1/fps seconds of budget.

    `next_free` is when the budget spent so far is paid off; `wait_time()`
    is how far in the future that is. Falling behind (descheduled) forgives
    at most 1 s of debt, so an actor never bursts to catch up.
    """

    def __init__(self, fps: Optional[float]):
        self.fps = fps
        self.next_free = time.monotonic()

    def set_rate(self, fps: Optional[float]) -> None:
        self.fps = fps

    def add(self, frames: int) -> None:
        if self.fps:
            self.next_free = max(self.next_free, time.monotonic() - 1.0) + frames / self.fps

    def wait_time(self) -> float:
        return max(0.0, self.next_free - time.monotonic()) if self.fps else 0.0


class ParamFollower:
    """Follows one learner's parameter publishes (SUB, never waited on): takes the newest
    queued message, validates it whole before loading (`_take_params`), and keeps
    `version`. Actors and the evaluator (roles/evaluator.py) follow parameters this way."""

    def follow_params(self, group: int, learner: int) -> None:
        self.version = 0
        self.learner_name = f"learner-{group}-{learner}"
        self.param_limits = limits_for(sum(v.nbytes for v in state_arrays(self.model).values()))
        self.sub = self.socket(zmq.SUB, self.addrs.connect("params", group, learner), bind=False, hwm=2,
                               max_msg=self.param_limits.max_total_bytes * 4, peer=self.learner_name)

    def probe_params(self) -> None:
        """Take the newest parameters queued on the subscription (older ones are skipped)."""
        newest = None
        while True:
            msg = self.receive(self.sub, ("params",), ("learner",), self.param_limits)
            if msg is None:
                if not self.sub.poll(0):
                    break
                continue
            newest = msg
        if newest is None:
            return
        self.handle(self._take_params, newest)

    def _take_params(self, msg) -> None:
        """Validated before anything is loaded: sender, every array finite, names/shapes/dtypes
        (load_arrays), the advertised capacity a sane number. Raises WireError (counted)."""
        if msg.sender != self.learner_name:
            raise WireError("sender", f"params from {msg.sender!r}")
        cap = check_capacity(msg.meta.get("capacity_sps"))
        headroom = check_headroom(msg.meta.get("headroom"))
        frames = check_frames(msg.meta.get("frames"))
        check_params(msg)
        check_learner_version(msg.policy_version)
        self.accept(msg)
        # Not "only newer versions": a learner restarted from its checkpoint restarts the numbering.
        try:
            load_arrays(self.model, msg.arrays)
        except ValueError as e:
            raise WireError("params", str(e)) from None
        self.version = msg.policy_version
        self.metrics.set("policy_version", self.version)
        self.on_params(cap, headroom, frames)

    def on_params(self, cap: Optional[float], headroom: Optional[float], frames: Optional[int]) -> None:
        """What the publish's adverts change in this role (once the parameters are loaded)."""


class Actor(ParamFollower, Role):
    name = "actor"

    def setup(self) -> None:
        s = self.spec
        topo = s.topology
        seed = s.env.seed + 10_000 * self.group + 100 * self.index + 1
        # The inference runtime is chosen on a thread (spec.actor.inference: auto) while the env loop
        # starts on torch. A new version's ONNX Runtime session is built off the env loop for replay
        # (DQN); on-policy (PPO) the next fragment waits for it (milliseconds once the loop lets go of
        # the interpreter): built beside a busy Pong loop a session lagged whole fragments, the actor
        # acted with versions up to 5 behind the one it held, and 15 % of its frames were dropped as
        # stale while the learner waited for them.
        self.rollout = Rollout(s, seed, frames_scale=topo.groups * topo.actors, background_choice=True,
                               wait_swaps=s.algorithm.name == "ppo" or not lag_room(s))
        self.model, self.info = self.rollout.model, self.rollout.info
        b = buffer_for_actor(self.index, topo.buffers)
        learner = learner_for_actor(self.index, topo.buffers, topo.learners)
        self.push = self.socket(zmq.PUSH, self.addrs.connect("fragments", self.group, b), bind=False, hwm=4,
                                peer=f"buffer-{self.group}-{b}")
        self.follow_params(self.group, learner)
        self.peers = sum(1 for a in range(topo.actors) if learner_for_actor(a, topo.buffers, topo.learners) == learner)
        # dependencies: strict (the paper's baseline): rounds of one rollout, then a wait for the new policy
        self.strict = s.dependency_mode == "strict"
        self.rollout_fragments = ppo_batch_fragments(s) // (topo.actors // topo.buffers) if self.strict else 0
        self.rolled_out: Optional[int] = None  # the version of the last strict rollout
        self.fresh_policy = False  # parameters arrived that this actor has not rolled out with
        self.longest_wait = 0.0  # the longest a round took to close, so far
        self.pacer = Pacer(INITIAL_FPS if s.staleness.pace_actors and not self.strict else None)
        self.learner_paced = False  # a capacity advert has arrived
        self.capacity = 0.0  # the learner's latest advert (samples per busy second)
        # Relaxed PPO, once paced: at most this actor's share of a batch per version (pacing.VersionQuota)
        share = quota_share(s, self.peers)
        self.quota = (VersionQuota(share, quota_depth(s), quota_phase(share, quota_rank(self.index, topo)))
                      if s.algorithm.name == "ppo" and s.staleness.pace_actors and not self.strict else None)
        self.quota_version: Optional[int] = None
        # A new version ends a rate's rest too (step) where the lag that can add is admitted: a learner
        # that is the bottleneck then consumes shares a version later (Pong's CPU preset: lag 2.0).
        self.rate_wakes = self.quota is not None and lag_room(s)
        self.fragment_s = 0.0  # this actor's time to roll out one fragment (moving average): its share's pace
        self.startup_frames = startup_frames(s, self.peers)
        self.sent_frames = 0  # frames of the fragments the push socket took (a buffer not up yet loses none)
        self.recent = deque(maxlen=100)
        self.nonfinite_fragments = 0

    def _rest(self, seconds: float, until_new_version: bool = False) -> None:
        """Sleep while pacing, but keep probing parameters and reporting: paced to a slow learner (Pong
        on a loaded 2-core box) one fragment's rest outlasted the 30 s heartbeat timeout.
        `until_new_version`: wake as soon as a version reopens the quota. Resting out the poll
        period instead held each version's first fragment back 10-22 ms (median, traced on
        CartPole), while the learner, waiting for that batch, sat idle half the time."""
        end = time.monotonic() + seconds
        held = self.quota_version
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                break
            if self.sub.poll(timeout=min(left, 0.05) * 1000):
                self.probe_params()
                if until_new_version and self.quota_version != held:
                    break
            self.maybe_report()

    def step(self) -> None:
        if self.strict:
            self._strict_round()
            return
        if self.pacer.fps == INITIAL_FPS and not self.learner_paced and self.sent_frames >= self.startup_frames:
            # The learner is not training yet: more would only be dropped. A trickle, not a stop: what
            # was sent may have been lost (a buffer not up yet), and DQN needs learningStarts to begin.
            # PPO trickles one fragment: its share again would be consumed versions late (a first update
            # of 8 s at load 16 turned 4096 samples a second into lag 2-4 and drops).
            trickle = self.startup_frames if self.rollout.algo == "dqn" else self.rollout.n * self.rollout.T
            self.pacer.set_rate(trickle / STARTUP_TRICKLE_S)
        if self._quota_spent():
            self._rest(QUOTA_POLL_S, until_new_version=True)  # probes parameters: a new version reopens the quota
            return
        self._fragment()
        self.probe_params()
        wait = self.pacer.wait_time()
        if wait > 0:  # version-clocked (PPO): a new version is the clock, and ends a rate's rest too
            self._rest(wait, until_new_version=self.rate_wakes)

    def _quota_spent(self) -> bool:
        """This version's share is sent and its successor is not late yet (pacing.VersionQuota)."""
        q = self.quota
        if q is None or not self.learner_paced:
            return False
        released = q.released
        share_s = self.fragment_s * float(max(q.share, 1))  # a fraction of a share still takes a whole fragment
        if q.open(time.monotonic(), release_after(self.spec.algorithm.batch_size, self.capacity, share_s)):
            if q.released > released and (q.released <= 3 or q.released % 100 == 0):
                log.info("%s: version %d's successor is late; sending beyond its share [%d fragments so far]",
                         self.sender, self.version, q.released)
            return False
        return True

    # ------------------------------------------------------------ dependencies: strict
    def _strict_round(self) -> None:
        """One round of the synchronous loop: wait for a policy this actor has not rolled out with
        (the one the learner trained on its last rollout), then roll out its share of a batch."""
        if not self._await_new_policy():
            return
        self.rolled_out = self.version
        self.fresh_policy = False
        for _ in range(self.rollout_fragments):
            if self.stopping:
                return
            self._fragment()

    def _await_new_policy(self) -> bool:
        """Block (reporting, stoppable) until new parameters arrive. A republish of the version already
        rolled out is not new. A round whose rollout was lost (a restart) never closes: after
        STRICT_RESEND_S, or 4x the longest round so far if longer (a Pong update at load 10 took 40 s),
        the actor rolls out again with what it has (counted, strict_resends_total)."""
        t0 = time.monotonic()
        patience = max(STRICT_RESEND_S, 4 * self.longest_wait)  # a slow learner's round is not a lost one
        while not self.fresh_policy and not self.stopping:
            if self.sub.poll(timeout=50):
                self.probe_params()
            self.maybe_report()
            if time.monotonic() - t0 > patience and self.rolled_out is not None:
                self.metrics.inc("strict_resends_total")
                log.warning("%s: no new policy %.0f s after the rollout of version %d; rolling out again",
                            self.sender, patience, self.rolled_out)
                break
        waited = time.monotonic() - t0
        self.metrics.inc("policy_wait_seconds_total", waited)
        if self.fresh_policy and self.rolled_out is not None:
            self.longest_wait = max(self.longest_wait, waited)
        return not self.stopping

    # ------------------------------------------------------------ fragments
    def _fragment(self) -> None:
        """Roll out one fragment with the current policy and push it, tagged with the version it acted
        with (ONNX Runtime's session of a newly loaded version may still be building: the one before)."""
        t0 = time.monotonic()
        arrays, finished = self.rollout.fragment()
        spent = time.monotonic() - t0
        self.fragment_s = spent if self.fragment_s == 0 else self.fragment_s + FRAGMENT_EWMA * (spent - self.fragment_s)
        version = self.rollout.acting_version
        frames = self.rollout.n * self.rollout.T
        self.trace("fragment", t0=round(t0, 6), v=version, held=self.version, n=frames)
        finished = [(r, n) for r, n in finished if math.isfinite(r)]  # a return summed over a NaN reward is no return
        if finished:
            self.recent.extend(r for r, _ in finished)
            self.add_episodes(finished)
            self.metrics.inc("episodes_total", len(finished))
            self.metrics.set("episode_return_mean", float(np.mean(self.recent)))
        self.metrics.inc("env_frames_total", frames)
        if self.rollout.algo == "dqn":
            self.metrics.set("epsilon", self.rollout.epsilon())
        self.pacer.add(frames)
        if self.quota is not None:
            # Produced is spent, delivered or not: a fragment dropped (its buffer gone or full, or
            # non-finite) must not reopen the quota, or actors free-run at the token bucket's rate
            # while a buffer is re-created (3.4x the frames, every one dropped).
            self.quota.add()
        if self._env_output_finite(arrays):
            self._send_fragment(arrays, version, frames)

    def _env_output_finite(self, arrays: dict) -> bool:
        """False (fragment dropped and counted, envs reset if need be) when the env produced a
        non-finite observation or reward: it never reaches a buffer (runtime/envguard.py)."""
        bad = envguard.nonfinite_steps(arrays, self.rollout.obs)
        if not bad:
            return True
        self.metrics.inc("samples_dropped_total", int(arrays["valid"].sum()), reason=envguard.DROP_REASON)
        self.nonfinite_fragments += 1
        if self.nonfinite_fragments <= 3 or self.nonfinite_fragments % 100 == 0:
            log.warning("%s: env produced %d non-finite observations/rewards; fragment dropped [%d so far]",
                        self.sender, bad, self.nonfinite_fragments)
        if not envguard.obs_finite(self.rollout.obs):
            self.rollout.reset()
        return False

    def _send_fragment(self, arrays: dict, version: int, frames: int) -> None:
        samples = int(arrays["valid"].sum())
        if self.info.is_image and self.info.obs_shape[0] > 1:  # stacked frames: send each frame once
            arrays.update(framestack.compress(arrays.pop("obs")))
        arrays["last_obs"] = self.rollout.obs
        if self.send(self.push, "fragment", arrays, meta={"frames": frames}, policy_version=version):
            self.metrics.inc("samples_sent_total", samples)
            self.sent_frames += frames
        else:
            self.metrics.inc("samples_dropped_total", samples, reason="hwm")

    def on_params(self, cap: Optional[float], headroom: Optional[float], frames: Optional[int]) -> None:
        self.rollout.params_loaded(self.version)  # the acting copy (bf16, ONNX Runtime) follows the new weights
        self.trace("params", v=self.version)
        if frames is not None:
            self.rollout.global_frames = frames
        if self.version != self.rolled_out:
            self.fresh_policy = True
        if self.quota is not None and self.learner_paced and self.version != self.quota_version:
            advanced = self.version - self.quota_version if self.quota_version is not None else 1
            self.quota_version = self.version
            self.quota.new_version(time.monotonic(), advanced)
        if self.spec.staleness.pace_actors and cap and not self.strict:
            if not self.learner_paced and self.quota is not None:  # the quota starts with the first advert
                self.quota_version = self.version
                self.quota.new_version(time.monotonic())
            self.learner_paced, self.capacity = True, cap
            self.pacer.set_rate(pace_fps(cap, self.spec.replay_ratio, self.peers,
                                         headroom or self.spec.staleness.pace_headroom))

    def report_extra(self) -> dict:
        extra = {"version": self.version, "pace_fps": self.pacer.fps}
        if self.rollout.algo == "dqn":
            extra["epsilon"] = self.rollout.epsilon()
        return extra

    def teardown(self) -> None:
        self.rollout.close()
