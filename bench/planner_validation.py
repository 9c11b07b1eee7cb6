"""Out-of-sample check of the planner's cost model: random topologies, each run for real.

    python -m bench.planner_validation [--n 10] [--seed 1] [--seconds 30] [--algos ppo,dqn]
                                        [--out-dir DIR]

Draws --n topologies at random (seeded): algorithm (CartPole PPO or DQN, the examples'
settings), groups 1-2, actors per group 1-3, envs per actor 4 or 8, learner threads 1-2,
groupSync average or allreduce (with 2 groups). Each is one `tianji run` of --seconds
(bench/scaling.py's run_point: steady rates from the run's metrics, after a warm-up), and
predicted by `tianji.control.planner.sharedhost.predict_on_host` from a profile taken just
before the point (`tianji profile`, 2 s per component; `--profile once`: one per algorithm and
envs per actor, at its first point) and the busy background measured just before the point.
Nothing is fitted to any of the runs: the model's figures come from the profile alone. A
profile per point because this host's own speed drifts: on the 2-core VM (2026-11-29) the
CartPole DQN learner's update measured 32.0k samples/s per core in one profile and 19.9-21.1k
ten minutes later, idle both times, and two PPO profiles minutes apart 6.0k and 9.7k for the
same learner; a profile taken once charges that drift to the model. One untimed run of the first point
comes first (`warmup` in the output): a fresh machine's first run starts from a cold page cache.

    python -m bench.planner_validation --rescore DIR/planner-validation.json

`--rescore` re-predicts a recorded run's points with this checkout's model, from each point's
own profile: two models compared on the same measurements.

    python -m bench.planner_validation --time-to-target [--random 3] [--budget-s 150] [--algos ppo]

`--time-to-target` asks the paper's Fig. 6 question instead: the planner's topology
(`topology: auto` for this machine's cores, from a profile taken now) against --random
topologies drawn as above, each run until the example's stop.meanReturn (or --budget-s),
on seconds to target from the run's summary.json. One seed per topology: seed-to-seed spread
of time to target is −24 % to +32 % (docs/results/groupsync.json): only larger differences mean anything.
Output DIR/planner-time-to-target.json.

A quiet machine only: before the profile and before each point the 1-minute load average must
be at most --max-load per core (default 0.5: on average at most half the cores busy with
anything, the previous point's own processes included; the validation of 2026-11-25 ran at
2.5-6.5 per core and is what this gate keeps from recurring). The bench waits up to
--settle-s (default 90 s; the 1-minute average decays by e in 60 s) for the load its own
previous point left to decay, records the load it started each point at, and otherwise
refuses to report: exit 2, saying the load, the limit and the point, nothing written.
`--max-load 100` measures on a busy machine anyway; the result records the limit it ran under.

Reported (JSON on stdout and DIR/planner-validation.json, plot DIR/planner-validation.png):
per point the predicted and measured produced frames/s and consumed samples/s, their
relative errors (pred − meas)/meas, the bottleneck kinds, the point's profile and the
CPU each role's processes got (`measured.shares`, cores per process); over all points the median
and max absolute error and the kind accuracy (bench/scaling.py's measured_kind reads kinds
from rates alone, so it cannot see time spent in all-reduce: a point the model calls
communication-bound and the rates call sample-bound is counted wrong, as it is).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import scaling  # run_point, probe_background, measured_kind
from bench.harness import ROOT, emit, loadavg, run_job, stamp

EXAMPLES = {"ppo": "examples/cartpole-ppo.yaml", "dqn": "examples/cartpole-dqn.yaml"}
METRICS = ("produced_fps", "consumed_sps")
MAX_LOAD_PER_CORE, SETTLE_S = 0.5, 90.0  # the quiet gate's defaults (module docstring)
WARMUP_S = 10.0  # the untimed first run (warm_up)


class NotQuiet(Exception):
    """The machine's load stayed above the gate's limit: the validation does not report."""


def quiet(max_load_per_core: float, settle_s: float, what: str) -> float:
    """The 1-minute load average once it is at most max_load_per_core × cores, waiting up to
    `settle_s` for it to fall; NotQuiet naming the load, the limit and `what` otherwise."""
    cores = os.cpu_count() or 1
    limit = max_load_per_core * cores
    t0 = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        if load <= limit:
            return round(load, 2)
        waited = time.monotonic() - t0
        if waited >= settle_s:
            raise NotQuiet(f"1-minute load average {load:.2f} > {limit:g} (--max-load {max_load_per_core:g} per core x "
                           f"{cores} cores) before {what}, after waiting {waited:.0f} s: the machine is not quiet; "
                           "nothing reported (rerun when it is, or raise --max-load and say so)")
        time.sleep(min(5.0, settle_s - waited))


def draw(rng: random.Random, algos: list[str]) -> dict:
    """One random topology (module docstring)."""
    groups = rng.choice((1, 2))
    return {"algo": rng.choice(algos), "groups": groups, "actors": rng.choice((1, 2, 3)),
            "num_envs": rng.choice((4, 8)), "threads": rng.choice((1, 2)),
            "sync": rng.choice(("average", "allreduce")) if groups > 1 else "average"}


def point_sets(t: dict) -> list[str]:
    return [f"spec.topology.groups={t['groups']}", f"spec.topology.actors={t['actors']}",
            "spec.topology.buffers=1", "spec.topology.learners=1", f"spec.topology.groupSync.mode={t['sync']}",
            f"spec.env.numEnvs={t['num_envs']}", f"spec.resources.learner.cpu={t['threads']}",
            f"spec.resources.learner.threads={t['threads']}"]


def base(seconds: float) -> list[str]:
    return ["spec.stop.meanReturn=null", "spec.stop.envFrames=null", f"spec.stop.seconds={seconds}"]


def profile_for(cache: dict, t: dict, seconds: float, fresh: bool = False):
    """The profile of this algorithm and envs per actor (2 s per component): measured now when
    `fresh`, else once per run, at its first point."""
    from tianji.control.planner.plan import Profile
    from tianji.control.spec import load_job
    from tianji.runtime.profiling.profiler import measure_profile

    key = (t["algo"], t["num_envs"])
    if fresh or key not in cache:
        job = load_job(str(ROOT / EXAMPLES[t["algo"]]), base(seconds) + [f"spec.env.numEnvs={t['num_envs']}"])
        cache[key] = measure_profile(job, 2.0)
    return Profile.from_json(cache[key])


def run_one(t: dict, profile, seconds: float, gate) -> dict:
    """One point: `gate(what)` (quiet) first, then `profile()` (the point's Profile), the
    prediction and the run."""
    from tianji.control.planner.sharedhost import predict_on_host
    from tianji.control.spec import load_job

    path = str(ROOT / EXAMPLES[t["algo"]])
    sets = base(seconds) + point_sets(t)
    job = load_job(path, sets)
    load = gate(f"point {t}")
    prof = profile()
    bg = scaling.probe_background()
    pred = predict_on_host(job, prof, float(os.cpu_count() or 1), bg, learner_threads=t["threads"])
    row = {"topology": t, "load1_before": load, "background": round(bg, 2),
           "profile": prof.to_json(),  # the point's own: a later model re-predicts it exactly
           "predicted": {k: round(pred[k], 1) for k in METRICS} | {"bottleneck": pred["bottleneck"]}}
    meas = scaling.run_point(path, sets, seconds)
    if "error" in meas:
        return row | {"error": meas["error"][-500:]}
    row["measured"] = {k: round(meas[k], 1) for k in METRICS} | {
        "bottleneck": scaling.measured_kind(meas, job.spec.replay_ratio), "seconds": meas["seconds"]}
    if "shares" in meas:  # cores per process of each role over the steady window: where the model's split went wrong
        row["measured"]["shares"] = {r: round(v, 3) for r, v in meas["shares"].items()}
    row["rel_error"] = {k: round((pred[k] - meas[k]) / meas[k], 3) for k in METRICS if meas[k] > 0}
    print(f"  {t}: measured {row['measured']} predicted {row['predicted']}", file=sys.stderr)
    return row


def point_profile(recorded: dict, row: dict):
    """The Profile a recorded point was predicted from: its own (`--profile each`), else its
    algorithm's and envs' profile of the run with the point's per-core rates."""
    from dataclasses import replace

    from tianji.control.planner.plan import Profile

    own = row.get("profile") or {}
    if "message_seconds" in own:
        return Profile.from_json(own)
    t = row["topology"]
    prof = Profile.from_json(recorded["profiles"][f"{t['algo']}-{t['num_envs']}envs"])
    return replace(prof, **{k: own[k] for k in ("actor_fps_per_core", "learner_sps_per_core") if k in own})


def rescore(recorded: dict) -> dict:
    """Re-predict a recorded validation's points with this checkout's model (nothing runs): the
    same measurements against another model, side by side with what was predicted then."""
    from tianji.control.planner.sharedhost import predict_on_host
    from tianji.control.spec import load_job

    cores = float(recorded.get("host", {}).get("cpus") or os.cpu_count() or 1)
    rows = []
    for r in recorded["points"]:
        if "measured" not in r:
            continue
        t = r["topology"]
        job = load_job(str(ROOT / EXAMPLES[t["algo"]]), base(recorded["seconds_per_point"]) + point_sets(t))
        pred = predict_on_host(job, point_profile(recorded, r), cores, r.get("background", 0.0),
                               learner_threads=t["threads"])
        m = r["measured"]
        rows.append({"topology": t, "measured": m, "recorded_error": r.get("rel_error"),
                     "predicted": {k: round(pred[k], 1) for k in METRICS} | {"bottleneck": pred["bottleneck"]},
                     "rel_error": {k: round((pred[k] - m[k]) / m[k], 3) for k in METRICS if m[k] > 0}})
    return {"rescored": recorded.get("command"), "recorded_median_abs_error": recorded.get("median_abs_error"),
            **summarise(rows), "points": rows}


def warm_up(t: dict, seconds: float) -> dict:
    """One untimed run of the first point, reported apart: the first `tianji run` on a fresh machine
    reads its workers' libraries from a cold page cache (on the H200 machine the first of five
    CartPole runs made 4.8k samples/s steady and the same job run fourth 9.4k,
    docs/device/trace-cartpole-ppo.json), which would charge the first point for it."""
    meas = scaling.run_point(str(ROOT / EXAMPLES[t["algo"]]), base(seconds) + point_sets(t), min(seconds, WARMUP_S))
    said = {"error": meas["error"][-300:]} if "error" in meas else {k: round(meas[k], 1) for k in METRICS}
    return {"topology": t, "seconds": min(seconds, WARMUP_S)} | said  # too short for a steady window: said


def summarise(rows: list[dict]) -> dict:
    errs = [abs(e) for r in rows for e in r.get("rel_error", {}).values()]
    done = [r for r in rows if "measured" in r]
    kinds = sum(r["predicted"]["bottleneck"] == r["measured"]["bottleneck"] for r in done)
    return {"points_run": len(done), "points_failed": len(rows) - len(done),
            "median_abs_error": round(statistics.median(errs), 3) if errs else None,
            "max_abs_error": round(max(errs), 3) if errs else None,
            "kind_accuracy": f"{kinds}/{len(done)}"}


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, k in zip(axes, METRICS):
        pts = [(r["measured"][k], r["predicted"][k], r["topology"]["algo"]) for r in rows if "measured" in r]
        for algo, mark in (("ppo", "o"), ("dqn", "s")):
            xs = [(m, p) for m, p, a in pts if a == algo]
            ax.scatter([m for m, _ in xs], [p for _, p in xs], marker=mark, label=algo)
        vals = [v for m, p, _ in pts for v in (m, p) if v > 0] or [1.0]
        lo, top = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, top], [lo, top], "k--", lw=0.8, label="predicted = measured")
        ax.set(xscale="log", yscale="log", xlim=(lo, top), ylim=(lo, top),
               xlabel=f"measured {k}", ylabel=f"predicted {k}")
        ax.legend(fontsize=8)
    fig.suptitle("planner (predict_on_host) vs random topologies run for real")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def to_target(algo: str, sets: list[str], budget_s: float, profile: str, gate) -> dict:
    """One `tianji run` to the example's target (after `gate`); its topology as resolved, and summary figures."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="tianji-ttt-") as tmp:
        rd = Path(tmp) / "run"
        load = gate(f"the {algo} run {sets}")
        p = run_job(ROOT / EXAMPLES[algo], [f"spec.stop.seconds={budget_s}", *sets], rd, args=["--profile", profile],
                    timeout=budget_s + 180)
        try:
            summ = p.summary()
            topo = yaml.safe_load((rd / "job.yaml").read_text())["spec"]["topology"]
        except (OSError, ValueError, KeyError, TypeError):
            return {"set": sets, "error": p.stderr[-800:]}
    return {"set": sets, "topology": topo, "load1_before": round(load, 2), "reached_target": summ["reached_target"],
            "seconds_to_target": summ["seconds_to_target"], "env_frames": summ["env_frames"],
            "wall_seconds": round(summ["wall_seconds"], 1), "exit_reason": summ["exit_reason"]}


def time_to_target(a, algos: list[str], gate) -> dict:
    """The planner's topology vs random ones on seconds to target (module docstring)."""
    from tianji.runtime.atomicfile import atomic_write_json

    rng, out = random.Random(a.seed), {}
    for algo in algos:
        cache: dict = {}
        t0 = {"algo": algo, "num_envs": 4}
        prof_path = Path(a.out_dir) / f"profile-{algo}.json"
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        profile_for(cache, t0, a.budget_s)
        atomic_write_json(prof_path, cache[(algo, 4)])
        planned = to_target(algo, ["spec.topology.auto=true", f"spec.resources.cpus={os.cpu_count() or 1}"],
                            a.budget_s, str(prof_path), gate)
        print(f"  {algo} planned: {planned}", file=sys.stderr)
        rand = []
        for _ in range(a.random):
            t = draw(rng, [algo])
            rand.append(to_target(algo, point_sets(t), a.budget_s, str(prof_path), gate))
            print(f"  {algo} random: {rand[-1]}", file=sys.stderr)
        out[algo] = {"planned": planned, "random": rand}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--algos", default="ppo,dqn")
    ap.add_argument("--rescore", metavar="FILE", help="re-predict a recorded planner-validation.json with this "
                    "checkout's model and print the errors (runs nothing)")
    ap.add_argument("--profile", choices=("each", "once"), default="each",
                    help="profile before every point (default), or once per algorithm and envs per actor")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--time-to-target", action="store_true", help="planned vs random topologies on time to target")
    ap.add_argument("--random", type=int, default=3, help="--time-to-target: random topologies per algorithm")
    ap.add_argument("--budget-s", type=float, default=150.0, help="--time-to-target: seconds cap per run")
    ap.add_argument("--max-load", type=float, default=MAX_LOAD_PER_CORE,
                    help="quiet gate: most 1-minute load average per core before the profile and each point")
    ap.add_argument("--settle-s", type=float, default=SETTLE_S,
                    help="quiet gate: most seconds to wait for the load to fall below --max-load")
    a = ap.parse_args(argv)
    if a.rescore:
        emit(rescore(json.loads(Path(a.rescore).read_text())), indent=1)
        return 0
    algos = [x for x in a.algos.split(",") if x]
    if not algos or set(algos) - set(EXAMPLES) or a.n < 1 or not a.seconds > 0:
        ap.error(f"--algos from {sorted(EXAMPLES)}, --n >= 1, --seconds > 0")
    if not (a.max_load > 0 and a.settle_s >= 0):
        ap.error("--max-load > 0 and --settle-s >= 0")
    try:
        return validate(a, algos, argv, lambda what: quiet(a.max_load, a.settle_s, what))
    except NotQuiet as e:
        print(f"planner_validation: refused: {e}", file=sys.stderr)
        return 2


def validate(a, algos: list[str], argv, gate) -> int:
    """The runs and the report (module docstring), each point behind `gate`."""
    gate("the profile")
    import torch

    torch.set_num_threads(1)  # this process only profiles and predicts; the runs set their own
    if a.time_to_target:
        load0 = loadavg()
        res = {"bench": "planner-time-to-target", **stamp("planner_validation", argv), "seed": a.seed,
               "budget_s": a.budget_s, "max_load_per_core": a.max_load, "results": time_to_target(a, algos, gate),
               "host": {"cpus": os.cpu_count(), "loadavg_start": load0, "loadavg_end": loadavg()}}
        (Path(a.out_dir) / "planner-time-to-target.json").write_text(json.dumps(res, indent=1) + "\n")
        emit(res, indent=None)
        return 0
    t0, rng, cache = time.perf_counter(), random.Random(a.seed), {}
    load0 = loadavg()
    drawn = [draw(rng, algos) for _ in range(a.n)]
    warmup = warm_up(drawn[0], a.seconds)
    fresh = a.profile == "each"
    rows = [run_one(t, lambda t=t: profile_for(cache, t, a.seconds, fresh), a.seconds, gate) for t in drawn]
    res = {"bench": "planner-validation", **stamp("planner_validation", argv), "seed": a.seed,
           "seconds_per_point": a.seconds, "max_load_per_core": a.max_load, "profile": a.profile,
           **summarise(rows), "points": rows,
           "warmup": warmup,
           "profiles": {f"{k[0]}-{k[1]}envs": v for k, v in cache.items()},
           "host": {"cpus": os.cpu_count(), "loadavg_start": load0, "loadavg_end": loadavg()},
           "seconds": round(time.perf_counter() - t0, 1)}
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "planner-validation.json").write_text(json.dumps(res, indent=1) + "\n")
    try:
        plot(rows, out / "planner-validation.png")
    except ImportError as e:  # matplotlib missing: the JSON still stands
        res["png_error"] = str(e)
    emit({k: v for k, v in res.items() if k not in ("points", "profiles")}, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
