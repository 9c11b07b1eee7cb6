"""Evaluator: periodic evaluation of the learner's policy during training (spec.evaluation).

One per job (group 0, index 0). It follows learner-0-0's parameter publishes as an actor
does (ParamFollower: a SUB socket probed without waiting, every message validated before
it is loaded; a bad one is a counted reject), so it never slows actors or learners: it is
one more subscriber, sends nothing but its report, and a PUB never waits for a slow one.

Every `intervalSeconds` it plays `episodes` episodes with the evaluation policy of `tianji
eval` (runtime/evaluation.play_episodes: a fixed count per env; PPO at its mode, DQN
epsilon-greedy at `epsilon`) on envs of its own, seeded apart from every actor's
(EVAL_SEED_BASE). One evaluation is of one policy version: parameters that arrive while
it plays wait on the socket. Its returns are not training episodes: they go to
`eval_episodes_total` / `eval_return_mean` and the report's `extra.eval`, never to the
job's mean return or its stop rule.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from tianji.algos.models import build_model
from tianji.control.contracts.rolereport import eval_summary
from tianji.envs import env_info, make_vec_env
from tianji.runtime.evaluation import eval_env_count, eval_env_limit, play_episodes
from tianji.runtime.roles.actor import ParamFollower
from tianji.runtime.roles.base import Role

log = logging.getLogger("tianji")

# Actor seeds are env.seed + 10000 * group + 100 * index + 1 (< env.seed + 1.1e7 for every
# topology); the evaluator's start 2^31 above env.seed: never an actor's. Each evaluation
# takes the next block of seeds (EVAL_SEED_BLOCKS of them, then again from the first).
EVAL_SEED_BASE = 2 ** 31
EVAL_SEED_BLOCKS = 100
IDLE_POLL_S = 0.1


class Evaluator(ParamFollower, Role):
    name = "evaluator"

    def setup(self) -> None:
        s = self.spec
        self.cfg = s.evaluation
        if not self.cfg.enabled:
            raise ValueError("spec.evaluation.intervalSeconds is not set: this job has no evaluator")
        self.algo = s.algorithm.name
        self.epsilon = self.cfg.epsilon if self.algo == "dqn" else 0.0
        self.env = make_vec_env(s.env, eval_env_count(self.cfg.episodes, eval_env_limit(s.env)))
        self.info = env_info(self.env)
        self.model = build_model(s.algorithm, s.model, self.info, s.env.seed, s.env.imports)
        self.model.eval()
        self.follow_params(0, 0)
        self.frames = 0  # the learner's global frame count, published with its parameters
        self.count = 0
        self.best = -math.inf
        self.last = None
        self.next_at = time.monotonic() + self.cfg.interval_seconds

    def on_params(self, cap, headroom, frames) -> None:
        if frames is not None:
            self.frames = frames

    def step(self) -> None:
        if self.sub.poll(timeout=IDLE_POLL_S * 1000):
            self.probe_params()
        if self.version == 0 or time.monotonic() < self.next_at:  # no trained parameters yet
            return
        self.next_at = time.monotonic() + self.cfg.interval_seconds
        self.evaluate()

    def _interrupted(self) -> bool:
        self.maybe_report()  # an evaluation can outlast the launcher's heartbeat timeout
        return self.stopping

    def evaluate(self) -> None:
        version, frames = self.version, self.frames
        seed = self.spec.env.seed + EVAL_SEED_BASE + (self.count % EVAL_SEED_BLOCKS) * self.env.num_envs
        quota = play_episodes(self.model, self.env, self.info, self.algo, self.cfg.episodes, self.epsilon, seed,
                              should_stop=self._interrupted)
        rets = quota.all_returns()
        if not quota.done or not rets.size:
            return  # stopped while playing: no partial evaluation
        rets = rets[np.isfinite(rets)]  # a return summed over a NaN reward is no return
        if not rets.size:
            log.warning("%s: evaluation of version %d had no finite return", self.sender, version)
            return
        mean = float(rets.mean())
        self.count += 1
        self.best = max(self.best, mean)
        self.last = eval_summary(count=self.count, return_mean=mean, return_std=float(rets.std()),
                                 episodes=int(rets.size), policy_version=int(version), env_frames=int(frames),
                                 t=time.time(), best_return_mean=self.best)
        self.metrics.inc("eval_episodes_total", int(rets.size))
        self.metrics.set("eval_return_mean", mean)
        log.info("%s: evaluation %d of version %d (%d env frames): return %.2f +- %.2f over %d episodes",
                 self.sender, self.count, version, frames, mean, float(rets.std()), rets.size)
        self.maybe_report(force=True)

    def report_extra(self) -> dict:
        return {"version": self.version, **({"eval": self.last} if self.last else {})}

    def teardown(self) -> None:
        self.env.close()
