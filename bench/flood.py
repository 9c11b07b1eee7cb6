"""Time to target while one actor floods its buffer: examples/cartpole-ppo.yaml run clean and
with actor-0-0's env code (bench/floodenv.py) sending valid, fresh fragments as itself, as fast
as one socket goes, for the whole run, in interleaved pairs on one machine.

`--hostile spin` is the control: the same thread in actor-0-0 burning the CPU, sending nothing.

Per run: whether and when it reached its (confirmed) target, the other actor's samples sent per
second (actor-0-1: its throughput), what the flooder sent and lost over its fair share
(`dropped_over_share_by_sender`), refusals by reason, and the load before it. `pairs`: per
pair the flood run's time to target over the clean one's, and their median (docs/security.md:
the others' throughput and the time to target within 20 % of a clean run).

    python -m bench.flood [--pairs 3] [--budget-s 300] [--out docs/results/flood.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from bench.harness import ROOT, emit, loadavg, run_job, stamp

JOB = ROOT / "examples" / "cartpole-ppo.yaml"
OTHER = "actor-0-1"


def job_file(folder: Path, mode: str) -> Path:
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["env"]["wrappers"] = [{"entryPoint": "bench.floodenv:Flood", "kwargs": {"mode": mode}}]
    # CartPole's own bounds: the wrapper changes nothing an episode can be
    doc["spec"]["env"]["episodeBounds"] = {"maxSteps": 500, "rewardPerStep": [1, 1]}
    path = folder / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one(folder: Path, mode: str, budget_s: float, tag: str) -> dict:
    """One run; `mode`: off (clean), flood or spin (bench/floodenv.py)."""
    load = loadavg()
    run = run_job(job_file(folder, mode), [f"spec.stop.seconds={budget_s:g}"], folder / tag, timeout=budget_s + 240)
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
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=300.0, help="each run's stop.seconds")
    ap.add_argument("--hostile", choices=["flood", "spin"], default="flood",
                    help="spin: the control, actor-0-0 burning the CPU as the flood does, sending nothing")
    ap.add_argument("--out", help="also write the JSON here (docs/results/)")
    a = ap.parse_args(argv)
    runs, pairs = [], []
    with tempfile.TemporaryDirectory(prefix="tianji-flood-") as tmp:
        for i in range(a.pairs):
            order = ("off", a.hostile) if i % 2 == 0 else (a.hostile, "off")  # interleaved
            got = {mode: one(Path(tmp), mode, a.budget_s, f"{i}-{mode}") for mode in order}
            runs += [got[m] for m in order]
            clean, hostile = got["off"], got[a.hostile]
            ratio = (hostile["seconds_to_target"] / clean["seconds_to_target"]
                     if clean["seconds_to_target"] and hostile["seconds_to_target"] else None)
            others = (hostile["other_actor_sent_sps"] / clean["other_actor_sent_sps"]
                      if clean["other_actor_sent_sps"] else None)
            pairs.append({"time_to_target_ratio": ratio and round(ratio, 3),
                          "other_actor_throughput_ratio": others and round(others, 3)})
    ratios = [p["time_to_target_ratio"] for p in pairs if p["time_to_target_ratio"]]
    emit({**stamp("flood", sys.argv[1:] if argv is None else argv), "job": str(JOB.relative_to(ROOT)),
          "runs": runs, "pairs": pairs,
          "median_time_to_target_ratio": round(statistics.median(ratios), 3) if ratios else None,
          "all_reached_target": all(r["reached_target"] for r in runs)}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
