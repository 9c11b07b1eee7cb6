"""Arrays each message kind carries, per algorithm (torch-free: the buffer imports this)."""

PPO_FRAGMENT = ("obs", "actions", "logp", "rewards", "dones", "terminated", "valid", "last_obs")
PPO_BATCH = PPO_FRAGMENT + ("versions",)
DQN_FRAGMENT = ("obs", "actions", "rewards", "dones", "terminated", "valid", "last_obs")
DQN_BATCH = ("obs", "actions", "returns", "next_obs", "discounts", "versions")

FRAGMENT = {"ppo": PPO_FRAGMENT, "dqn": DQN_FRAGMENT}
BATCH = {"ppo": PPO_BATCH, "dqn": DQN_BATCH}

# dtype of every per-step [T, N] fragment array
STEP_DTYPES = {"actions": "int64", "rewards": "float32", "dones": "bool", "terminated": "bool", "valid": "bool",
               "logp": "float32"}
