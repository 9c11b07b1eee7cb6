"""Staleness ablation in the spirit of the TianJi paper's Fig. 6(d): fresh vs stale samples, with and
without off-policy correction, PPO on CartPole (examples/cartpole-ppo.yaml).

    New (1:1)    actors take every learner version (staleness.publishEvery = 1): each behaviour
                 policy's samples feed about one update;
    Stale (1:8)  actors get parameters once every 8 learner versions (publishEvery = 8), so one
                 behaviour policy's samples feed 8 consecutive updates (policy lag up to ~8 + queueing;
                 maxPolicyLag is raised to 16 so the buffer keeps them);

each with `algorithm.offPolicyCorrection` none and vtrace, N seeds each, side by side in one
invocation. Per run: seconds and env frames to the target (first metrics.jsonl record whose mean-100
return reaches it; frames are read at that record), and the distribution of the policy lag of
consumed samples (summary.json's per-sample histogram and min/mean/max). Prints one JSON object.

    python -m bench.staleness [--seeds 3] [--budget 300] [--target 475] [--settings new-none,stale-vtrace]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, emit, run_job, stamp

JOB = ROOT / "examples" / "cartpole-ppo.yaml"
FRESHNESS = {"new": ["spec.staleness.publishEvery=1"],
             "stale": ["spec.staleness.publishEvery=8", "spec.staleness.maxPolicyLag=16"]}
CORRECTIONS = ("none", "vtrace")
SETTINGS = [f"{f}-{c}" for f in FRESHNESS for c in CORRECTIONS]


def run_one(setting: str, seed: int, budget: float, target: float) -> dict:
    fresh, corr = setting.split("-")
    run = Path(tempfile.mkdtemp(prefix=f"staleness-{setting}-{seed}-"))
    sets = [f"spec.env.seed={seed}", f"spec.stop.meanReturn={target}", f"spec.stop.seconds={budget}",
            "spec.stop.envFrames=100000000", f"spec.algorithm.offPolicyCorrection={corr}", *FRESHNESS[fresh]]
    done = run_job(JOB, sets, run, timeout=budget + 180)
    s = done.summary()
    hit = next((r for r in done.records() if r["mean_return"] is not None and r["mean_return"] >= target), None)
    reached = s["reached_target"]
    return {"seed": seed, "reached": reached,
            "seconds_to_target": s["seconds_to_target"] if reached else None,
            "frames_to_target": (hit or {}).get("env_frames", s["env_frames"]) if reached else None,
            "final_mean_return": round(s["mean_return"], 1), "env_frames": s["env_frames"],
            "wall_seconds": s["wall_seconds"], "policy_lag": s["policy_lag"],
            "policy_lag_hist": s.get("policy_lag_hist"), "dropped_samples": s["dropped_samples"],
            "learner_stats": s.get("learner_stats"), "run_dir": str(run)}


def aggregate(runs: list[dict]) -> dict:
    done = [r for r in runs if r["reached"]]
    med = lambda k: statistics.median(r[k] for r in done) if done else None  # noqa: E731
    hist: dict[str, int] = {}
    for r in runs:
        for k, n in (r["policy_lag_hist"] or {}).items():
            hist[k] = hist.get(k, 0) + n
    return {"reached": f"{len(done)}/{len(runs)}", "median_seconds_to_target": med("seconds_to_target"),
            "median_frames_to_target": med("frames_to_target"),
            "mean_final_return": round(statistics.mean(r["final_mean_return"] for r in runs), 1),
            "policy_lag_mean": round(statistics.mean(r["policy_lag"]["mean"] for r in runs), 3),
            "policy_lag_max": max(r["policy_lag"]["max"] for r in runs), "policy_lag_hist": hist}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds per setting (1..N)")
    p.add_argument("--budget", type=float, default=300, help="seconds per run")
    p.add_argument("--target", type=float, default=475, help="mean-100 return to reach")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"subset of {','.join(SETTINGS)}")
    a = p.parse_args()
    settings = [s for s in a.settings.split(",") if s]
    bad = set(settings) - set(SETTINGS)
    if bad:
        p.error(f"unknown settings {sorted(bad)}; choose from {SETTINGS}")
    runs: dict[str, list[dict]] = {s: [] for s in settings}
    for seed in range(1, a.seeds + 1):  # settings interleaved per seed: machine load hits them alike
        for s in settings:
            runs[s].append(run_one(s, seed, a.budget, a.target))
            shown = ("reached", "seconds_to_target", "frames_to_target", "final_mean_return")
            print(f"{s} seed {seed}: {json.dumps({k: runs[s][-1][k] for k in shown})}", file=sys.stderr)
    emit({**stamp("staleness"), "job": str(JOB.relative_to(ROOT)), "target": a.target, "budget_s": a.budget,
          "seeds": a.seeds, "settings": {s: {"summary": aggregate(r), "runs": r} for s, r in runs.items()}}, indent=2)


if __name__ == "__main__":
    main()
