"""Learner groups: synchronous gradient all-reduce vs asynchronous parameter averaging.

For each seed, runs examples/cartpole-{algo}.yaml with `groups` groups under
spec.topology.groupSync.mode = allreduce and = average, one after the other
(alternating, so slow drifts of a shared machine's load hit both), and reports
consumed samples/s, env frames and seconds to mean-100 >= 475 from summary.json,
plus the load average before each run. Prints one JSON object.

    python -m bench.groupsync [--algo ppo] [--groups 2] [--seeds 1,2] [--interval 20] [--budget-s 300]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, emit, run_job, stamp

MODES = ("allreduce", "average")


def run(algo: str, mode: str, groups: int, seed: int, interval: int, budget_s: float) -> dict:
    rd = Path(tempfile.mkdtemp(prefix=f"groupsync-{mode}-"))
    sets = [f"spec.topology.groups={groups}", "spec.topology.actors=1", f"spec.env.seed={seed}",
            f"spec.topology.groupSync.mode={mode}", f"spec.topology.groupSync.intervalUpdates={interval}",
            "spec.stop.meanReturn=475", f"spec.stop.seconds={budget_s}", "spec.stop.envFrames=2000000"]
    load = os.getloadavg()[0]
    p = run_job(ROOT / "examples" / f"cartpole-{algo}.yaml", sets, rd, timeout=budget_s + 180)
    try:
        s = p.summary()
    except (OSError, ValueError):
        return {"mode": mode, "seed": seed, "error": p.stderr[-800:]}
    return {"mode": mode, "seed": seed, "load1_before": round(load, 2), "reached_target": s["reached_target"],
            "seconds_to_target": s["seconds_to_target"], "wall_seconds": round(s["wall_seconds"], 1),
            "env_frames": s["env_frames"], "consumed_sps": round(s["throughput"]["consumed_sps"]),
            "exit_reason": s["exit_reason"], "run_dir": str(rd)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="ppo", choices=("ppo", "dqn"))
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--interval", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300)
    a = ap.parse_args()
    runs = []
    for i, seed in enumerate(int(x) for x in a.seeds.split(",")):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            runs.append(run(a.algo, mode, a.groups, seed, a.interval, a.budget_s))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    summary = {}
    for mode in MODES:
        ok = [r for r in runs if r["mode"] == mode and "error" not in r]
        summary[mode] = {
            "consumed_sps_median": statistics.median(r["consumed_sps"] for r in ok) if ok else None,
            "seconds_to_target": [r["seconds_to_target"] for r in ok],
            "reached": sum(bool(r["reached_target"]) for r in ok), "runs": len(ok)}
    emit({**stamp("groupsync"), "algo": a.algo, "groups": a.groups, "interval_updates": a.interval,
          "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
