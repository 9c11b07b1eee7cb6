"""A tiny user env package for TianJi: `env.imports: [reach_goal]` registers ReachGoal-v0."""
import gymnasium as gym

gym.register(id="ReachGoal-v0", entry_point="reach_goal.envs:ReachGoalEnv", max_episode_steps=50)
