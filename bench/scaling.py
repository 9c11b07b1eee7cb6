"""The paper's Fig. 6 at small scale: real `tianji run` jobs against the planner's prediction.

    python -m bench.scaling [--job examples/cartpole-dqn.yaml] [--max-actors 3] [--seconds 40]
                            [--profile FILE] [--out-dir DIR] [--set K=V ...] [--sweeps abc]
    python -m bench.scaling --rescore docs/results/scaling.json --profile FILE [--set K=V ...]

Sweeps (each point one `tianji run` of S seconds; DQN CartPole by default):
  (a) actors 1..k, learner fixed (1 thread, batch B);
  (b) learner grown with the batch: threads 1 → 2 with batch B → 2B (2 actors);
  (c) groups replicated: 1 → 2 groups of one actor, buffer and learner each.

Measured per point: produced / received / consumed per second over the steady part of
the run (from STEADY_SKIP_S after the first consumed sample to the end, metrics.jsonl),
and a bottleneck read from the same rates:
  communication  received < 85 % of produced (the buffer falls behind its input);
  sample         consumed ≥ 90 % of r·produced (the learner is held by the replay ratio);
  training       otherwise (the learner is the limit; paced actors wait for it).

Predicted per point: `tianji.control.planner.sharedhost.predict_on_host` (the planner's cost model
for one shared machine, where actors and learners take turns: costmodel.host_turns) from a
profile (`tianji profile`, measured at the start unless --profile) and the CPU this host has
free: `cores` = os.cpu_count(), `background` = busy processes of other work, from a probe just
before each run (cores spinning processes for 1 s: each gets cores/(cores + background) of a core).

Also predicted given the CPU each role was measured to get over the same window
(`predict_with_shares`, CPU time of the run's processes from /proc): this checks the
cost model apart from the scheduler's split, which on a host shared with unknown
other work is the least predictable part.

`--rescore FILE` runs nothing: it re-predicts the points recorded in FILE (an earlier
scaling.json: each point's topology, background and measured rates) with the current cost
model and prints the same summary; a real run puts that re-score of its own points in its
JSON too ("rescore"), so a model change can be checked against recorded runs. The sets a
run was made with are recorded ("base_set"); for a file without them pass the same --set.

Prints one JSON object (per-point error (pred − meas)/meas, median absolute error,
bottleneck agreement, both ways) and writes scaling.json and scaling.png to --out-dir.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, host, rates_between, read_records, role_totals, run_job, stamp

STEADY_SKIP_S = 5.0
KEYS = ("produced_fps", "received_fps", "consumed_sps")


def _spin(seconds: float, out) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        pass
    out.put((time.process_time() - c0) / (time.perf_counter() - t0))


def probe_background(seconds: float = 1.0) -> float:
    """Busy processes of other work: `cores` spinners each get cores/(cores + background)."""
    cores = os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_spin, args=(seconds, q)) for _ in range(cores)]
    for p in ps:
        p.start()
    shares = [q.get(timeout=30 + seconds) for _ in ps]
    for p in ps:
        p.join()
    share = max(min(statistics.mean(shares), 1.0), 1e-3)
    return max(0.0, cores / share - cores)


def steady_rates(run_dir: Path) -> dict:
    rows = read_records(run_dir)
    first = next((r for r in rows if role_totals(r)["consumed"] > 0), None)
    if first is None:
        return {}
    start = next((r for r in rows if r["t"] >= first["t"] + STEADY_SKIP_S), None)
    end = rows[-1]
    if start is None or end["t"] - start["t"] < 3.0:
        return {}
    return {"seconds": round(end["t"] - start["t"], 1), **rates_between(start, end)}


def measured_kind(m: dict, ratio: float) -> str:
    if m["received_fps"] < 0.85 * m["produced_fps"]:
        return "communication-bound"
    if m["consumed_sps"] >= 0.9 * ratio * m["produced_fps"]:
        return "sample-bound"
    return "training-bound"


_TICK = os.sysconf("SC_CLK_TCK")


def _role_cpu(root_pid: int) -> dict:
    """CPU seconds so far of each worker process under `root_pid`, by role (Linux /proc)."""
    procs = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, cmd)
    out: dict = {}
    for ppid, cpu, cmd in procs.values():
        p, seen = ppid, 0
        while p not in (0, 1, root_pid) and p in procs and seen < 50:
            p, seen = procs[p][0], seen + 1
        if p == root_pid and b"--role" in cmd:
            role = cmd[cmd.index(b"--role") + 1].decode()
            out.setdefault(role, []).append(cpu)
    return out


def run_point(job_path: str, sets: list, seconds: float) -> dict:
    """One `tianji run`; steady rates, and each role's mean CPU share over the same window
    (cores per process, sampled from /proc every second)."""
    with tempfile.TemporaryDirectory(prefix="tianji-scaling-") as tmp:
        run_dir = Path(tmp) / "run"
        cpu = []  # (seconds since start, {role: [cpu s per process]})
        run = run_job(job_path, sets, run_dir, args=["--max-seconds", str(seconds)], timeout=seconds + 120,
                      watch=lambda pid, t: cpu.append((t, _role_cpu(pid))))
        if not (run_dir / "metrics.jsonl").exists():
            return {"error": run.stderr[-1500:]}
        rates = steady_rates(run_dir)
        if not rates:
            return {"error": "no steady window"}
        # The steady window is the run's last rates["seconds"]; take the CPU samples spanning it.
        full = max((sum(map(len, c.values())) for _, c in cpu), default=0)
        seen = [(t, c) for t, c in cpu if c and sum(map(len, c.values())) == full]  # not while stopping
        if seen:
            t_end, end = seen[-1]
            t_start, start = next((t, c) for t, c in seen if t >= t_end - rates["seconds"])
            if t_end - t_start >= 1.0:
                rates["shares"] = {r: (sum(end[r]) - sum(start.get(r, []))) / (t_end - t_start) / len(end[r])
                                   for r in end}
        return rates


def point_threads(sets: list) -> int:
    return 2 if "spec.resources.learner.threads=2" in sets else 1


def base_sets(seconds: float, extra: list) -> list:
    return ["spec.stop.meanReturn=null", "spec.stop.envFrames=null", f"spec.stop.seconds={seconds}",
            "spec.resources.learner.threads=1", *extra]


def summary(rows: list, pred_key: str = "predicted", err_key: str = "rel_error") -> dict:
    errs = [abs(v) for r in rows for v in r.get(err_key, {}).values()]
    kinds = [r[pred_key]["bottleneck"] == r["measured"]["bottleneck"] for r in rows
             if "measured" in r and pred_key in r]
    return {"median_abs_error": round(statistics.median(errs), 3) if errs else None,
            "max_abs_error": round(max(errs), 3) if errs else None,
            "bottleneck_agreement": f"{sum(kinds)}/{len(kinds)}"}


def rescore(recorded: dict, prof, job_path: str, extra_sets: list, cores: float) -> dict:
    """Re-predict recorded points with the current model (no runs): the same error summary."""
    from tianji.control.planner.sharedhost import predict_on_host
    from tianji.control.spec import load_job

    base = recorded.get("base_set") or base_sets(recorded.get("seconds_per_point", 40.0), extra_sets)
    rows = []
    for r in recorded["points"]:
        if "measured" not in r:
            continue
        job = load_job(job_path, base + r["set"])
        pred = predict_on_host(job, prof, cores, r.get("background", 0.0), learner_threads=point_threads(r["set"]))
        pred["received_fps"] = pred["produced_fps"]
        m = r["measured"]
        rows.append({"sweep": r["sweep"], "point": r["point"], "measured": m,
                     "predicted": {k: round(pred[k], 1) for k in KEYS} | {"bottleneck": pred["bottleneck"]},
                     "rel_error": {k: round((pred[k] - m[k]) / m[k], 3) for k in KEYS if m.get(k, 0) > 0}})
    return {"points": rows, **summary(rows)}


def point(sweep: str, label: str, job_path: str, base_sets: list, sets: list, prof, seconds: float,
          threads: int) -> dict:
    from tianji.control.planner.sharedhost import predict_on_host, predict_with_shares
    from tianji.control.spec import load_job

    allsets = base_sets + sets
    job = load_job(job_path, allsets)
    bg = probe_background()
    pred = predict_on_host(job, prof, float(os.cpu_count() or 1), bg, learner_threads=threads)
    pred["received_fps"] = pred["produced_fps"]
    meas = run_point(job_path, allsets, seconds)
    given = None
    if "shares" in meas and {"actor", "buffer", "learner"} <= set(meas["shares"]):
        sh = meas["shares"]
        given = predict_with_shares(job, prof, sh["actor"], sh["buffer"], sh["learner"], threads)
        given["received_fps"] = given["produced_fps"]
    row = {"sweep": sweep, "point": label, "set": sets, "background": round(bg, 2),
           "predicted": {k: round(pred[k], 1) for k in KEYS} | {"bottleneck": pred["bottleneck"]},
           "shares": {k: round(pred[k], 3) for k in ("actor_share", "buffer_share", "learner_share")}}
    if "error" in meas:
        row["error"] = meas["error"]
        return row
    row["measured"] = {k: round(meas[k], 1) for k in KEYS} | {
        "bottleneck": measured_kind(meas, job.spec.replay_ratio), "seconds": meas["seconds"]}
    row["rel_error"] = {k: round((pred[k] - meas[k]) / meas[k], 3) for k in KEYS if meas[k] > 0}
    if given is not None:
        row["measured_shares"] = {k: round(v, 3) for k, v in meas["shares"].items()}
        row["predicted_given_shares"] = {k: round(given[k], 1) for k in KEYS} | {"bottleneck": given["bottleneck"]}
        row["rel_error_given_shares"] = {k: round((given[k] - meas[k]) / meas[k], 3) for k in KEYS if meas[k] > 0}
    print(f"  {sweep} {label}: measured {row['measured']}  predicted {row['predicted']}", file=sys.stderr)
    return row


def draw(rows: list, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [("a", "(a) actors, learner fixed"), ("b", "(b) learner threads + batch"), ("c", "(c) groups")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, sweeps):
        pts = [r for r in rows if r["sweep"] == key and "measured" in r]
        x = range(len(pts))
        for k, c in (("produced_fps", "tab:blue"), ("consumed_sps", "tab:red")):
            ax.plot(x, [r["measured"][k] for r in pts], "o-", color=c, label=f"{k} measured")
            ax.plot(x, [r["predicted"][k] for r in pts], "x--", color=c, label=f"{k} predicted")
        ax.set_xticks(list(x), [r["point"] for r in pts])
        ax.set(title=title, ylabel="per second")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default=str(ROOT / "examples" / "cartpole-dqn.yaml"))
    ap.add_argument("--max-actors", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--profile", help="a `tianji profile` JSON (default: measure one now, 2 s per component)")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--sweeps", default="abc", help="which sweeps to run (a, b, c; default all)")
    ap.add_argument("--rescore", metavar="FILE", help="re-predict the points of a recorded scaling.json, run nothing")
    a = ap.parse_args(argv)
    if a.rescore:
        from tianji.control.planner.plan import load_profile

        if not a.profile:
            ap.error("--rescore needs the --profile the recorded run was predicted from")
        recorded = json.loads(Path(a.rescore).read_text())
        job = recorded.get("job", a.job)
        job = str(ROOT / job) if not Path(job).is_absolute() else job
        res = rescore(recorded, load_profile(a.profile), job, a.set, float(recorded.get("host", {}).get("cpus", 2)))
        emit({"bench": "scaling-rescore", **stamp("scaling", argv), "file": a.rescore, "profile": a.profile, **res},
             indent=None)
        return 0
    import torch

    torch.set_num_threads(1)
    from tianji.control.planner.plan import Profile
    from tianji.control.spec import load_job
    from tianji.runtime.profiling.profiler import measure_profile

    t0 = time.perf_counter()
    base = base_sets(a.seconds, a.set)
    prof_d = json.loads(Path(a.profile).read_text()) if a.profile else measure_profile(load_job(a.job, base), 2.0)
    prof = Profile.from_json(prof_d)
    B = load_job(a.job, base).spec.algorithm.batch_size
    rows = []
    for k in range(1, a.max_actors + 1 if "a" in a.sweeps else 1):
        rows.append(point("a", f"{k} actors", a.job, base, [f"spec.topology.actors={k}"], prof, a.seconds, 1))
    if "b" in a.sweeps:
        rows.append(point("b", "1 thread, B", a.job, base, ["spec.topology.actors=2"], prof, a.seconds, 1))
        rows.append(point("b", "2 threads, 2B", a.job, base, ["spec.topology.actors=2", "spec.resources.learner.cpu=2",
                          "spec.resources.learner.threads=2", f"spec.algorithm.batchSize={2 * B}"], prof, a.seconds, 2))
    if "c" in a.sweeps:
        rows.append(point("c", "1 group", a.job, base, ["spec.topology.actors=1"], prof, a.seconds, 1))
        for mode in ("average", "allreduce"):  # the mode in the record: the model treats them differently
            rows.append(point("c", f"2 groups, {mode}", a.job, base,
                              ["spec.topology.actors=1", "spec.topology.groups=2",
                               f"spec.topology.groupSync.mode={mode}"], prof, a.seconds, 1))
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    job_name = os.path.relpath(a.job, ROOT) if Path(a.job).resolve().is_relative_to(ROOT) else a.job
    res = {"bench": "scaling", **stamp("scaling", argv), "job": job_name, "seconds_per_point": a.seconds,
           "base_set": base, "points": rows, **summary(rows),
           "given_measured_cpu": summary(rows, "predicted_given_shares", "rel_error_given_shares"),
           "profile": {k: prof_d.get(k) for k in ("actor_fps_per_core", "learner_sps_per_core", "message_seconds",
                                                  "learner_thread_scaling", "param_bytes", "allreduce_seconds")},
           "host": host(), "seconds": round(time.perf_counter() - t0, 1)}
    (out_dir / "scaling.json").write_text(json.dumps(res, indent=1) + "\n")
    try:
        draw(rows, out_dir / "scaling.png")
    except ImportError as e:  # matplotlib missing: the JSON still stands
        res["png_error"] = str(e)
    emit({k: v for k, v in res.items() if k != "points"}, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
