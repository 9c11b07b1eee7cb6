"""Buffer: fan-in of actor fragments, staleness filter, credit-bounded batches to one learner.

Loop: drain fragments (validate each against the job: runtime/validate.py),
drain credits from the learner (each credit also carries the learner's current
version), drop what is too stale, then send as many batches as credits allow.
Credits count only from the learner that owns this buffer, fragments only from
the actors that feed it (addressing.buffer_for_actor); a fragment's
policy_version must lie between 0 and the highest version that learner has
announced plus one update or two (validate.version_slack). Any exception while
handling a message is a counted reject (roles/base.py), never a crash.

Each sender gets its share (runtime/fairshare.py): a flooding actor drops only
its own fragments (reason "over_share", per sender in the report's extra).

On-policy (PPO): a queue of fragments per sender, each consumed once, capped
in bytes as well as fragments; a batch is `batchSize / (numEnvs *
fragmentLength)` whole fragments, the newest of each sender in turn.
Off-policy (DQN): a replay ring behind a sample-to-insert limiter
(control/contracts/ratelimit.py): a batch of `batchSize * stepsPerBatch` samples is sent
only when the limiter allows it, and a fragment it refuses is dropped
(reason "ratio"), so the realised replay ratio stays within its error buffer
of the target without blocking anyone.

With checkpoint.replaySnapshot (DQN) the ring goes to disk every
checkpoint.intervalSeconds and at exit (runtime/replay_snapshot.py), and a
buffer that finds its snapshot in the state dir at start (as a learner finds
its checkpoint: `tianji run --resume`, a re-created pod on the checkpoint
claim) loads it if it fits the job, else logs why and starts empty. Loaded
transitions count toward learningStarts in the limiter, so the learner trains
at once when there are enough of them.

Each batch carries feedback for the learner's pacing (runtime/pacing.py):
samples received and dropped, and fragments received, since the last batch.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from tianji.control.contracts.addressing import buffer_for_actor, learner_for_buffer
from tianji.control.spec import DQNConfig, PPOConfig
from tianji.envs import declared_info
from tianji.runtime import replay_snapshot
from tianji.runtime.fairshare import AdmissionShare, SenderQueues
from tianji.runtime.roles.base import Role
from tianji.runtime.storage import Replay, fragment_samples, nstep_transitions
from tianji.runtime.validate import (
    check_fragment,
    check_learner_version,
    check_policy_version,
    fragment_bytes,
    limits_for,
    ppo_batch_fragments,
    version_slack,
)
from tianji.runtime.wire import Limits, Message, WireError

log = logging.getLogger("tianji")
MAX_DRAIN = 64  # messages per socket per loop turn: fairness between fan-in and dispatch


class Buffer(Role):
    name = "buffer"

    def setup(self) -> None:
        s = self.spec
        self.info = declared_info(s.env)  # no env here: user env modules load in actors only
        self.algo = s.algorithm
        self.T = s.env.fragment_length
        self.frag_limits = limits_for(fragment_bytes(s, self.info))
        self.credit_limits = Limits(max_frame_bytes=0, max_total_bytes=0)
        self.max_lag = s.max_policy_lag
        self.window = s.credit_window
        self.frag_in = self.socket(zmq.PULL, self.addrs.bind("fragments", self.group, self.index), bind=True, hwm=64,
                                   max_msg=self.frag_limits.max_total_bytes * 4)
        self.credit_in = self.socket(zmq.PULL, self.addrs.bind("credits", self.group, self.index), bind=True, hwm=64,
                                     max_msg=1 << 20)
        learner = learner_for_buffer(self.index, s.topology.learners)
        self.learner_name = f"learner-{self.group}-{learner}"
        self.actor_prefix = f"actor-{self.group}-"  # fragments come from the actors that feed this buffer
        self.version_high = 0  # the highest version the owning learner has announced (trusted)
        self.slack = version_slack(s)
        self.out = self.socket(zmq.PUSH, self.addrs.connect("batches", self.group, learner), bind=False,
                               hwm=self.window + 1, peer=self.learner_name)
        self.poller = zmq.Poller()
        self.poller.register(self.frag_in, zmq.POLLIN)
        self.poller.register(self.credit_in, zmq.POLLIN)
        self.credits = 0
        self.learner_version = 0
        self.inserted = 0
        self.consumed = 0
        self.feedback = {"received": 0, "dropped": 0, "fragments": 0}  # since the last batch sent
        self.snapshotter = None  # checkpoint.replaySnapshot (DQN)
        if isinstance(self.algo, PPOConfig):
            self.queue = SenderQueues(s.staleness.queue_fragments,
                                      max_bytes=s.staleness.queue_fragments * fragment_bytes(s, self.info))
            self.frags_per_batch = ppo_batch_fragments(s)
            self.over_share = self.queue.over_share
        else:
            self.share = AdmissionShare()
            self.over_share = self.share.over_share
            self.replay = Replay(self.algo.replay_capacity, s.env.seed + 7919 * (self.group * 64 + self.index))
            self.limiter = s.replay_limiter()
            if s.checkpoint.replay_snapshot and self.run_dir:
                path = replay_snapshot.snapshot_path(self.run_dir, self.group, self.index)
                self.snapshotter = replay_snapshot.Snapshotter(path)
                self.last_snapshot_t = time.monotonic()
                self._restore(path)

    # ---------------------------------------------------------------- replay snapshot
    def _restore(self, path) -> None:
        """Load this buffer's snapshot if there is one and it fits the job; else start empty."""
        replay_snapshot.remove_temp_files(path)
        if not path.exists():
            return
        try:
            arrays = replay_snapshot.load(path, self.info, self.replay.capacity)
        except Exception as e:  # noqa: BLE001 - SnapshotError says why; anything else is a refusal too
            log.error("%s: replay snapshot %s refused (%s); starting with an empty replay", self.sender, path, e)
            return
        n = self.replay.put(arrays)
        counted = self.limiter.preload(n)
        self.metrics.set("replay_restored", n)
        log.info("%s: loaded %d transitions from %s (%d of learningStarts %d counted)", self.sender, n, path,
                 counted, self.limiter.min_size_to_sample)

    def _snapshot(self, final: bool = False) -> None:
        snap = self.snapshotter
        if final:
            snap.wait()  # the periodic one, if still running, then the last state
        if snap.start(self.replay) and final:
            snap.wait()
        self.last_snapshot_t = time.monotonic()
        if snap.last["transitions"]:
            self.metrics.set("replay_snapshot_seconds", snap.last["copy_s"] + snap.last["write_s"])

    # ---------------------------------------------------------------- inputs
    def _take_fragment(self, msg: Message) -> None:
        """Raises WireError for anything not this job's (counted by Role.handle)."""
        if not self._feeds_me(msg.sender):  # (authenticated: roles/base.py)
            raise WireError("sender", f"fragment from {msg.sender!r}, not an actor of {self.sender}")
        self.seqs.check(msg.sender, msg.seq)  # a replay costs no validation (a flood's are many)
        check_policy_version(msg.policy_version, self.version_high, self.slack)
        frag = check_fragment(msg, self.spec, self.info)  # rebuilds stacked frames (framestack.py)
        self.accept(msg)  # not a replay
        frag["version"] = msg.policy_version
        self.trace("frag_in", s=msg.sender, v=msg.policy_version)
        n = fragment_samples(frag)
        self.metrics.inc("samples_received_total", n)
        self.feedback["received"] += n
        self.feedback["fragments"] += 1
        if self.max_lag is not None and self.learner_version - msg.policy_version > self.max_lag:
            self._drop(n, "stale")
            return
        now = time.monotonic()
        if isinstance(self.algo, PPOConfig):
            over, overflow = self.queue.put(msg.sender, frag, now)
            self._drop(over, "over_share")
            self._drop(overflow, "overflow")
            counted = n
        else:
            if not self.share.admit(msg.sender, n, now):
                self._drop(n, "over_share")
                return
            if not self.limiter.insert(n):
                self.share.refused(now)
                self._drop(n, "ratio")
                return
            self.share.admitted(msg.sender)
            self.replay.put(nstep_transitions(frag, self.algo.n_step, self.algo.gamma))
            counted = n if self.limiter.sampling else 0  # the limiter counts from the learning start
        self.inserted += counted
        self.metrics.inc("samples_inserted_total", counted)

    def _feeds_me(self, sender: str) -> bool:
        """An actor of this group whose index maps to this buffer (addressing.buffer_for_actor); any
        index, as the autoscaler adds actors beyond spec.topology.actors."""
        index = sender[len(self.actor_prefix):] if sender.startswith(self.actor_prefix) else ""
        return index.isdigit() and len(index) < 8 and index == str(int(index)) \
            and buffer_for_actor(int(index), self.spec.topology.buffers) == self.index

    def _drop(self, n: int, reason: str) -> None:
        if n:
            self.metrics.inc("samples_dropped_total", n, reason=reason)
            self.feedback["dropped"] += n

    def _take_credit(self, msg: Message) -> None:
        if msg.sender != self.learner_name:  # (authenticated: roles/base.py)
            raise WireError("sender", f"credit from {msg.sender!r}, expected {self.learner_name!r}")
        grant, reset = msg.meta.get("grant", 0), msg.meta.get("reset", False)
        if not isinstance(grant, int) or isinstance(grant, bool) or not 0 <= grant <= self.window \
                or not isinstance(reset, bool) or set(msg.meta) - {"grant", "reset"}:
            raise WireError("meta", f"bad credit {msg.meta!r}")
        check_learner_version(msg.policy_version)
        if not reset and msg.policy_version < self.learner_version:  # a learner's versions only grow
            raise WireError("version", f"stale credit at version {msg.policy_version} < {self.learner_version}")
        self.accept(msg)
        # Never lowered: after a learner restart actors may still be on the old, higher numbering.
        self.version_high = max(self.version_high, msg.policy_version)
        self.credits = min(self.window, self.credits + grant)
        if reset:  # a (re)started learner: its numbering is authoritative
            self.learner_version = msg.policy_version
        else:
            self.learner_version = max(self.learner_version, msg.policy_version)

    # ---------------------------------------------------------------- output
    def _next_batch(self) -> dict | None:
        if isinstance(self.algo, PPOConfig):
            self._drop(self.queue.drop_stale(self.learner_version, self.max_lag), "stale")
            return self.queue.pop_batch(self.frags_per_batch)
        a: DQNConfig = self.algo
        count = a.batch_size * a.steps_per_batch
        if len(self.replay) < a.batch_size or not self.limiter.sample(count):
            return None
        return self.replay.sample(count)

    def _dispatch(self) -> None:
        while self.credits > 0:
            batch = self._next_batch()
            if batch is None:
                return
            n = int(np.count_nonzero(batch["valid"])) if "valid" in batch else len(batch["actions"])
            if not self.send(self.out, "batch", batch, meta={"buffer": self.index, **self.feedback}):
                # Learner queue full despite credits (e.g. it restarted): keep on-policy data, retry later.
                self.metrics.inc("samples_dropped_total", n, reason="hwm")
                self.credits = 0
                return
            self.credits -= 1
            self.consumed += n
            if self.trace.on:
                v = np.asarray(batch["versions"])
                self.trace("batch_out", vmin=int(v.min()), vmax=int(v.max()), n=n)
            self.feedback = dict.fromkeys(self.feedback, 0)
            self.metrics.inc("samples_sent_total", n)

    def _drain(self, sock: zmq.Socket, kind: str, sender: str, handle, limits: Limits) -> None:
        """Up to MAX_DRAIN queued messages of `kind` from `sender` roles (rejects are counted by receive())."""
        for _ in range(MAX_DRAIN):
            msg = self.receive(sock, (kind,), (sender,), limits)
            if msg is not None:
                self.handle(handle, msg)
            elif not sock.poll(0):
                return

    def step(self) -> None:
        events = dict(self.poller.poll(timeout=50))
        if self.credit_in in events:
            self._drain(self.credit_in, "credit", "learner", self._take_credit, self.credit_limits)
        if self.frag_in in events:
            self._drain(self.frag_in, "fragment", "actor", self._take_fragment, self.frag_limits)
        self._dispatch()
        self.metrics.set("queue_depth", self.queue.samples() if isinstance(self.algo, PPOConfig) else len(self.replay))
        self.metrics.set("policy_version", self.learner_version)
        if self.inserted:
            self.metrics.set("replay_ratio", self.consumed / self.inserted)
        if self.snapshotter is not None \
                and time.monotonic() - self.last_snapshot_t > self.spec.checkpoint.interval_seconds:
            self._snapshot()

    def report_extra(self) -> dict:
        return {"over_share": dict(self.over_share)} if self.over_share else {}

    def teardown(self) -> None:
        if self.snapshotter is not None:
            self._snapshot(final=True)
