"""HalfCheetah-v5 with PPO (continuous actions) for a fixed budget: the return it reaches.

Runs `tianji run examples/halfcheetah-ppo.yaml` with the budget as its stop rule
(env frames and wall seconds, whichever comes first) and prints one JSON object:
frames, wall seconds, the mean of the last 100 finished episodes at the end,
and that mean every ~10 % of the run (from metrics.jsonl, 1 s records).

    python -m bench.mujoco [--frames 200000] [--seconds 600] [--seed 1]

Needs the optional extra (`pip install -e '.[mujoco]'`); without it the result
says so instead of failing.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, emit, run_job, stamp

JOB = ROOT / "examples" / "halfcheetah-ppo.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = {**stamp("mujoco"), "job": str(JOB.relative_to(ROOT)), "env": "HalfCheetah-v5", "budget_frames": a.frames,
           "budget_seconds": a.seconds, "seed": a.seed}
    if importlib.util.find_spec("mujoco") is None:
        out["unavailable"] = "the mujoco wheel is not installed (pip install -e '.[mujoco]')"
        emit(out, indent=None)
        return 0
    with tempfile.TemporaryDirectory(prefix="tianji-mujoco-") as tmp:
        run = Path(tmp) / "run"
        # the temp dir is the working directory too: MuJoCo writes MUJOCO_LOG.TXT there
        p = run_job(JOB, [f"spec.stop.envFrames={a.frames}", f"spec.stop.seconds={a.seconds}",
                          f"spec.env.seed={a.seed}"], run, cwd=tmp, timeout=a.seconds + 180)
        if not (run / "summary.json").is_file():
            out["error"] = p.stderr[-2000:]
            emit(out, indent=None)
            return 1
        s = p.summary()
        records = p.records()
    step = max(1, len(records) // 10)
    out.update(env_frames=s["env_frames"], wall_seconds=s["wall_seconds"], episodes=s["episodes"],
               mean_return=s["mean_return"], exit_reason=s["exit_reason"], policy_lag=s["policy_lag"],
               throughput=s["throughput"], rejected_messages=s["rejected_messages"],
               curve=[{"t": r["t"], "env_frames": r["env_frames"], "mean_return": r["mean_return"]}
                      for r in records[step - 1::step]])
    emit(out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
