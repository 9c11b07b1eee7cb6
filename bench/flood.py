"""Time to target while one actor floods its buffer: examples/cartpole-ppo.yaml run clean and
with actor-0-0's env code (bench/floodenv.py) sending valid, fresh fragments as itself, as fast
as one socket goes, for the whole run, in interleaved rounds on one machine.

Two controls split the flood's cost: `spin`, the same thread in actor-0-0 burning the CPU and
sending nothing (its CPU); `junk`, the flood's content sent at the actor's own rate in place of
its real fragments (its share of every batch, without the volume).

Per run: whether and when it reached its (confirmed) target, the other actor's samples sent per
second (actor-0-1: its throughput), what the flooder sent and lost over its fair share
(`dropped_over_share_by_sender`), refusals by reason, each worker's CPU bound
(`--cpu-limits`, local/cpulimits.py) and the load before it. `pairs`: per round each hostile
run's time to target over the clean one's, and their medians (docs/security.md: the others'
throughput and the time to target within 20 % of a clean run).

    python -m bench.flood [--pairs 3] [--budget-s 300] [--hostile flood,junk,spin]
                          [--cpu-limits shares] [--out docs/results/flood.json]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness import ROOT, emit, loadavg, run_job, stamp

JOB = ROOT / "examples" / "cartpole-ppo.yaml"
OTHER = "actor-0-1"
MODES = ("flood", "spin", "junk")
FRAMES = 100_000_000  # the runs stop at their target or their budget, not at the example's frame cap


def job_file(folder: Path, mode: str) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["env"]["wrappers"] = [{"entryPoint": "bench.floodenv:Flood", "kwargs": {"mode": mode}}]
    # CartPole's own bounds: the wrapper changes nothing an episode can be
    doc["spec"]["env"]["episodeBounds"] = {"maxSteps": 500, "rewardPerStep": [1, 1]}
    doc["spec"]["stop"]["envFrames"] = FRAMES
    path = folder / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one(folder: Path, mode: str, budget_s: float, tag: str, cpu_limits: str = "shares") -> dict:
    """One run; `mode`: off (clean), flood or spin (bench/floodenv.py); `cpu_limits`: the
    launcher's TIANJI_CPU_LIMITS (local/cpulimits.py)."""
    load = loadavg()
    run = run_job(job_file(folder, mode), [f"spec.stop.seconds={budget_s:g}"], folder / tag, timeout=budget_s + 240,
                  env={"TIANJI_CPU_LIMITS": cpu_limits})
    s = run.summary()
    last = run.records()[-1]
    other = (last.get("processes") or {}).get(OTHER) or {}
    t = last.get("t") or s["wall_seconds"]
    return {
        "hostile": mode, "exit_code": run.returncode, "load1_before": load[0],
        "reached_target": s["reached_target"], "seconds_to_target": s["seconds_to_target"],
        "frames_to_target": s["frames_to_target"], "wall_seconds": s["wall_seconds"],
        "other_actor_sent_sps": round(other.get("sent", 0.0) / t, 1) if t else None,
        "dropped_over_share_by_sender": s.get("dropped_over_share_by_sender", {}),
        "rejected_by_reason": s["rejected_by_reason"], "policy_lag": s["policy_lag"],
        "cpu_limits": s.get("cpu_limits"), "isolation": s.get("isolation"),
    }


def _ratios(clean: dict, hostile: dict) -> dict:
    ratio = (hostile["seconds_to_target"] / clean["seconds_to_target"]
             if clean["seconds_to_target"] and hostile["seconds_to_target"] else None)
    others = (hostile["other_actor_sent_sps"] / clean["other_actor_sent_sps"]
              if clean["other_actor_sent_sps"] else None)
    return {"time_to_target_ratio": ratio and round(ratio, 3),
            "other_actor_throughput_ratio": others and round(others, 3)}


def median_ratio(ratios: list) -> float | None:
    """The median time-to-target ratio, a run that missed its target counting as slower than any
    (None: the median itself missed, or no round had a clean run that reached it)."""
    ranked = [math.inf if r is None else r for r in ratios]
    m = statistics.median(ranked) if ranked else math.inf
    return None if math.isinf(m) else round(m, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="rounds: a clean run and one run per hostile mode each")
    ap.add_argument("--budget-s", type=float, default=300.0, help="each run's stop.seconds")
    ap.add_argument("--hostile", default="flood",
                    help="comma-separated, of flood, spin (the control: burning the CPU as the flood does, "
                         "sending nothing) and junk (the control: the flood's content at the actor's own rate)")
    ap.add_argument("--cpu-limits", choices=["off", "shares", "quota"], default="shares",
                    help="each worker's CPU bound, clean and hostile runs alike (TIANJI_CPU_LIMITS; needs root)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/)")
    a = ap.parse_args(argv)
    hostile = [m.strip() for m in a.hostile.split(",") if m.strip()]
    if not hostile or set(hostile) - set(MODES):
        ap.error(f"--hostile: one or more of {', '.join(MODES)}")
    runs, pairs = [], []
    with tempfile.TemporaryDirectory(prefix="tianji-flood-") as tmp:
        for i in range(a.pairs):
            modes = ["off", *hostile]
            order = modes[i % len(modes):] + modes[:i % len(modes)]  # each mode first in turn
            got = {mode: one(Path(tmp), mode, a.budget_s, f"{i}-{mode}", a.cpu_limits) for mode in order}
            runs += [{**got[m], "round": i + 1} for m in order]
            pairs.append({m: _ratios(got["off"], got[m]) for m in hostile})
    medians = {m: median_ratio([p[m]["time_to_target_ratio"] for p in pairs]) for m in hostile}
    emit({**stamp("flood", sys.argv[1:] if argv is None else argv), "job": str(JOB.relative_to(ROOT)),
          "cpu_limits": a.cpu_limits, "runs": runs, "pairs": pairs, "median_time_to_target_ratio": medians,
          "all_reached_target": all(r["reached_target"] for r in runs)}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
