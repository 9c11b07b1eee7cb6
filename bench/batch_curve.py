"""Frames to target against effective batch size: the curve the planner charges more learner
groups with (worker/tianji/control/planner/batchcurve.py reads the JSON this writes).

W synchronised learners of batch B make each gradient step over W·B samples: one learner with
batch W·B and minibatch W·b (b the spec's minibatch) takes the same gradient steps per update, at
the same learning rate (the planner does not scale it with W). So for each multiple m of the
job's batch, and each seed, this runs the job once through `tianji run` with batchSize = m·B,
minibatchSize = m·b, one group of `--actors` actors, and records the env frames to the job's
target (the first metrics record whose mean-100 over 100 episodes meets spec.stop.meanReturn;
the summary's frames where none does). A run that ends without the target gives a lower bound
(`reached: false`). Frames are a count, not a rate, so a busy machine slows the runs without
moving the figure much; the load average before each run and the run's mean policy lag (which
a busy machine can change) are recorded beside it.

    python -m bench.batch_curve --job cartpole-ppo --multiples 1,2,4,8 --seeds 1,2 --max-seconds 120
    python -m bench.batch_curve --job acrobot-ppo --multiples 1,2,4 --seeds 1,2 --max-seconds 150
    python -m bench.batch_curve --job cartpole-ppo ... --resume docs/results/batch-curve-cartpole-ppo.json

A run whose learner never published a policy is an error, not a point (a broken run says nothing
about batch sizes); `--resume FILE` keeps an earlier output's good runs and runs only the rest.

Writes docs/results/batch-curve-<job>.json (`--out` another path, `--out -` none).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import RESULTS, ROOT, emit, host, run_job, stamp

# name -> job file: the jobs whose curves the planner cites (acrobot: rl-baselines3-zoo's settings).
JOBS = {"cartpole-ppo": "examples/cartpole-ppo.yaml", "acrobot-ppo": "bench/jobs/acrobot-ppo-rlzoo.yaml"}
WINDOW = 100  # episodes in the stop rule's mean


def frames_at_target(records: list[dict], target: float) -> int | None:
    """Env frames of the first record whose mean over a full window meets `target`."""
    for r in records:
        if (r.get("episodes") or 0) >= WINDOW and r.get("mean_return") is not None and r["mean_return"] >= target:
            return int(r["env_frames"])
    return None


def run(job_path: Path, base: dict, multiple: int, seed: int, actors: int, max_seconds: float,
        max_frames: int) -> dict:
    batch, minibatch = base["batch"] * multiple, base["minibatch"] * multiple
    rd = Path(tempfile.mkdtemp(prefix=f"batchcurve-{job_path.stem}-{batch}-"))
    sets = [f"spec.algorithm.batchSize={batch}", f"spec.algorithm.minibatchSize={minibatch}",
            f"spec.env.seed={seed}", "spec.dependencies=relaxed",  # the planner's curve: it plans relaxed jobs
            "spec.topology.groups=1", f"spec.topology.actors={actors}",
            "spec.topology.buffers=1", "spec.topology.learners=1", f"spec.stop.seconds={max_seconds}",
            f"spec.stop.envFrames={max_frames}", "spec.evaluation.intervalSeconds=null"]
    load = os.getloadavg()[0]
    p = run_job(job_path, sets, rd, timeout=max_seconds + 180)
    out = {"batch": batch, "minibatch": minibatch, "multiple": multiple, "seed": seed, "load1_before": round(load, 2)}
    try:
        s, recs = p.summary(), p.records()
    except (OSError, ValueError):
        return {**out, "error": p.stderr[-800:]}
    if not s.get("policy_version"):  # nothing trained: a broken run, not a point of the curve
        return {**out, "error": f"the learner never published a policy ({s['exit_reason']}, "
                                f"{s['env_frames']} frames); restarts {s.get('restarts')}"}
    at = (s.get("frames_to_target") or frames_at_target(recs, base["target"]) or s["env_frames"]
          if s["reached_target"] else None)
    return {**out, "reached": bool(s["reached_target"]), "frames_to_target": at,
            "env_frames": s["env_frames"], "seconds": s["wall_seconds"], "exit_reason": s["exit_reason"],
            "policy_lag_mean": round(s["policy_lag"].get("mean", 0.0), 2), "policy_version": s["policy_version"],
            "mean_return": s["mean_return"]}


def points(runs: list[dict]) -> list[dict]:
    """Per batch: every seed's frames (a run short of the target counts its frames, a lower
    bound), their median, and how many reached the target."""
    out = []
    for batch in sorted({r["batch"] for r in runs if "error" not in r}):
        rs = [r for r in runs if r["batch"] == batch and "error" not in r]
        frames = [r["frames_to_target"] if r["reached"] else r["env_frames"] for r in rs]
        out.append({"batch": batch, "frames": frames, "frames_to_target_median": statistics.median(frames),
                    "reached": sum(r["reached"] for r in rs), "runs": len(rs)})
    return out


def resumed(path: str | None, job: str) -> dict:
    """An earlier result of the same job (`--resume`), or {}."""
    if not path:
        return {}
    doc = json.loads(Path(path).read_text())
    if doc.get("job") != job:
        raise SystemExit(f"{path}: a curve of {doc.get('job')!r}, not {job!r}")
    return doc


def base_of(job_path: Path) -> dict:
    from tianji.control.spec import load_job

    s = load_job(job_path).spec
    if s.stop.mean_return is None:
        raise SystemExit(f"{job_path}: spec.stop.meanReturn is needed (frames to which target?)")
    return {"batch": s.algorithm.batch_size, "minibatch": s.algorithm.minibatch_size, "target": s.stop.mean_return,
            "algorithm": s.algorithm.name, "env": s.env.id}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", required=True, choices=sorted(JOBS))
    ap.add_argument("--multiples", default="1,2,4,8", help="batch multiples m (effective batch m·B)")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--max-frames", type=int, default=1_000_000)
    ap.add_argument("--out", default=None, help="default docs/results/batch-curve-<job>.json; '-': none")
    ap.add_argument("--resume", default=None, metavar="FILE",
                    help="an earlier output of this job: its good runs are kept, only the missing ones run")
    a = ap.parse_args(argv)
    job_path = ROOT / JOBS[a.job]
    base = base_of(job_path)
    multiples = [int(x) for x in a.multiples.split(",")]
    head = stamp("batch_curve", sys.argv[1:] if argv is None else argv)
    earlier = resumed(a.resume, a.job)
    runs = [r for r in earlier.get("runs", []) if "error" not in r]
    done = {(r["multiple"], r["seed"]) for r in runs}
    for i, seed in enumerate(int(x) for x in a.seeds.split(",")):
        for m in (multiples if i % 2 == 0 else multiples[::-1]):  # alternate, so drifts hit every size
            if (m, seed) in done:
                continue
            runs.append(run(job_path, base, m, seed, a.actors, a.max_seconds, a.max_frames))
            print(runs[-1], file=sys.stderr, flush=True)
    result = {**head, "job": a.job, "manifest": JOBS[a.job], "algorithm": base["algorithm"], "env": base["env"],
              "target_return": base["target"], "base_batch": base["batch"], "base_minibatch": base["minibatch"],
              "actors": a.actors, "host": host(),
              "rule": "batchSize = m·B and minibatchSize = m·b on one learner: the gradient steps of m "
                      "synchronised learners of the job's batch B, learning rate unchanged",
              "points": points(runs), "runs": runs,
              **({"resumed_from": {k: earlier[k] for k in ("command", "date", "machine") if k in earlier}}
                 if earlier else {})}
    out = None if a.out == "-" else (a.out or RESULTS / f"batch-curve-{a.job}.json")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    emit(result, out)


if __name__ == "__main__":
    main()
