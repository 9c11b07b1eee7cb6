"""Two halves of an actor's envs, for double-buffered sampling (Sample Factory).

An actor's step is a policy forward pass and an env step, one after the other:
on Pong each is about half of the time. With the envs split into two halves,
each a native ALE vector env stepping in its own thread, the actor runs the
policy on one half while the other half's emulators run (runtime/rollout.py,
`Rollout.fragment`). Each env's own sequence (obs, action, next obs) is
unchanged; only the two halves interleave.

The overlap needs a second core: the policy and the emulators then run at the
same time. On one core it gains nothing and costs CPU (policy batches of n/2,
twice the thread hand-offs): on Pong 0.36 instead of 0.47 of the bare env's
frames per CPU second (`bench/throughput.py --env pong --max-actors 1 --set
spec.resources.actor.cpu=2`, and `=1`). So an actor splits its envs when its
role has at least two cores (`resources.actor.cpu >= 2`); `TIANJI_DOUBLE_BUFFER=1`
or `0` forces it on or off.

`SplitVec` is also an ordinary VectorEnv over all n envs (step = both halves,
concatenated), so evaluation and env probing need not know about halves.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

ENV_DOUBLE_BUFFER = "TIANJI_DOUBLE_BUFFER"


def wanted(actor_cpu: float) -> bool:
    """Double-buffer an actor's envs? TIANJI_DOUBLE_BUFFER when set, else when the actor has >= 2 cores."""
    force = os.environ.get(ENV_DOUBLE_BUFFER, "").strip().lower()
    if force:
        return force not in ("0", "false", "no", "off")
    return actor_cpu >= 2


class SplitVec(VectorEnv):
    def __init__(self, halves: list):
        self.halves = halves
        sizes = [h.num_envs for h in halves]
        edges = np.cumsum([0, *sizes])
        self.slices = [slice(int(a), int(b)) for a, b in zip(edges, edges[1:])]
        first = halves[0]
        self.num_envs = int(edges[-1])
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(getattr(first, "metadata", {}) or {}, autoreset_mode=AutoresetMode.NEXT_STEP)
        self.clip_rewards = getattr(first, "clip_rewards", False)
        self.episodic_life = getattr(first, "episodic_life", False)
        self.backend = getattr(first, "backend", type(first).__name__)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        parts = []
        for h, s in zip(self.halves, self.slices):
            parts.append(h.reset(seed=None if seed is None else int(seed) + s.start, options=options))
        return np.concatenate([p[0] for p in parts]), _join([p[1] for p in parts], self.slices)

    def step(self, actions):
        actions = np.asarray(actions)
        for h, s in zip(self.halves, self.slices):  # both halves run at once, in their own threads
            h.send(actions[s])
        outs = [h.recv() for h in self.halves]
        obs, rew, term, trunc = (np.concatenate([np.asarray(o[i]) for o in outs]) for i in range(4))
        return obs, rew, term, trunc, _join([o[4] for o in outs], self.slices)

    def close(self, **kwargs):
        for h in self.halves:
            h.close(**kwargs)


def _join(infos: list, slices: list) -> dict:
    """Per-env info arrays of the halves, concatenated; keys not present in every half are left out."""
    out: dict = {}
    if not all(isinstance(i, dict) for i in infos):
        return out
    for k in set.intersection(*(set(i) for i in infos)):
        vals = [np.asarray(i[k]) for i in infos]
        if all(v.ndim >= 1 and len(v) == s.stop - s.start for v, s in zip(vals, slices)):
            out[k] = np.concatenate(vals)
    return out
