"""A user policy for TianJi (`model.entryPoint: reach_goal.models:Net`).

The constructor contract: Net(observation_space, action_space, config), config being
spec.model.config; forward(obs) -> (logits, value) and logits(obs) for PPO.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, observation_space, action_space, config: dict):
        super().__init__()
        width = int(config.get("width", 32))
        d = int(np.prod(observation_space.shape))
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(d, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.pi = nn.Linear(width, int(action_space.n))
        self.vf = nn.Linear(width, 1)
        nn.init.orthogonal_(self.pi.weight, 0.01)  # near-uniform first policy, as the built-ins
        nn.init.zeros_(self.pi.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.trunk(obs.float())
        return self.pi(z), self.vf(z).squeeze(-1)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.pi(self.trunk(obs.float()))
