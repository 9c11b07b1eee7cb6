"""Pong PPO from two source trees, side by side on one machine: a change measured against the code
before it (the device tool sends one tree, so the other travels as a copy of its worker/ folder).

    python -m bench.device.ab_trees --base DIR [--actors 8] [--rounds 2] [--seconds 35] [--out DIR]

DIR holds the base tree's `worker/` (for example `git worktree add /tmp/base REV`, then copy its
worker/ into an ignored folder of this repo and carry it). Each round runs the base, then this
tree, with the scaling step's overrides (one GPU learner where there is a GPU, one buffer, one core
per actor); this tree's runs are traced (bench/pipeline_trace.py). Writes ab-trees-pong-ppo.json.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.device.run import ROOT, Context, gpu_sets, steady_rates, tianji_run


def _rev(tree: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="a folder holding the base tree's worker/")
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=35.0)
    ap.add_argument("--out", help="output folder (default docs/device)")
    ap.add_argument("--label", default="", help="what the base is, for the record (e.g. its commit)")
    a = ap.parse_args(argv)
    from bench.pipeline_trace import analyse
    from tianji.runtime.trace import ENV_TRACE

    ctx = Context(argparse.Namespace(dry_run=False, out=a.out, budget=None), argv)
    ctx.stamp["command"] = " ".join(["python -m bench.device.ab_trees", *argv])
    base_path = os.pathsep.join(filter(None, [str(Path(a.base).resolve() / "worker"), os.environ.get("PYTHONPATH")]))
    overrides = [*gpu_sets(ctx), f"spec.topology.actors={a.actors}", "spec.topology.buffers=1",
                 "spec.topology.learners=1", "spec.resources.actor.cpu=1", "spec.resources.buffer.cpu=1",
                 "spec.resources.learner.cpu=1", "spec.resources.learner.threads=1"]
    points = []
    for i in range(a.rounds):
        for arm in ("base", "tree"):
            trace = ctx.work / f"trace-{arm}-{i}"
            env = {"PYTHONPATH": base_path} if arm == "base" else {ENV_TRACE: str(trace)}
            res = tianji_run(ctx, f"ab-{arm}-{i}", overrides, a.seconds, env_extra=env)
            res.update(arm=arm, round=i, steady=steady_rates(res.get("rows", [])))
            if arm == "tree":
                res["trace"] = analyse(trace)
            points.append(res)
            print(arm, i, res["steady"], res.get("policy_lag"), res.get("dropped_samples"), flush=True)
    table = [{"arm": p["arm"], "round": p["round"], **p["steady"],
              "policy_lag_mean": (p.get("policy_lag") or {}).get("mean"), "dropped": p.get("dropped_samples")}
             for p in points if "error" not in p]
    ctx.write("ab-trees-pong-ppo.json", {"base": a.label or str(a.base), "tree": _rev(ROOT), "actors": a.actors,
                                         "table": table, "points": points})
    return 0


if __name__ == "__main__":
    sys.exit(main())
