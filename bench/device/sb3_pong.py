"""Stable-Baselines3 PPO on Pong for a wall-clock budget: the peer run of bench/device/run.sh (d).

    python bench/device/sb3_pong.py --seconds 150 --envs 16 --device cuda --out pong-sb3.json

rl-zoo's Atari PPO settings (hyperparams/ppo.yml, atari): CnnPolicy, AtariWrapper (84x84 grey,
frame skip 4, noop reset, fire reset, episodic life), 4 stacked frames, n_steps 128, 4 epochs of
minibatches of 256, lr 2.5e-4 and clip 0.1 both annealed linearly (over 10M frames, as the TianJi
example's lrAnnealFrames), entropy 0.01, value 0.5; with
--envs subprocess envs (SubprocVecEnv) instead of rl-zoo's 8. The env is PongNoFrameskip-v4 (no
sticky actions), as TianJi's ALE/Pong-v5 without them. Frames are agent steps (4 emulator frames
each), TianJi's unit. The return is the mean of the last 100 whole games (Monitor sits under
AtariWrapper, so a game is 21 points, not one life). Writes one JSON: the curve (seconds, frames,
mean return), the totals and the settings. --tiny: small rollouts for a dry run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ANNEAL_FRAMES = 10_000_000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="small rollouts (a dry run)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    gym.register_envs(ale_py)
    # The policy runs on the GPU; the envs are the subprocesses: one torch thread here, so the main
    # process does not compete with them for the cores.
    torch.set_num_threads(1)
    t_start = time.monotonic()
    # "ale_py:" makes each env subprocess (forkserver) import ale_py, which registers the Atari ids.
    env = VecFrameStack(make_atari_env("ale_py:PongNoFrameskip-v4", n_envs=a.envs, seed=a.seed,
                                       vec_env_cls=SubprocVecEnv), n_stack=4)
    lin = lambda v: (lambda progress: progress * v)  # noqa: E731 - rl-zoo's lin_ schedules
    n_steps, batch = (16, 32) if a.tiny else (128, 256)
    settings = {"policy": "CnnPolicy", "n_steps": n_steps, "n_epochs": 4, "batch_size": batch,
                "learning_rate": "lin_2.5e-4", "clip_range": "lin_0.1", "ent_coef": 0.01, "vf_coef": 0.5,
                "n_envs": a.envs, "vec_env": "SubprocVecEnv", "frame_stack": 4, "env": "PongNoFrameskip-v4"}
    model = PPO("CnnPolicy", env, n_steps=n_steps, n_epochs=4, batch_size=batch, learning_rate=lin(2.5e-4),
                clip_range=lin(0.1), ent_coef=0.01, vf_coef=0.5, device=a.device, seed=a.seed, verbose=0)
    rows: list[dict] = []
    t_learn: list[float] = []

    class Clock(BaseCallback):
        """Stops at the budget; one curve row a second (frames, mean of the last 100 games)."""

        def _on_training_start(self) -> None:
            t_learn.append(time.monotonic())

        def _on_step(self) -> bool:
            t = time.monotonic() - t_learn[0]
            if not rows or t - rows[-1]["t"] >= 1.0:
                buf = self.model.ep_info_buffer
                rows.append({"t": round(t, 2), "env_frames": int(self.num_timesteps), "episodes": len(buf),
                             "mean_return": (sum(e["r"] for e in buf) / len(buf)) if buf else None})
            return t < a.seconds

    # The schedules anneal over 10M frames, as the TianJi example's lrAnnealFrames; the clock stops it.
    model.learn(total_timesteps=ANNEAL_FRAMES, callback=Clock())
    wall = time.monotonic() - t_learn[0]
    env.close()
    buf = model.ep_info_buffer
    result = {"bench": "sb3_pong", "device": str(model.device),
              "device_name": torch.cuda.get_device_name(0) if model.device.type == "cuda" else None,
              "sb3_version": __import__("stable_baselines3").__version__, "torch": torch.__version__,
              "seconds": a.seconds, "learn_wall_seconds": round(wall, 1),
              "startup_seconds": round(t_learn[0] - t_start, 1), "env_frames": int(model.num_timesteps),
              "frames_per_second": model.num_timesteps / max(wall, 1e-9),
              "episodes_in_window": len(buf),
              "mean_return": (sum(e["r"] for e in buf) / len(buf)) if buf else None,
              "settings": settings, "cores": os.cpu_count(), "curve": rows}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
