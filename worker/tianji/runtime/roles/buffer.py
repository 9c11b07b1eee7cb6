"""Buffer: fan-in of actor fragments, staleness filter, credit-bounded batches to one learner.

Loop: drain fragments (validate each against the job's shapes), drain
credits from the learner (each credit also carries the learner's current
version), drop what is too stale, then send as many batches as credits allow.

On-policy (PPO): a FIFO of fragments, each consumed once; a batch is
`batchSize / (numEnvs * fragmentLength)` whole fragments.
Off-policy (DQN): a replay ring. A batch of `batchSize * stepsPerBatch`
samples is sent only while consumed + batch <= ratio * inserted, which keeps
the replay ratio at or under its target without blocking anyone (cf.
Reverb's SampleToInsertRatio, which blocks the caller instead).
"""
from __future__ import annotations

import numpy as np
import zmq

from tianji.control.addressing import learner_for_buffer
from tianji.runtime import framestack
from tianji.envs import probe_env
from tianji.runtime.fields import FRAGMENT, STEP_DTYPES
from tianji.control.spec import DQNConfig, PPOConfig
from tianji.runtime.storage import Replay, RolloutQueue, fragment_samples, nstep_transitions
from tianji.runtime.wire import Message, WireError, require
from tianji.runtime.roles.base import Role

MAX_DRAIN = 64  # messages per socket per loop turn: fairness between fan-in and dispatch


def check_fragment(msg: Message, fields, info, T: int) -> dict:
    """Shapes/dtypes of a fragment against the job; raises WireError('fields'|'shape'|'dtype'|'value')."""
    require(msg, fields)
    a = msg.arrays
    obs = a["obs"]
    if obs.ndim != 2 + len(info.obs_shape) or obs.shape[0] != T or tuple(obs.shape[2:]) != info.obs_shape:
        raise WireError("shape", f"obs {list(obs.shape)}, expected [{T}, N, {list(info.obs_shape)}]")
    if obs.dtype.name != info.obs_dtype:
        raise WireError("dtype", f"obs dtype {obs.dtype}, expected {info.obs_dtype}")
    n = obs.shape[1]
    if n < 1:
        raise WireError("shape", "fragment without envs")
    for k in fields:
        if k in ("obs", "last_obs"):
            continue
        if a[k].shape != (T, n):
            raise WireError("shape", f"{k} {list(a[k].shape)}, expected [{T}, {n}]")
        if a[k].dtype.name != STEP_DTYPES[k]:
            raise WireError("dtype", f"{k} dtype {a[k].dtype}, expected {STEP_DTYPES[k]}")
    if a["last_obs"].shape != (n, *info.obs_shape) or a["last_obs"].dtype != obs.dtype:
        raise WireError("shape", f"last_obs {list(a['last_obs'].shape)}")
    act = a["actions"]
    if act.size and (act.min() < 0 or act.max() >= info.n_actions):
        raise WireError("value", "action out of range")
    if not np.isfinite(a["rewards"]).all():
        raise WireError("value", "non-finite reward")
    return {k: a[k] for k in fields}


class Buffer(Role):
    name = "buffer"

    def setup(self) -> None:
        s = self.spec
        self.info = probe_env(s.env)
        self.algo = s.algorithm
        self.T = s.env.fragment_length
        self.fields = FRAGMENT[self.algo.name]
        self.max_lag = s.max_policy_lag
        self.window = s.staleness.credit_window
        self.frag_in = self.socket(zmq.PULL, self.addrs.bind("fragments", self.group, self.index), bind=True, hwm=64)
        self.credit_in = self.socket(zmq.PULL, self.addrs.bind("credits", self.group, self.index), bind=True, hwm=64)
        learner = learner_for_buffer(self.index, s.topology.learners)
        self.out = self.socket(zmq.PUSH, self.addrs.connect("batches", self.group, learner), bind=False,
                               hwm=self.window + 1)
        self.poller = zmq.Poller()
        self.poller.register(self.frag_in, zmq.POLLIN)
        self.poller.register(self.credit_in, zmq.POLLIN)
        self.credits = 0
        self.learner_version = 0
        self.inserted = 0
        self.consumed = 0
        if isinstance(self.algo, PPOConfig):
            self.queue = RolloutQueue(s.staleness.queue_fragments)
            self.frags_per_batch = max(1, self.algo.batch_size // (s.env.num_envs * self.T))
        else:
            self.replay = Replay(self.algo.replay_capacity, s.env.seed + 7919 * (self.group * 64 + self.index))
            self.ratio = s.replay_ratio

    # ---------------------------------------------------------------- inputs
    def _take_fragment(self, msg: Message) -> None:
        try:
            if "frames" in msg.arrays:  # stacks sent frame by frame (framestack.py): rebuild them
                require(msg, framestack.FIELDS)
                a = msg.arrays
                msg.arrays["obs"] = framestack.expand(a.pop("frames"), a.pop("key"), a.pop("keystacks"),
                                                      self.info.obs_shape[0])
            frag = check_fragment(msg, self.fields, self.info, self.T)
        except WireError as e:
            self.reject(e.reason, str(e))
            return
        frag["version"] = msg.policy_version
        n = fragment_samples(frag)
        self.metrics.inc("samples_received_total", n)
        if self.max_lag is not None and self.learner_version - msg.policy_version > self.max_lag:
            self.metrics.inc("samples_dropped_total", n, reason="stale")
            return
        if isinstance(self.algo, PPOConfig):
            self.metrics.inc("samples_dropped_total", self.queue.put(frag), reason="overflow")
        else:
            self.replay.put(nstep_transitions(frag, self.algo.n_step, self.algo.gamma))
        self.inserted += n

    def _take_credit(self, msg: Message) -> None:
        grant = msg.meta.get("grant", 0)
        if not isinstance(grant, int) or grant < 0:
            self.reject("meta", f"bad credit grant {grant!r}")
            return
        self.credits = min(self.window, self.credits + grant)
        if msg.meta.get("reset"):  # a (re)started learner: its numbering is authoritative
            self.learner_version = msg.policy_version
        else:
            self.learner_version = max(self.learner_version, msg.policy_version)

    # ---------------------------------------------------------------- output
    def _next_batch(self) -> dict | None:
        if isinstance(self.algo, PPOConfig):
            self.metrics.inc("samples_dropped_total", self.queue.drop_stale(self.learner_version, self.max_lag),
                             reason="stale")
            return self.queue.pop_batch(self.frags_per_batch)
        a: DQNConfig = self.algo
        count = a.batch_size * a.steps_per_batch
        if len(self.replay) < max(a.learning_starts, a.batch_size):
            return None
        if self.consumed + count > self.ratio * self.inserted:
            return None
        return self.replay.sample(count)

    def _dispatch(self) -> None:
        while self.credits > 0:
            batch = self._next_batch()
            if batch is None:
                return
            n = int(np.count_nonzero(batch["valid"])) if "valid" in batch else len(batch["actions"])
            if not self.send(self.out, "batch", batch, meta={"buffer": self.index}):
                # Learner queue full despite credits (e.g. it restarted): keep on-policy data, retry later.
                self.metrics.inc("samples_dropped_total", n, reason="hwm")
                self.credits = 0
                return
            self.credits -= 1
            self.consumed += n
            self.metrics.inc("samples_sent_total", n)

    def _drain(self, sock: zmq.Socket, kind: str, handle) -> None:
        """Up to MAX_DRAIN queued messages of `kind` (rejected ones are counted by receive())."""
        for _ in range(MAX_DRAIN):
            msg = self.receive(sock, (kind,))
            if msg is not None:
                handle(msg)
            elif not sock.poll(0):
                return

    def step(self) -> None:
        events = dict(self.poller.poll(timeout=50))
        if self.credit_in in events:
            self._drain(self.credit_in, "credit", self._take_credit)
        if self.frag_in in events:
            self._drain(self.frag_in, "fragment", self._take_fragment)
        self._dispatch()
        self.metrics.set("queue_depth", self.queue.samples() if isinstance(self.algo, PPOConfig) else len(self.replay))
        self.metrics.set("policy_version", self.learner_version)
        if self.inserted:
            self.metrics.set("replay_ratio", self.consumed / self.inserted)
