"""GridWorldEnv from Gymnasium's tutorial "Create a Custom Environment", as written there
(rendering left out): a Dict observation of two integer Boxes, Discrete(4) actions and a
sparse reward (1 on reaching the target, else 0). TianJi trains it unchanged with
`spec.env.wrappers: [{entryPoint: gymnasium.wrappers:FlattenObservation}]`; the flattened
int64 Box is cast to float32 (docs/custom-envs.md)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GridWorldEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, render_mode=None, size: int = 5):
        self.size = size  # the side of the square grid
        # The agent's and the target's locations, each {0, ..., size-1}^2.
        self.observation_space = spaces.Dict({
            "agent": spaces.Box(0, size - 1, shape=(2,), dtype=int),
            "target": spaces.Box(0, size - 1, shape=(2,), dtype=int),
        })
        self._agent_location = np.array([-1, -1], dtype=int)
        self._target_location = np.array([-1, -1], dtype=int)
        self.action_space = spaces.Discrete(4)  # right, up, left, down
        self._action_to_direction = {0: np.array([1, 0]), 1: np.array([0, 1]),
                                     2: np.array([-1, 0]), 3: np.array([0, -1])}
        assert render_mode is None, "this copy of the tutorial leaves rendering out"

    def _get_obs(self):
        return {"agent": self._agent_location, "target": self._target_location}

    def _get_info(self):
        return {"distance": np.linalg.norm(self._agent_location - self._target_location, ord=1)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self._agent_location = self.np_random.integers(0, self.size, size=2, dtype=int)
        # The target's location at random, until it differs from the agent's.
        self._target_location = self._agent_location
        while np.array_equal(self._target_location, self._agent_location):
            self._target_location = self.np_random.integers(0, self.size, size=2, dtype=int)
        return self._get_obs(), self._get_info()

    def step(self, action):
        direction = self._action_to_direction[int(action)]
        self._agent_location = np.clip(self._agent_location + direction, 0, self.size - 1)
        terminated = np.array_equal(self._agent_location, self._target_location)
        reward = 1 if terminated else 0  # the tutorial's binary sparse reward
        return self._get_obs(), reward, terminated, False, self._get_info()
