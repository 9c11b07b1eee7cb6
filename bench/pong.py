"""Pong learning on a wall-clock budget: the return curve of a real `tianji run`. Prints one JSON object.

    python -m bench.pong --minutes 60                       # examples/pong-ppo.yaml
    python -m bench.pong --algo dqn --minutes 60            # examples/pong-dqn.yaml
    python -m bench.pong --minutes 3 --out /tmp/pong        # a short check that it runs

Trains the example for `--minutes` (no other stop rule) and writes into --out:
  curve.json   the 100-episode mean return against seconds and env frames (one row per
               metrics.jsonl record, i.e. per second), plus the run's summary;
  curve.png    return vs time, return vs frames, throughput by role (`tianji plot`);
  run/         the run directory itself (summary.json, metrics.jsonl, logs).
Printed: the learner's device, produced frames/s and consumed samples/s, the return at
the start and end and its best, and the first time the mean crossed -10 (if it did).

Sizing. With a GPU (torch.cuda) the learner gets it (`resources.learner.gpu=1`) and the
example's sizes stay. Without one, a preset for a small CPU box (`--preset cpu`, the
default then): one actor, the learner on one core with one torch thread (the example
asks for 4 cores: on 2 cores that is oversubscription), and smaller updates, so that
learning keeps up with a single actor (PPO: 2 epochs of 4 minibatches of 128 on batches
of 512; DQN: a smaller replay warm-up). `--preset none` runs the example as it is;
`--set` adds overrides on top. Frames are agent steps (4 emulator frames each).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, cpu_name, emit, gpu_name, loadavg, run_job, stamp

JOBS = {"ppo": ROOT / "examples" / "pong-ppo.yaml", "dqn": ROOT / "examples" / "pong-dqn.yaml"}
RANDOM_RETURN = -20.5  # a random policy's Pong score
GOAL_RETURN = -10.0
MILESTONES = (-10.0, 0.0, 10.0, 18.0)

PRESETS = {
    "cpu": {
        "common": ["spec.topology.actors=1", "spec.resources.actor.cpu=1", "spec.resources.learner.cpu=1",
                   "spec.resources.learner.threads=1", "spec.resources.buffer.cpu=0.5",
                   # 10 greedy episodes every 5 min, not the example's 30 s: on 2 cores the
                   # evaluator would otherwise take a quarter of a core from training
                   "spec.evaluation.intervalSeconds=300"],
        "ppo": ["spec.algorithm.batchSize=512", "spec.algorithm.minibatchSize=128", "spec.algorithm.epochs=2",
                "spec.env.fragmentLength=64", "spec.env.numEnvs=8"],
        "dqn": ["spec.algorithm.learningStarts=20000", "spec.algorithm.explorationFrames=250000",
                "spec.algorithm.targetUpdateInterval=500"],
    },
    "gpu": {"common": ["spec.resources.learner.gpu=1"], "ppo": [], "dqn": []},
    "none": {"common": [], "ppo": [], "dqn": []},
}


def device_info() -> dict:
    gpu = gpu_name()
    if gpu:
        return {"device": "cuda", "name": gpu, "cpus": os.cpu_count()}
    return {"device": "cpu", "name": cpu_name(), "cpus": os.cpu_count()}


def first_at(rows: list[dict], goal: float) -> float | None:
    """Seconds to the first record whose mean-100 (over at least 10 episodes) reached `goal`."""
    return next((r["t"] for r in rows if r["episodes"] >= 10 and r["mean_return"] >= goal), None)


def return_at(rows: list[dict], seconds: float) -> float | None:
    """The mean-100 of the last record at or before `seconds`."""
    before = [r["mean_return"] for r in rows if r["t"] <= seconds]
    return before[-1] if before else None


def curve(records: list[dict]) -> list[dict]:
    return [{"t": r["t"], "env_frames": r["env_frames"], "episodes": r["episodes"], "mean_return": r["mean_return"],
             "produced_fps": round(r.get("produced_fps", 0.0), 1), "consumed_sps": round(r.get("consumed_sps", 0.0), 1)}
            for r in records]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=sorted(JOBS), default="ppo")
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of the run")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="default: gpu when CUDA is there, else cpu")
    ap.add_argument("--out", help="output folder (default: a new temp folder)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    if not a.minutes > 0:
        ap.error("--minutes must be positive")
    dev = device_info()
    preset = a.preset or ("gpu" if dev["device"] == "cuda" else "cpu")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix=f"pong-{a.algo}-"))
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if (run_dir / "job.yaml").exists():
        ap.error(f"{run_dir} already holds a run")
    seconds = a.minutes * 60
    sets = [*PRESETS[preset]["common"], *PRESETS[preset][a.algo], "spec.stop.meanReturn=null",
            "spec.stop.envFrames=null", f"spec.stop.seconds={seconds:g}", *a.set]
    print(f"pong bench: {a.algo} for {a.minutes:g} min on {dev['device']} ({dev['name']}), preset {preset}; "
          f"run dir {run_dir}", file=sys.stderr)
    t0 = time.monotonic()
    run = run_job(JOBS[a.algo], sets, run_dir, timeout=seconds + 300)
    wall = time.monotonic() - t0
    if not (run_dir / "summary.json").exists():
        print(run.stderr[-3000:], file=sys.stderr)
        return 1
    summary = run.summary()
    rows = curve(run.records())
    rets = [r for r in rows if r["mean_return"] is not None]
    th = summary.get("throughput", {})
    result = {
        "bench": "pong", **stamp("pong", argv),
        "algo": a.algo, "job": str(JOBS[a.algo]), "preset": preset, "overrides": sets,
        **dev, "minutes": a.minutes, "wall_seconds": round(wall, 1), "exit_reason": summary.get("exit_reason"),
        "env_frames": summary.get("env_frames"), "episodes": summary.get("episodes"),
        "produced_fps": round(th.get("produced_fps", 0.0), 1), "consumed_sps": round(th.get("consumed_sps", 0.0), 1),
        "return_first": rets[0]["mean_return"] if rets else None,
        "return_last": rets[-1]["mean_return"] if rets else None,
        "return_best": max(r["mean_return"] for r in rets) if rets else None,
        "random_policy_return": RANDOM_RETURN, "goal_return": GOAL_RETURN,
        "seconds_to_goal": first_at(rets, GOAL_RETURN),
        # the goals: the first time the mean-100 reached each return, and the return at 20 / 60 min
        "seconds_to": {str(g): first_at(rets, g) for g in MILESTONES},
        "return_at_minutes": {str(m): return_at(rets, 60 * m) for m in (10, 20, 30, 60) if m <= a.minutes},
        "evaluation": summary.get("evaluation"),
        "policy_lag": summary.get("policy_lag"), "dropped_samples": summary.get("dropped_samples"),
        "restarts": summary.get("restarts"),
        "host": {"loadavg": loadavg()},
        "out": str(out),
    }
    (out / "curve.json").write_text(json.dumps({**result, "curve": rows, "summary": summary}, indent=1))
    try:
        from tianji.observability.plot import plot_run

        plot_run(run_dir, out / "curve.png")
        result["png"] = str(out / "curve.png")
    except Exception as e:  # noqa: BLE001 - the JSON is the result; a plot failure is reported, not fatal
        result["png_error"] = f"{type(e).__name__}: {e}"
    emit(result, indent=None)
    return 0 if summary.get("exit_reason") == "seconds" else 1


if __name__ == "__main__":
    sys.exit(main())
