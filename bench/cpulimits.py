"""What each worker's CPU bound costs a clean run: the same jobs under TIANJI_CPU_LIMITS=off, shares
and quota (worker/tianji/local/cpulimits.py), in interleaved rounds on one machine, as root.

Per run: time to the confirmed target, env frames, consumed samples/s and the load before it;
per job and mode, the median time to target and its ratio to `off` per round. The hostile side
(what a bound buys against a flooding actor) is bench/flood.py's.

    python -m bench.cpulimits [--jobs examples/cartpole-ppo.yaml,examples/cartpole-dqn.yaml]
                              [--rounds 3] [--budget-s 120] [--out docs/results/cpu-limits.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, emit, loadavg, run_job, stamp

MODES = ("off", "shares", "quota")


def one(job: Path, mode: str, budget_s: float, run_dir: Path) -> dict:
    load = loadavg()
    run = run_job(job, [f"spec.stop.seconds={budget_s:g}"], run_dir, timeout=budget_s + 240,
                  env={"TIANJI_CPU_LIMITS": mode})
    s = run.summary()
    return {"job": str(job.relative_to(ROOT)), "mode": mode, "exit_code": run.returncode,
            "load1_before": load[0], "reached_target": s["reached_target"],
            "seconds_to_target": s["seconds_to_target"], "frames_to_target": s["frames_to_target"],
            "consumed_sps": s["throughput"]["consumed_sps"], "cpu_limits": s.get("cpu_limits")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="examples/cartpole-ppo.yaml,examples/cartpole-dqn.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=120.0, help="each run's stop.seconds")
    ap.add_argument("--out", help="also write the JSON here (docs/results/)")
    a = ap.parse_args(argv)
    jobs = [ROOT / j.strip() for j in a.jobs.split(",") if j.strip()]
    runs = []
    with tempfile.TemporaryDirectory(prefix="tianji-cpulimits-") as tmp:
        for i in range(a.rounds):
            order = MODES[i % 3:] + MODES[:i % 3]  # each mode first in turn
            for job in jobs:
                for mode in order:
                    runs.append({**one(job, mode, a.budget_s, Path(tmp) / f"{job.stem}-{i}-{mode}"), "round": i + 1})
    summary = {}
    for job in jobs:
        name = str(job.relative_to(ROOT))
        mine = [r for r in runs if r["job"] == name]
        per = {}
        for mode in MODES:
            times = [r["seconds_to_target"] for r in mine if r["mode"] == mode and r["reached_target"]]
            ratios = []
            for i in range(1, a.rounds + 1):
                t = {r["mode"]: r["seconds_to_target"] for r in mine if r["round"] == i}
                if t.get(mode) and t.get("off"):
                    ratios.append(round(t[mode] / t["off"], 3))
            per[mode] = {"reached": len(times), "runs": a.rounds,
                         "median_seconds_to_target": round(statistics.median(times), 2) if times else None,
                         "over_off_per_round": ratios}
        summary[name] = per
    emit({**stamp("cpulimits", sys.argv[1:] if argv is None else argv), "runs": runs, "summary": summary}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
