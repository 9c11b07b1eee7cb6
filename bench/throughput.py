"""Throughput as actors grow. Prints one JSON object.

    python -m bench.throughput --env pong     [--max-actors N] [--seconds S] [--job FILE]
    python -m bench.throughput --env cartpole [--max-actors N] [--seconds S] [--job FILE] [--no-pace]

pong: produced frames/s of k = 1..N actor processes running the actor's loop
  body (tianji.runtime.profiling.profiler.ActorLoop: policy inference with the job's Nature CNN +
  ALE step + fragment writes, one torch thread, one ALE thread), against the
  raw ALE ceiling measured in the same run: k processes stepping the same
  preprocessed vector env with random actions and no policy. Per k the two
  are run back to back; `ratio` = actor / raw, `actor_fps_per_process` the
  per-actor-core figure. (Fragment sending is not included: one 256-frame
  Pong fragment costs ~3 ms through the wire, ~1 % of producing it.)
  `--set spec.resources.actor.cpu=2` measures the double-buffered actor (envs/split.py:
  the policy on one half of the envs while ALE steps the other); the raw env is
  always one native vector env.

cartpole: the paper's Figure 6(a) shape - k = 1..N actors with the learner
  (and buffer) fixed, each point a real `tianji run` of S seconds. Reported:
  produced / received / consumed throughput over the steady part of the run
  (from the first consumed sample to the end, from metrics.jsonl) and over the
  whole run (summary.json), and what `tianji.control.planner.plan.plan_for_job` predicts
  for the same topology from a profile measured at the start of this run
  (produced, consumed, bottleneck).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, host, rates_between, read_records, role_totals, run_job, stamp

DEFAULT_JOBS = {"pong": ROOT / "examples" / "pong-dqn.yaml", "cartpole": ROOT / "examples" / "cartpole-ppo.yaml"}


# ----------------------------------------------------------------- pong
def _pong_worker(job_path: str, overrides: list, mode: str, index: int, seconds: float, barrier, out) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if mode == "raw":  # the bare env: one native vector env, not the actor's double-buffered halves
        os.environ["TIANJI_DOUBLE_BUFFER"] = "0"
    import torch

    torch.set_num_threads(1)
    from tianji.control.spec import load_job
    from tianji.runtime.profiling.profiler import ActorLoop

    loop = ActorLoop(load_job(job_path, overrides), seed_offset=1000 * index)
    try:
        loop.fragment()  # warm-up
        barrier.wait()
        r = loop.run(seconds) if mode == "actor" else loop.run_env_only(seconds, seed=index)
        out.put(r)
    finally:
        loop.close()


def _pong_point(job_path: str, overrides: list, mode: str, k: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")  # a clean interpreter per process: no inherited torch/ALE threads
    barrier, out = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_pong_worker, args=(job_path, overrides, mode, i, seconds, barrier, out))
             for i in range(k)]
    for p in procs:
        p.start()
    res = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    total = sum(r["frames"] / r["wall_seconds"] for r in res)
    return {"fps": total, "fps_per_process": total / k,
            "fps_per_cpu_second": sum(r["fps_per_core"] for r in res) / k}


def bench_pong(job_path: str, overrides: list, max_actors: int, seconds: float) -> dict:
    rows = []
    for k in range(1, max_actors + 1):
        raw = _pong_point(job_path, overrides, "raw", k, seconds)
        act = _pong_point(job_path, overrides, "actor", k, seconds)
        rows.append({"processes": k, "actor_fps": round(act["fps"], 1), "raw_ale_fps": round(raw["fps"], 1),
                     "ratio": round(act["fps"] / raw["fps"], 3),
                     "actor_fps_per_process": round(act["fps_per_process"], 1),
                     "raw_fps_per_process": round(raw["fps_per_process"], 1),
                     "actor_fps_per_cpu_second": round(act["fps_per_cpu_second"], 1),
                     "raw_fps_per_cpu_second": round(raw["fps_per_cpu_second"], 1),
                     "ratio_per_cpu_second": round(act["fps_per_cpu_second"] / raw["fps_per_cpu_second"], 3)})
        print(f"  k={k}: actor {act['fps']:.0f} frames/s, raw ALE {raw['fps']:.0f} frames/s, "
              f"ratio {act['fps'] / raw['fps']:.2f}", file=sys.stderr)
    return {"points": rows, "target_ratio": 0.8,
            "note": "frames are agent steps (4 emulator frames each); ratio = actor loop / random-action env "
                    "with the same preprocessing and process count"}


# ----------------------------------------------------------------- cartpole
def _steady(run_dir: Path) -> dict:
    """Rates from the first consumed sample to the last record of metrics.jsonl."""
    rows = read_records(run_dir)
    start = next((r for r in rows if role_totals(r)["consumed"] > 0), None)
    end = rows[-1] if rows else None
    if start is None or end is None or end["t"] - start["t"] < 1.0:
        return {"seconds": 0.0, "produced_fps": None, "received_fps": None, "consumed_sps": None}
    return {"seconds": round(end["t"] - start["t"], 2), **rates_between(start, end)}


def bench_cartpole(job_path: str, overrides: list, max_actors: int, seconds: float, profile_seconds: float) -> dict:
    from tianji.control.planner.plan import Profile, plan_for_job
    from tianji.control.spec import load_job
    from tianji.runtime.profiling.profiler import measure_profile

    base = load_job(job_path, overrides)
    prof_d = measure_profile(base, profile_seconds)
    prof = Profile.from_json(prof_d)
    rows = []
    for k in range(1, max_actors + 1):
        sets = list(overrides) + [f"spec.topology.actors={k}", f"spec.stop.seconds={seconds}",
                                  "spec.stop.meanReturn=null", "spec.stop.envFrames=null"]
        job = load_job(job_path, sets)
        pred = plan_for_job(job, prof)
        with tempfile.TemporaryDirectory(prefix="tianji-bench-") as tmp:
            run_dir = Path(tmp) / "run"
            run = run_job(job_path, sets, run_dir, args=["--max-seconds", str(seconds + 60)])
            summary = run.summary() if (run_dir / "summary.json").exists() else {"error": run.stderr[-2000:]}
            steady = _steady(run_dir) if (run_dir / "metrics.jsonl").exists() else {}
        th = summary.get("throughput", {})
        rows.append({
            "actors": k, "exit_reason": summary.get("exit_reason"),
            "steady": {k2: (round(v, 1) if isinstance(v, float) else v) for k2, v in steady.items()},
            "whole_run": {"produced_fps": round(th.get("produced_fps", 0.0), 1),
                          "received_fps": round(th.get("received_fps", 0.0), 1),
                          "consumed_sps": round(th.get("consumed_sps", 0.0), 1),
                          "wall_seconds": summary.get("wall_seconds")},
            "dropped_samples": summary.get("dropped_samples"), "policy_lag": summary.get("policy_lag"),
            "mean_return": summary.get("mean_return"),
            "planner": {"produced_fps": round(pred.produced_fps, 1), "consumed_sps": round(pred.consumed_sps, 1),
                        "bottleneck": pred.bottleneck, "expected_policy_lag": round(pred.expected_policy_lag, 2),
                        "cpus_used": pred.cpus_used},
        })
        st = rows[-1]["steady"]
        print(f"  actors={k}: steady produced {st.get('produced_fps')} received {st.get('received_fps')} "
              f"consumed {st.get('consumed_sps')}; planner: {pred.bottleneck}", file=sys.stderr)
    moves = [r["actors"] for a, r in zip(rows, rows[1:]) if a["planner"]["bottleneck"] != r["planner"]["bottleneck"]]
    return {"points": rows, "planner_bottleneck_moves_at_actors": moves,
            "profile": {k: prof_d[k] for k in ("actor_fps_per_core", "learner_sps_per_core", "message_seconds",
                                               "fragment_samples", "bytes_per_sample")},
            "cpus": os.cpu_count()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", choices=["cartpole", "pong"], default="cartpole")
    ap.add_argument("--job", help="TianJiJob manifest (default: examples/pong-dqn.yaml or examples/cartpole-ppo.yaml)")
    ap.add_argument("--max-actors", type=int, help="largest actor count (default: cores for pong, 4 for cartpole)")
    ap.add_argument("--seconds", type=float, help="per point (default: pong 5, cartpole 20)")
    ap.add_argument("--profile-seconds", type=float, default=1.0, help="cartpole: profile time per component")
    ap.add_argument("--no-pace", action="store_true", help="cartpole: actors do not pace to the learner")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    job = str(a.job or DEFAULT_JOBS[a.env])
    overrides = list(a.set) + (["spec.staleness.paceActors=false"] if a.no_pace else [])
    t0 = time.perf_counter()
    if a.env == "pong":
        res = bench_pong(job, overrides, a.max_actors or (os.cpu_count() or 1), a.seconds or 5.0)
    else:
        res = bench_cartpole(job, overrides, a.max_actors or 4, a.seconds or 20.0, a.profile_seconds)
    out = {"bench": "throughput", **stamp("throughput", argv), "env": a.env, "job": job, "overrides": overrides,
           **res, "host": host(), "seconds": round(time.perf_counter() - t0, 1)}
    emit(out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
