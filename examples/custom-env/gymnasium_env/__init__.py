"""Gymnasium's custom-environment tutorial, as its package registers it
(https://gymnasium.farama.org/introduction/create_custom_env/): `env.imports: [gymnasium_env]`."""
import gymnasium as gym

gym.register(id="gymnasium_env/GridWorld-v0", entry_point="gymnasium_env.grid_world:GridWorldEnv",
             max_episode_steps=300)
