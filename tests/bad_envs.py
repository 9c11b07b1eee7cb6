"""User envs that misbehave, for tests/engine/test_custom_env.py. Workers import this module through
`env.imports` / an entry-point id (tests put tests/ and examples/custom-env on PYTHONPATH)."""
from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np
from reach_goal.envs import ReachGoalEnv

# Which processes imported this module: only those that build envs may (the test reads the file).
_IMPORT_LOG = os.environ.get("TIANJI_TEST_IMPORT_LOG")
if _IMPORT_LOG:
    with open(_IMPORT_LOG, "a") as f:
        f.write((sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else "launcher") + "\n")


class FailOnce(ReachGoalEnv):
    """Raises in `step` after `after` steps, once per job: the first env to get there creates
    `marker` (O_EXCL) and raises; every later one, in this or a restarted actor, carries on."""

    def __init__(self, marker: str, after: int = 100, **kw):
        super().__init__(**kw)
        self.marker, self.after, self.steps = marker, after, 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.after:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("bad_envs: simulated fault in step")
        return super().step(action)


class NaNSometimes(ReachGoalEnv):
    """Every `every` steps a NaN observation or an infinite reward (alternately)."""

    def __init__(self, every: int = 500, **kw):
        super().__init__(**kw)
        self.every, self.steps = every, 0

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        self.steps += 1
        if self.steps % self.every == 0:
            if (self.steps // self.every) % 2:
                obs = np.full_like(obs, np.nan)
            else:
                reward = float("inf")
        return obs, reward, term, trunc, info


class _Uncarried(gym.Env):
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


class DictObs(_Uncarried):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "goal": gym.spaces.Discrete(3)})


class TextObs(_Uncarried):
    observation_space = gym.spaces.Text(8)
