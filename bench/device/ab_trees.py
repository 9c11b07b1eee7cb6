"""Pong PPO in two arms, side by side on one machine: this tree against another tree (a change
measured against the code before it), or against itself with other settings.

    python -m bench.device.ab_trees [--base DIR] [--base-set K=V ...] [--tree-set K=V ...]
                                    [--actors 8] [--rounds 2] [--seconds 35] [--out DIR] [--dry-run]

`--base DIR`: a folder holding the base tree's `worker/` (the device tool sends one tree, so the
other travels as a copy: `git worktree add /tmp/base REV`, copy its worker/ into an ignored folder
of this repo and carry it); without it both arms run this tree. `--base-set` / `--tree-set`: `--set`
overrides of one arm only (for example spec.env.fragmentLength=32). Each round runs the base arm,
then the tree arm, with the scaling step's overrides (one GPU learner where there is a GPU, one
buffer, one core per actor); the tree arm is traced (bench/pipeline_trace.py). Writes --name
(default ab-trees-pong-ppo.json). `--dry-run`: small batches on the CPU, one short round
(tests/bench/test_device_dryrun.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.device.run import ROOT, Context, one_learner_sets, steady_rates, tianji_run


def _rev(tree: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a folder holding the base tree's worker/ (default: this tree)")
    ap.add_argument("--base-set", action="append", default=[], metavar="KEY=VALUE", help="the base arm only")
    ap.add_argument("--tree-set", action="append", default=[], metavar="KEY=VALUE", help="the tree arm only")
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=35.0)
    ap.add_argument("--out", help="output folder (default docs/device)")
    ap.add_argument("--label", default="", help="what the base is, for the record (e.g. its commit)")
    ap.add_argument("--dry-run", action="store_true", help="small batches on the CPU, briefly")
    ap.add_argument("--name", default="ab-trees-pong-ppo.json", help="the output file's name")
    a = ap.parse_args(argv)
    ctx = Context(argparse.Namespace(dry_run=a.dry_run, out=a.out, budget=None), argv)
    ctx.stamp["command"] = " ".join(["python -m bench.device.ab_trees", *argv])
    try:
        return _compare(ctx, a)
    finally:
        ctx.remove_work()


def _compare(ctx: Context, a: argparse.Namespace) -> int:
    from bench.pipeline_trace import analyse
    from tianji.runtime.trace import ENV_TRACE

    base_env = {}
    if a.base:
        base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(a.base).resolve() / "worker"),
                                                               os.environ.get("PYTHONPATH")]))
    overrides = one_learner_sets(ctx, a.actors)
    arms = {"base": (a.base_set, base_env), "tree": (a.tree_set, {})}
    points = []
    for i in range(a.rounds):
        for arm in ("base", "tree"):
            trace = ctx.work / f"trace-{arm}-{i}"
            sets, env = arms[arm]
            env = {**env, ENV_TRACE: str(trace)} if arm == "tree" else env
            res = tianji_run(ctx, f"ab-{arm}-{i}", [*overrides, *sets], a.seconds, env_extra=env)
            res.update(arm=arm, round=i, arm_sets=sets, steady=steady_rates(res.get("rows", [])))
            if arm == "tree":
                res["trace"] = analyse(trace)
            points.append(res)
            print(arm, i, res["steady"], res.get("policy_lag"), res.get("dropped_samples"), flush=True)
    table = [{"arm": p["arm"], "round": p["round"], **p["steady"],
              "policy_lag_mean": (p.get("policy_lag") or {}).get("mean"), "dropped": p.get("dropped_samples")}
             for p in points if "error" not in p]
    ctx.write(a.name, {"base": a.label or (str(a.base) if a.base else "this tree"),
                                         "tree": _rev(ROOT), "base_sets": a.base_set, "tree_sets": a.tree_set,
                                         "actors": a.actors, "table": table, "points": points})
    return 0


if __name__ == "__main__":
    sys.exit(main())
