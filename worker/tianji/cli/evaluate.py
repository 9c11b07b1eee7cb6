"""`tianji eval CHECKPOINT --episodes N`: mean/std return and mean length of the policy in a checkpoint.

The evaluation itself is tianji.runtime.evaluation's (the evaluator role uses it too); DQN
acts ε-greedily (--epsilon, default DQN_EVAL_EPSILON), PPO at its mode.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tianji.runtime.evaluation import evaluate


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, or a run dir → its newest learner checkpoint."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.glob("checkpoints/*/ckpt-*.pt"), key=lambda q: q.name)
    if not found:
        raise FileNotFoundError(f"{path}: no checkpoint file and no checkpoints/*/ckpt-*.pt under it")
    return found[-1]


def eval_command(a: argparse.Namespace) -> int:
    if a.episodes < 1:
        print("tianji eval: --episodes must be >= 1", file=sys.stderr)
        return 2
    try:
        res = evaluate(resolve_checkpoint(a.checkpoint), a.episodes, a.seed, a.epsilon)
    except (FileNotFoundError, ValueError) as e:
        print(f"tianji eval: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{res['job']} v{res['policy_version']}: {res['episodes']} episodes, "
              f"return {res['mean_return']:.1f} ± {res['std_return']:.1f} (min {res['min_return']:.0f}, "
              f"max {res['max_return']:.0f}; epsilon {res['epsilon']:g}), mean length {res['mean_length']:.1f} steps "
              f"({res['episodes'] // len(res['episodes_per_env'])} from each of {len(res['episodes_per_env'])} envs)")
    return 0
