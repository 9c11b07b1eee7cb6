"""What the profiler feeds the components it times: synthetic fragments and batches with a
job's shapes and dtypes, a loopback socket pair, the learner class. Shared by
runtime/profiling/profiler.py (one of each component) and runtime/profiling/scaling.py (thread curve,
all-reduce, bandwidth)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Optional

import numpy as np

from tianji.control.spec import TianJiJob


@contextlib.contextmanager
def ipc_pair(prefix: str, hwm: Optional[int] = None):
    """A connected PUSH -> PULL pair over ipc in a temporary folder (linger 0), removed on exit:
    what the profiler times message costs and loopback bandwidth over."""
    import zmq

    tmp = tempfile.mkdtemp(prefix=prefix)
    addr = f"ipc://{tmp}/m"
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        for sock in (pull, push):
            sock.setsockopt(zmq.LINGER, 0)
        if hwm is not None:
            pull.setsockopt(zmq.RCVHWM, hwm)
            push.setsockopt(zmq.SNDHWM, hwm)
        pull.bind(addr)
        push.connect(addr)
        yield push, pull
    finally:
        push.close()
        pull.close()
        ctx.term()
        with contextlib.suppress(OSError):
            os.unlink(f"{tmp}/m")
        os.rmdir(tmp)


def synthetic_fragment(job: TianJiJob, obs_shape: tuple, obs_dtype: str, n_actions: int,
                       rng: np.random.Generator, n: Optional[int] = None,
                       act_shape: tuple = ()) -> dict[str, np.ndarray]:
    """A fragment with the actor's shapes and dtypes (random content, ~1% episode ends);
    `act_shape` (act_dim,) for continuous actions."""
    s = job.spec
    T, n = s.env.fragment_length, n or s.env.num_envs

    def obs(*lead):
        if np.dtype(obs_dtype).kind == "u":
            return rng.integers(0, 256, (*lead, *obs_shape), dtype=np.uint8).astype(obs_dtype)
        return rng.standard_normal((*lead, *obs_shape)).astype(obs_dtype)

    dones = rng.random((T, n)) < 0.01
    valid = np.ones((T, n), dtype=bool)
    valid[1:] = ~dones[:-1]
    actions = (rng.standard_normal((T, n, *act_shape)).astype(np.float32) if act_shape
               else rng.integers(0, n_actions, (T, n), dtype=np.int64))
    frag = {"obs": obs(T, n), "actions": actions,
            "rewards": rng.standard_normal((T, n)).astype(np.float32), "dones": dones,
            "terminated": dones.copy(), "valid": valid, "last_obs": obs(n)}
    if s.algorithm.name == "ppo":
        frag["logp"] = np.full((T, n), -np.log(n_actions) if not act_shape else -1.0, dtype=np.float32)
    return frag


def synthetic_batch(job: TianJiJob, batch_size: int, obs_shape: tuple, obs_dtype: str, n_actions: int,
                    rng: np.random.Generator, act_shape: tuple = ()) -> dict[str, np.ndarray]:
    """A learner batch as the buffer sends it: PPO [T, B/T] fragments; DQN batchSize x stepsPerBatch transitions."""
    from tianji.runtime.fields import BATCH

    s = job.spec
    if s.algorithm.name == "ppo":
        T = s.env.fragment_length
        frag = synthetic_fragment(job, obs_shape, obs_dtype, n_actions, rng, n=max(1, batch_size // T),
                                  act_shape=act_shape)
        frag["valid"][:] = True  # count exactly batch_size samples
        frag["versions"] = np.zeros(frag["last_obs"].shape[0], dtype=np.int64)
        return {k: frag[k] for k in BATCH["ppo"]}
    count = batch_size * s.algorithm.steps_per_batch
    if np.dtype(obs_dtype).kind == "u":
        o = rng.integers(0, 256, (count, *obs_shape), dtype=np.uint8)
        o2 = rng.integers(0, 256, (count, *obs_shape), dtype=np.uint8)
    else:
        o = rng.standard_normal((count, *obs_shape)).astype(obs_dtype)
        o2 = rng.standard_normal((count, *obs_shape)).astype(obs_dtype)
    return {"obs": o, "actions": rng.integers(0, n_actions, count, dtype=np.int64),
            "returns": rng.standard_normal(count).astype(np.float32), "next_obs": o2,
            "discounts": np.full(count, s.algorithm.gamma, dtype=np.float32),
            "versions": np.zeros(count, dtype=np.int64)}


def learner_class(name: str):
    """The learner class of an algorithm name (imports torch)."""
    from tianji.algos.dqn import DQNLearner
    from tianji.algos.ppo import PPOLearner

    return PPOLearner if name == "ppo" else DQNLearner
