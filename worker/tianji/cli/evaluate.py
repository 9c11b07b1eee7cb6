"""`tianji eval CHECKPOINT --episodes N`: mean/std return of the greedy policy in a checkpoint.

The checkpoint carries its job manifest, so the model and env are rebuilt
exactly; it is read with `torch.load(weights_only=True)` (checkpoint.load).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from tianji.runtime import checkpoint
from tianji.control.spec import parse_job


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, or a run dir → its newest learner checkpoint."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.glob("checkpoints/*/ckpt-*.pt"), key=lambda q: q.name)
    if not found:
        raise FileNotFoundError(f"{path}: no checkpoint file and no checkpoints/*/ckpt-*.pt under it")
    return found[-1]


def evaluate(ckpt_path: Path, episodes: int, seed: int) -> dict:
    import torch

    from tianji.envs import env_info, make_vec_env
    from tianji.algos.models import build_model

    torch.set_num_threads(1)
    state = checkpoint.load(ckpt_path)
    if "manifest" not in state:
        raise ValueError(f"{ckpt_path}: checkpoint has no job manifest")
    job = parse_job(yaml.safe_load(state["manifest"]), f"{ckpt_path}:manifest")
    env = make_vec_env(job.spec.env, min(episodes, 8))
    info = env_info(env)
    model = build_model(job.spec.algorithm, job.spec.model, info, job.spec.env.seed)
    model.load_state_dict(state["model"])
    model.eval()
    obs, _ = env.reset(seed=seed)
    ret = np.zeros(env.num_envs)
    done_eps: list[float] = []
    with torch.inference_mode():
        while len(done_eps) < episodes:
            x = torch.from_numpy(obs)
            q = model.logits(x) if job.spec.algorithm.name == "ppo" else model(x)
            # greedy: the argmax, or for continuous actions the Gaussian's mean clipped to the Box
            a = np.clip(q.numpy(), info.act_low, info.act_high) if info.continuous else q.argmax(-1).numpy()
            obs, r, term, trunc, inf = env.step(a)
            ret += r
            ended = inf.get("episode_end", term | trunc) if isinstance(inf, dict) else term | trunc
            for i in np.nonzero(ended)[0]:
                done_eps.append(float(ret[i]))
                ret[i] = 0.0
    env.close()
    rets = np.array(done_eps[:episodes])
    return {"checkpoint": str(ckpt_path), "job": job.name, "env": job.spec.env.id,
            "policy_version": int(state["policy_version"]), "episodes": episodes,
            "mean_return": float(rets.mean()), "std_return": float(rets.std()),
            "min_return": float(rets.min()), "max_return": float(rets.max())}


def eval_command(a: argparse.Namespace) -> int:
    if a.episodes < 1:
        print("tianji eval: --episodes must be >= 1", file=sys.stderr)
        return 2
    try:
        res = evaluate(resolve_checkpoint(a.checkpoint), a.episodes, a.seed)
    except (FileNotFoundError, ValueError) as e:
        print(f"tianji eval: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{res['job']} v{res['policy_version']}: {res['episodes']} episodes, "
              f"return {res['mean_return']:.1f} ± {res['std_return']:.1f} (min {res['min_return']:.0f}, "
              f"max {res['max_return']:.0f})")
    return 0
