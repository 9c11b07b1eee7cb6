"""How long a whole game of Pong is in Sample Factory's own Atari env stack (agent steps).

    bench/peers/.venv-sample-factory/bin/python bench/peers/sf_game_length.py

Plays 2 games each with a uniformly random policy, always NOOP and always UP through
`sf_examples.atari.atari_utils.make_atari_env` (its wrappers: no-op reset, frame skip 4,
episodic life, clipped rewards, 84x84, 4 stacked frames) and prints one JSON line per policy:
the score and length of each game. Sample Factory's reported episode returns can be checked
against it: a mean reported before any env could have played this many steps is not of whole games.
"""
import json
from types import SimpleNamespace

import ale_py  # noqa: F401  registers PongNoFrameskip-v4 with gymnasium
import numpy as np
from sf_examples.atari.atari_utils import make_atari_env


def play(env, policy: str, rng, seed: int) -> dict:
    env.reset(seed=seed)
    score, steps = 0.0, 0
    while True:
        a = int(rng.integers(env.action_space.n)) if policy == "random" else (0 if policy == "noop" else 2)
        _, r, term, trunc, info = env.step(a)
        score, steps = score + r, steps + 1
        if term or trunc:
            return {"score": score, "agent_steps": steps, "emulator_frames": int(info["episode"]["l"][0])}


def main() -> None:
    env = make_atari_env("atari_pong", SimpleNamespace(env_frameskip=4, env_framestack=4), None)
    rng = np.random.default_rng(0)
    for policy in ("random", "noop", "up"):
        print(json.dumps({"policy": policy, "games": [play(env, policy, rng, seed) for seed in (0, 1)]}))


if __name__ == "__main__":
    main()
