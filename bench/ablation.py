"""The paper's ablation in TianJi itself: relaxed dependencies vs a strictly ordered loop.

For each seed, runs a job twice through `tianji run`, once with spec.dependencies = relaxed (the
default) and once = strict (the synchronous loop on the same processes and wire: actors wait for
the policy trained on their rollout, the learner trains on exactly the last rollout of every actor),
alternating which goes first so slow drifts of a shared machine's load hit both. Reports, per run,
from summary.json and metrics.jsonl: time and frames to mean-100 >= the job's target (timed from
launch), produced frames/s and consumed samples/s (whole run, start-up included, and over the
records after the first update: `steady`), policy lag, drops, and the load average before the run;
per mode, medians; per seed, relaxed/strict ratios. Prints one JSON object (`--out` also writes it)
and, with --plot, a figure: mean-100 return against time, and the per-seed throughput.

    python -m bench.ablation --jobs cartpole-ppo --seeds 1,2,3,4,5 --budget-s 300
    python -m bench.ablation --jobs pong-ppo --seeds 1 --budget-s 120      # throughput only (no target)
    python -m bench.ablation --jobs cartpole-ppo,pong-ppo --components    # the overlap bound per job

A job is examples/<name>.yaml or a job file (bench/jobs/acrobot-ppo-rlzoo.yaml: a peer's published
hyperparameters). Strict is PPO only (spec.py refuses DQN: a DQN learner's rounds are set by the
replay limiter, not by the actors), so a DQN job is refused here too.
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

MODES = ("relaxed", "strict")


def steady_rates(recs: list[dict]) -> dict:
    """Frames/s and samples/s between the first record with a trained policy and the last record."""
    trained = [r for r in recs if r.get("policy_version", 0) >= 1]
    if len(trained) < 2 or trained[-1]["t"] <= trained[0]["t"]:
        return {"produced_fps": None, "consumed_sps": None}
    a, b = trained[0], trained[-1]
    dt = b["t"] - a["t"]
    consumed = lambda r: sum(int(v) for v in (r.get("lag_hist") or {}).values())  # noqa: E731
    return {"produced_fps": round((b["env_frames"] - a["env_frames"]) / dt),
            "consumed_sps": round((consumed(b) - consumed(a)) / dt) if "lag_hist" in b else None}


def job_file(job: str) -> Path:
    """An example's name (examples/<job>.yaml) or a path to a job file."""
    return Path(job) if job.endswith((".yaml", ".yml")) else ROOT / "examples" / f"{job}.yaml"


def run(job: str, mode: str, seed: int, budget_s: float, extra: list[str]) -> dict:
    rd = Path(tempfile.mkdtemp(prefix=f"ablation-{Path(job).stem}-{mode}-"))
    sets = [f"spec.dependencies={mode}", f"spec.env.seed={seed}", f"spec.stop.seconds={budget_s}",
            "spec.stop.envFrames=100000000", "spec.evaluation.intervalSeconds=null", *extra]
    load = os.getloadavg()[0]
    p = run_job(job_file(job), sets, rd, timeout=budget_s + 240)
    try:
        s = p.summary()
        recs = p.records()
    except (OSError, ValueError):
        return {"job": job, "mode": mode, "seed": seed, "error": p.stderr[-800:]}
    curve = [(r["t"], r.get("mean_return")) for r in recs if r.get("mean_return") is not None]
    return {"job": job, "mode": mode, "seed": seed, "load1_before": round(load, 2),
            "reached_target": s["reached_target"], "seconds_to_target": s["seconds_to_target"],
            "frames_to_target": s["env_frames"] if s["reached_target"] else None,
            "wall_seconds": round(s["wall_seconds"], 1), "env_frames": s["env_frames"],
            "produced_fps": round(s["throughput"]["produced_fps"]),
            "consumed_sps": round(s["throughput"]["consumed_sps"]), "steady": steady_rates(recs),
            "policy_lag": s["policy_lag"], "dropped_fraction": s["dropped_fraction"],
            "policy_version": s["policy_version"], "mean_return": s["mean_return"],
            "dropped_by_reason": s["dropped_samples"], "restarts": s["restarts"], "exit_reason": s["exit_reason"],
            "run_dir": str(rd), "curve": curve[:: max(1, len(curve) // 200)]}


def components(job: str, reps: int = 20) -> dict:
    """The two halves of a strict round, each alone in this process (1 torch thread), medians of
    `reps`: an actor's rollout (its share of a batch) and the learner's update of one batch.
    Strict pays rollout + update (+ transfers) per batch, relaxed at best max(rollout, update) when
    they run on cores of their own: the most relaxing the dependencies can buy on this job."""
    import time

    import numpy as np
    import torch

    from tianji.algos.ppo import PPOLearner
    from tianji.control.spec import load_job
    from tianji.runtime.rollout import Rollout
    from tianji.runtime.validate import ppo_batch_fragments

    torch.set_num_threads(1)
    spec = load_job(job_file(job)).spec
    ro = Rollout(spec, seed=1)
    learner = PPOLearner(ro.model, spec.algorithm, 1)
    per_actor = ppo_batch_fragments(spec) // (spec.topology.actors // spec.topology.buffers)
    t_roll, t_upd = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        frags = [ro.fragment()[0] for _ in range(ppo_batch_fragments(spec))]
        t_roll.append((time.perf_counter() - t0) * per_actor / len(frags))
        batch = {k: np.concatenate([f[k] for f in frags], axis=1) for k in frags[0]}
        batch["last_obs"] = np.concatenate([ro.obs] * len(frags))
        batch["versions"] = np.zeros(batch["valid"].shape[1], np.int64)
        t0 = time.perf_counter()
        learner.update(batch)
        t_upd.append(time.perf_counter() - t0)
    ro.close()
    roll, upd = statistics.median(t_roll), statistics.median(t_upd)
    return {"rollout_s": round(roll, 4), "update_s": round(upd, 4),
            "overlap_bound_relaxed_over_strict": round((roll + upd) / max(roll, upd), 3)}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def summarise(runs: list[dict]) -> dict:
    out = {}
    for job in dict.fromkeys(r["job"] for r in runs):
        per_mode = {}
        for mode in MODES:
            ok = [r for r in runs if r["job"] == job and r["mode"] == mode and "error" not in r]
            per_mode[mode] = {
                "runs": len(ok), "reached": sum(bool(r["reached_target"]) for r in ok),
                "seconds_to_target_median": _median([r["seconds_to_target"] for r in ok]),
                "frames_to_target_median": _median([r["frames_to_target"] for r in ok]),
                "produced_fps_median": _median([r["produced_fps"] for r in ok]),
                "consumed_sps_median": _median([r["consumed_sps"] for r in ok]),
                "steady_consumed_sps_median": _median([r["steady"]["consumed_sps"] for r in ok]),
                "policy_lag_mean_median": _median([r["policy_lag"]["mean"] for r in ok])}
        pairs = {}
        for r in runs:
            if r["job"] == job and "error" not in r:
                pairs.setdefault(r["seed"], {})[r["mode"]] = r
        ratios = {"time_to_target_strict_over_relaxed": [], "frames_to_target_strict_over_relaxed": [],
                  "consumed_sps_relaxed_over_strict": [], "produced_fps_relaxed_over_strict": []}
        for p in pairs.values():
            if len(p) < 2:
                continue
            rel, st = p["relaxed"], p["strict"]
            if rel["seconds_to_target"] and st["seconds_to_target"]:
                ratios["time_to_target_strict_over_relaxed"].append(
                    round(st["seconds_to_target"] / rel["seconds_to_target"], 3))
                ratios["frames_to_target_strict_over_relaxed"].append(
                    round(st["frames_to_target"] / rel["frames_to_target"], 3))
            for k, key in (("consumed_sps_relaxed_over_strict", "consumed_sps"),
                           ("produced_fps_relaxed_over_strict", "produced_fps")):
                if st[key]:
                    ratios[k].append(round(rel[key] / st[key], 3))
        out[job] = {"modes": per_mode, "per_seed_ratios": ratios,
                    "median_ratios": {k: _median(v) for k, v in ratios.items()}}
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = list(result["summary"])
    fig, axes = plt.subplots(len(jobs), 2, figsize=(11, 3.6 * len(jobs)), squeeze=False)
    colour = {"relaxed": "tab:blue", "strict": "tab:red"}
    for row, job in zip(axes, jobs):
        runs = [r for r in result["runs"] if r["job"] == job and "error" not in r]
        for r in runs:
            t, ret = zip(*r["curve"]) if r["curve"] else ((), ())
            row[0].plot(t, ret, color=colour[r["mode"]], alpha=0.7, lw=1,
                        label=r["mode"] if r["seed"] == runs[0]["seed"] else None)
        name = Path(job).stem
        row[0].set(title=f"{name}: mean-100 return", xlabel="seconds from launch", ylabel="return")
        row[0].legend()
        seeds = sorted({r["seed"] for r in runs})
        for i, mode in enumerate(MODES):
            vals = [next((r["consumed_sps"] for r in runs if r["seed"] == s and r["mode"] == mode), 0) for s in seeds]
            row[1].bar([k + 0.4 * i for k in range(len(seeds))], vals, 0.4, color=colour[mode], label=mode)
        row[1].set_xticks([k + 0.2 for k in range(len(seeds))], [f"seed {s}" for s in seeds])
        row[1].set(title=f"{name}: consumed samples/s (whole run)", ylabel="samples/s")
        row[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="cartpole-ppo", help="example names or job files, comma-separated (PPO)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--set", action="append", default=[], help="another override for both modes")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--plot", help="write the figure here (PNG)")
    ap.add_argument("--components", action="store_true", help="only time a round's rollout and update "
                    "in this process (the overlap bound), no runs")
    a = ap.parse_args()
    if a.components:
        print(json.dumps({job: components(job) for job in a.jobs.split(",")}, indent=1))
        return
    runs, k = [], 0
    for job in a.jobs.split(","):
        for seed in (int(x) for x in a.seeds.split(",")):
            for mode in (MODES if k % 2 == 0 else MODES[::-1]):
                runs.append(run(job, mode, seed, a.budget_s, a.set))
                print(json.dumps({x: y for x, y in runs[-1].items() if x != "curve"}), file=sys.stderr, flush=True)
            k += 1
    result = {**stamp("ablation"), "cpus": os.cpu_count(),
              "budget_s": a.budget_s, "summary": summarise(runs), "runs": runs}
    emit(result, a.out)
    if a.plot:
        plot(result, Path(a.plot))


if __name__ == "__main__":
    main()
