"""The GPU device check: Pong on one machine with one GPU, in one command (bench/device/run.sh).

    bench/device/run.sh [--out DIR] [--budget SECONDS] [--steps abecd]  # on the GPU machine
    bench/device/run.sh --dry-run                                      # every step briefly, on the CPU

Steps, in the order a b e c d v, each in its own process with its own timeout; a step that fails records its
error in its JSON and the next one runs:

  (a) `tianji profile` of examples/pong-ppo.yaml and examples/pong-dqn.yaml (the GPU learner's
      samples/s, device name and precision included)            -> profile-pong-ppo.json, profile-pong-dqn.json
  (b) Pong PPO with one GPU learner and 1, 2, 4, 8, 14 actor processes: consumed samples/s and
      produced frames/s after warm-up (the scaling curve)       -> scaling-pong-ppo.json
  (e) Pong PPO at 4, 8 and 14 actors, lock step (actors one share ahead of the learner) against
      pipelined (creditWindow + 1 shares ahead, the default), side by side, every role traced
      (bench/pipeline_trace.py: the learner's busy and starved time, the actors' delays)
                                                                -> pipeline-pong-ppo.json
  (t) on its own (--steps t): CartPole PPO (CPU learner) on the idle cores, every role traced,
      the example against one change per arm                    -> trace-cartpole-ppo.json
  (v) on its own (--steps v): bench/planner_validation.py on this machine's quiet CPUs: random
      CartPole topologies predicted and run, then the plan against random ones on time to
      target                                                    -> planner-validation.json,
                                                                   planner-time-to-target.json
  (c) Pong PPO at the plan `tianji plan --cpus CORES --gpus GPUS --profile (a)` makes for this
      machine: mean return and frames over time                 -> pong-ppo-planned.json
  (d) Stable-Baselines3 PPO (CnnPolicy, 16 SubprocVecEnv envs, rl-zoo Atari settings, the same
      GPU) for as long as (c)                                   -> pong-sb3.json
  and run.json: the machine, each step's status and wall time.

The whole run fits --budget seconds (default 480): (a) and (b) have fixed lengths, (c) and (d)
split what is left equally (at most 150 s each), so they stay comparable. Every JSON carries the
machine (`machine`: GPU name, driver, cores, CPU, torch, Python), the command and the date. At
most 7 files, no subfolders: the device tool returns only 8. Run folders go to a temp dir.

--dry-run: the same steps for a few seconds each on the CPU with small batches (the learner on
the CPU: no GPU is asked for), into a temp dir unless --out is given; the test suite runs it
(tests/bench/test_device_dryrun.py) so the script cannot rot. (d) is skipped with the reason when
stable-baselines3 is not importable.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import cpu_name

ROOT = Path(__file__).resolve().parent.parent.parent

JOBS = {"ppo": ROOT / "examples" / "pong-ppo.yaml", "dqn": ROOT / "examples" / "pong-dqn.yaml"}
ACTOR_COUNTS = (1, 2, 4, 8, 14)
PIPELINE_ACTORS = (4, 8, 14)  # (e): lock step against pipelined at these actor counts
PIPELINE_RUN_S = 28.0  # (e): each run
VALIDATION_POINTS, VALIDATION_S = 6, 25.0  # (v): random topologies, seconds each
TTT_RANDOM, TTT_BUDGET_S = 3, 60.0  # (v): random topologies against the plan, seconds cap to target
TTT_OVERHEAD_S = 25.0  # (v): a time-to-target run's start-up, summary and quiet-gate settling
CD_CAP_S = 150.0  # (c) and (d) each at most this long
CD_MIN_S = 60.0  # (b) stops adding points before (c) and (d) would get less
SCALING_RUN_S = 22.0  # (b): each run; its workers start in the first ~8-10 s (CUDA included)
RUN_OVERHEAD_S = 15.0  # a `tianji run` beyond --max-seconds: imports, env check, shutdown, summary
WARMUP_S = 3.0  # (b): rows this long after the first consumed sample are warm-up
DRY_RUN_FRAMES = 2048  # --dry-run: a run stops after this many frames (64 small fragments)...
DRY_RUN_MAX_S = 240.0  # ...or this many seconds
DRY_RUN_S = 5.0  # --dry-run: (d)'s length
CARTPOLE = ROOT / "examples" / "cartpole-ppo.yaml"
CARTPOLE_TRACE_S = 14.0  # (t): each arm
# (t): (name, overrides, TIANJI_CPU_LIMITS); the first is the example as it is
CARTPOLE_ARMS = (
    ("default", (), None),
    ("learner-2-threads", ("spec.resources.learner.cpu=2", "spec.resources.learner.threads=2"), None),
    ("unpaced", ("spec.staleness.paceActors=false",), None),
    ("no-cpu-limits", (), "off"),
    ("actors-6", ("spec.topology.actors=6",), None),
)

# Small shapes for --dry-run: the real code paths, a few seconds each on a 2-core CPU.
TINY = {
    "ppo": ["spec.env.numEnvs=2", "spec.env.fragmentLength=16", "spec.algorithm.batchSize=32",
            "spec.algorithm.minibatchSize=16", "spec.algorithm.epochs=1"],
    "dqn": ["spec.env.numEnvs=2", "spec.env.fragmentLength=16", "spec.algorithm.batchSize=8",
            "spec.algorithm.stepsPerBatch=2", "spec.algorithm.replayCapacity=2000",
            "spec.algorithm.learningStarts=64"],
}


# ----------------------------------------------------------------- the machine
def gpu_facts() -> dict:
    """GPU count and name from torch, driver from nvidia-smi (absent: None)."""
    out: dict = {"gpus": 0, "gpu": None, "driver": None, "cuda": None, "bf16": None}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out.update(gpus=torch.cuda.device_count(), gpu=torch.cuda.get_device_name(0),
                       cuda=torch.version.cuda, bf16=bool(torch.cuda.is_bf16_supported()))
    except Exception as e:  # noqa: BLE001 - recorded: the steps will say more
        out["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if q.returncode == 0 and q.stdout.strip():
            out["driver"] = q.stdout.strip().splitlines()[0].split(",")[0].strip()
            out["nvidia_smi"] = q.stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def machine() -> dict:
    import platform

    return {"cores": os.cpu_count(), "cpu": cpu_name(), "python": platform.python_version(),
            "platform": platform.platform(), **gpu_facts()}


class Context:
    """What every step shares: the output and work folders, the clock, the machine, the stamp."""

    def __init__(self, a: argparse.Namespace, argv: list[str]):
        self.dry = a.dry_run
        self.out = Path(a.out) if a.out else (Path(tempfile.mkdtemp(prefix="tianji-device-")) if self.dry
                                              else ROOT / "docs" / "device")
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="tianji-device-runs-"))
        self.t0 = time.monotonic()
        self.budget = a.budget if a.budget is not None else (900.0 if self.dry else 480.0)
        self.machine = machine()
        self.gpus = 0 if self.dry else int(self.machine["gpus"] or 0)
        self.cores = int(os.cpu_count() or 1)
        self.stamp = {"command": " ".join(["bench/device/run.sh", *argv]),
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": self.dry,
                      "machine": self.machine}

    def remove_work(self) -> None:
        """The runs' folders and logs go when the check ends (a failed step's log tail is in its result)."""
        shutil.rmtree(self.work, ignore_errors=True)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def tiny(self, algo: str) -> list[str]:
        return TINY[algo] if self.dry else []

    def write(self, name: str, doc: dict) -> Path:
        path = self.out / name
        path.write_text(json.dumps({**self.stamp, **doc}, indent=1) + "\n")
        return path


# ----------------------------------------------------------------- processes
def run_cmd(cmd: list[str], timeout: float, log: Path, env_extra: dict | None = None) -> dict:
    """Run `cmd` in its own session (its workers too) with output to `log`; on timeout SIGINT the
    group (a `tianji run` then stops in order and writes its summary), then SIGKILL."""
    env = {**os.environ, **(env_extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT / "worker"),
                                                      str(ROOT / "operator")]))
    t0 = time.monotonic()
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        p = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            rc = p.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(p)
            rc = p.returncode
    return {"rc": rc, "timed_out": timed_out, "wall_seconds": round(time.monotonic() - t0, 1),
            "log_tail": _tail(log) if rc != 0 or timed_out else None}


def _stop_group(p: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def tianji(*args: str) -> list[str]:
    return [sys.executable, "-m", "tianji.cli", *args]


def sets(items: list[str]) -> list[str]:
    return [x for s in items for x in ("--set", s)]


# ----------------------------------------------------------------- (a) profiles
def step_profiles(ctx: Context) -> dict:
    seconds = 0.2 if ctx.dry else 2.0
    out = {}
    for algo in ("ppo", "dqn"):
        path = ctx.out / f"profile-pong-{algo}.json"
        r = run_cmd(tianji("profile", str(JOBS[algo]), "--seconds", f"{seconds:g}", "--out", str(path),
                           *sets(ctx.tiny(algo))), min(300.0 if ctx.dry else 100.0, max(ctx.left(), 1.0)),
                   ctx.work / f"profile-{algo}.log")
        doc = _read_json(path) if r["rc"] == 0 else None
        if doc is None:
            doc = {"error": f"tianji profile exited {r['rc']}" + (" (timed out)" if r["timed_out"] else ""),
                   "log_tail": r["log_tail"]}
        doc.update(step="a", algo=algo, seconds_per_component=seconds, step_wall_seconds=r["wall_seconds"])
        ctx.write(path.name, doc)
        gpu = doc.get("learner_gpu") or {}
        out[algo] = {"ok": "error" not in doc, "learner_sps_per_gpu": doc.get("learner_sps_per_gpu"),
                     "gpu": gpu.get("device_name"), "precision": gpu.get("precision"),
                     "wall_seconds": r["wall_seconds"]}
    return out


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------- runs
def rows_of(run_dir: Path) -> list[dict]:
    rows = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        rows.append({"t": r.get("t"), "env_frames": r.get("env_frames"), "episodes": r.get("episodes"),
                     "mean_return": r.get("mean_return"), "produced_fps": round(r.get("produced_fps", 0.0), 1),
                     "consumed_sps": round(r.get("consumed_sps", 0.0), 1),
                     "policy_version": r.get("policy_version")})
    return rows


def steady_rates(rows: list[dict]) -> dict:
    """Mean windowed rates over the rows from WARMUP_S after the first consumed sample to the end."""
    first = next((r["t"] for r in rows if r["consumed_sps"] > 0), None)
    if first is None:
        return {"consumed_sps": 0.0, "produced_fps": 0.0, "rows": 0, "from_t": None}
    steady = [r for r in rows if r["t"] >= first + WARMUP_S] or [r for r in rows if r["t"] >= first]
    mean = lambda k: sum(r[k] for r in steady) / len(steady)  # noqa: E731
    return {"consumed_sps": round(mean("consumed_sps"), 1), "produced_fps": round(mean("produced_fps"), 1),
            "rows": len(steady), "from_t": steady[0]["t"], "to_t": steady[-1]["t"]}


def tianji_run(ctx: Context, name: str, overrides: list[str], seconds: float, extra: tuple = (),
               env_extra: dict | None = None, job: Path = JOBS["ppo"]) -> dict:
    """One `tianji run` of `job` (Pong PPO) for `seconds` (no other stop rule, no evaluator); its summary
    and rows."""
    run_dir = ctx.work / name
    stop = ["spec.stop.meanReturn=null", "spec.stop.envFrames=null", "spec.evaluation.intervalSeconds=null"]
    if ctx.dry:  # a dry run ends on frames, however long a loaded box takes to start the processes
        stop[1], seconds = f"spec.stop.envFrames={DRY_RUN_FRAMES}", DRY_RUN_MAX_S
    tiny = ctx.tiny("ppo") if job == JOBS["ppo"] else []
    cmd = tianji("run", str(job), "--run-dir", str(run_dir), "--quiet", "--max-seconds", f"{seconds:g}",
                 *extra, *sets([*stop, *tiny, *overrides]))
    r = run_cmd(cmd, seconds + RUN_OVERHEAD_S + 30.0, ctx.work / f"{name}.log", env_extra)
    summary = _read_json(run_dir / "summary.json")
    out = {"overrides": overrides, "max_seconds": seconds, "rc": r["rc"], "timed_out": r["timed_out"],
           "wall_seconds": r["wall_seconds"]}
    if summary is None:
        out["error"] = f"no summary.json (tianji run exited {r['rc']})"
        out["log_tail"] = r["log_tail"]
        return out
    job = _read_json_yaml(run_dir / "job.yaml")
    out.update(rows=rows_of(run_dir), exit_reason=summary.get("exit_reason"), env_frames=summary.get("env_frames"),
               episodes=summary.get("episodes"), mean_return=summary.get("mean_return"),
               throughput=summary.get("throughput"), policy_lag=summary.get("policy_lag"),
               dropped_samples=summary.get("dropped_samples"), restarts=summary.get("restarts"),
               processes=summary.get("processes"), resolved=job)
    if summary.get("error"):
        out["error"] = summary["error"]
    return out


def _read_json_yaml(path: Path):
    """The resolved job's topology and resources (what the run really ran)."""
    try:
        import yaml

        spec = yaml.safe_load(path.read_text())["spec"]
        return {"topology": spec.get("topology"), "resources": spec.get("resources"),
                "batch_size": spec.get("algorithm", {}).get("batchSize"),
                "precision": spec.get("algorithm", {}).get("precision")}
    except Exception:  # noqa: BLE001 - detail only
        return None


def one_learner_sets(ctx: Context, actors: int) -> list[str]:
    """`actors` actor processes, one buffer, one learner (the GPU where there is one): one core per
    actor, one for the buffer, one for the learner's host side, so 14 actors fill 16 (a dry run on
    2 cores: halves, so that the planner admits the topology)."""
    cpu = 0.5 if ctx.dry else 1
    return [*gpu_sets(ctx), f"spec.topology.actors={actors}", "spec.topology.buffers=1", "spec.topology.learners=1",
            f"spec.resources.actor.cpu={cpu}", f"spec.resources.buffer.cpu={cpu}", "spec.resources.learner.cpu=1",
            "spec.resources.learner.threads=1"]


def gpu_sets(ctx: Context) -> list[str]:
    base = [f"spec.resources.cpus={ctx.cores}", f"spec.resources.gpus={ctx.gpus}"]
    return base + (["spec.resources.learner.gpu=1"] if ctx.gpus else [])


# ----------------------------------------------------------------- (b) scaling
def step_scaling(ctx: Context) -> dict:
    counts = [n for n in ACTOR_COUNTS if n <= max(1, ctx.cores - 2)] if not ctx.dry else [1]
    seconds = DRY_RUN_S if ctx.dry else SCALING_RUN_S
    points = []
    for n in counts:
        if ctx.left() < seconds + RUN_OVERHEAD_S + 2 * (CD_MIN_S + RUN_OVERHEAD_S):  # room for (c) and (d)
            points.append({"actors": n, "skipped": "out of budget"})
            continue
        res = tianji_run(ctx, f"scaling-{n}", one_learner_sets(ctx, n), seconds)
        res["actors"] = n
        res["steady"] = steady_rates(res.get("rows", []))
        points.append(res)
    doc = {"step": "b", "job": "examples/pong-ppo.yaml", "learner": "gpu" if ctx.gpus else "cpu",
           "warmup_seconds_after_first_update": WARMUP_S,
           "curve": [{"actors": p["actors"], **{k: p["steady"][k] for k in ("consumed_sps", "produced_fps")}}
                     for p in points if "steady" in p and "error" not in p],
           "points": points}
    ctx.write("scaling-pong-ppo.json", doc)
    return {"curve": doc["curve"]}


# ----------------------------------------------------------------- (e) pipelined against lock step
def step_pipeline(ctx: Context) -> dict:
    """Pong PPO at 4, 8 and 14 actors, each twice side by side: actors one share ahead of the learner
    (lock step: depth 1) and creditWindow + 1 ahead (the default: one batch trains while the next
    is produced), every role traced (runtime/trace.py, analysed by bench/pipeline_trace.py)."""
    from bench.pipeline_trace import analyse
    from tianji.runtime.pacing import ENV_BENCH_DEPTH
    from tianji.runtime.trace import ENV_TRACE

    counts = [1] if ctx.dry else list(PIPELINE_ACTORS)
    seconds = DRY_RUN_S if ctx.dry else PIPELINE_RUN_S
    points = []
    for n in counts:
        for arm, depth in (("lockstep", "1"), ("pipelined", "")):
            if ctx.left() < seconds + RUN_OVERHEAD_S + 2 * (CD_MIN_S / 2 + RUN_OVERHEAD_S):  # room for (c), (d)
                points.append({"actors": n, "arm": arm, "skipped": "out of budget"})
                continue
            trace = ctx.work / f"trace-{arm}-{n}"
            res = tianji_run(ctx, f"pipeline-{arm}-{n}", one_learner_sets(ctx, n), seconds,
                             env_extra={ENV_TRACE: str(trace), ENV_BENCH_DEPTH: depth})
            res.update(actors=n, arm=arm, steady=steady_rates(res.get("rows", [])), trace=analyse(trace))
            points.append(res)
    doc = {"step": "e", "job": "examples/pong-ppo.yaml", "learner": "gpu" if ctx.gpus else "cpu",
           "env": {"lockstep": f"{ENV_BENCH_DEPTH}=1", "pipelined": "(default: creditWindow + 1)"},
           "table": [{"actors": p["actors"], "arm": p["arm"], **p["steady"],
                      "policy_lag_mean": (p.get("policy_lag") or {}).get("mean"),
                      "learner_busy": (p["trace"].get("learner") or {}).get("busy_fraction")}
                     for p in points if "steady" in p and "error" not in p],
           "points": points}
    ctx.write("pipeline-pong-ppo.json", doc)
    return {"table": doc["table"]}


# ----------------------------------------------------------------- (t) CartPole on idle CPUs, traced
def step_cartpole_trace(ctx: Context) -> dict:
    """CartPole PPO (the embedded default, CPU learner) on a machine with idle cores, every role
    traced: where an update's period goes when the cores are not the limit. Arms change one
    thing each; the first is the example as it is (on a fresh machine also its first run)."""
    from bench.pipeline_trace import analyse
    from tianji.local.cpulimits import ENV as ENV_CPU_LIMITS
    from tianji.runtime.trace import ENV_TRACE

    seconds = DRY_RUN_S if ctx.dry else CARTPOLE_TRACE_S
    points = []
    for arm, overrides, env in CARTPOLE_ARMS[:1] if ctx.dry else CARTPOLE_ARMS:
        if ctx.left() < seconds + RUN_OVERHEAD_S:
            points.append({"arm": arm, "skipped": "out of budget"})
            continue
        trace = ctx.work / f"trace-cartpole-{arm}"
        res = tianji_run(ctx, f"cartpole-{arm}", list(overrides), seconds, job=CARTPOLE,
                         env_extra={ENV_TRACE: str(trace), **({ENV_CPU_LIMITS: env} if env else {})})
        res.update(arm=arm, steady=steady_rates(res.get("rows", [])), trace=analyse(trace))
        points.append(res)
    doc = {"step": "t", "job": "examples/cartpole-ppo.yaml", "seconds": seconds,
           "table": [{"arm": p["arm"], **p["steady"], "policy_lag_mean": (p.get("policy_lag") or {}).get("mean"),
                      "learner": (p["trace"].get("learner") or {}), "actors": (p["trace"].get("actors") or {}),
                      "buffer_to_learner_s": p["trace"].get("buffer_to_learner_s")}
                     for p in points if "steady" in p and "error" not in p],
           "points": [{k: v for k, v in p.items() if k != "trace"} for p in points]}
    ctx.write("trace-cartpole-ppo.json", doc)
    return {"table": [{k: r.get(k) for k in ("arm", "consumed_sps", "produced_fps")} for r in doc["table"]]}


# ----------------------------------------------------------------- (v) planner validation, quiet
def step_validation(ctx: Context) -> dict:
    """bench/planner_validation.py on this machine's CPUs, which nothing else uses: random CartPole
    topologies predicted and run (median absolute error), then the planner's topology against
    random ones on seconds to a mean return of 475. Its quiet gate stays on (0.5 load per core)."""
    def run(name: str, args: list[str], timeout: float) -> dict:
        cmd = [sys.executable, "-m", "bench.planner_validation", *args, "--out-dir", str(ctx.out)]
        return run_cmd(cmd, timeout, ctx.work / f"{name}.log")

    if ctx.dry:
        r = run("validation", ["--n", "1", "--seconds", "20", "--algos", "ppo", "--max-load", "100", "--settle-s", "0"],
                DRY_RUN_MAX_S)
        return {"validation": {"rc": r["rc"], **_summary(ctx.out / "planner-validation.json")}}
    r = run("validation", ["--n", str(VALIDATION_POINTS), "--seconds", f"{VALIDATION_S:g}"], ctx.left() - 5)
    out = {"validation": {"rc": r["rc"], "log_tail": r["log_tail"], **_summary(ctx.out / "planner-validation.json")}}
    # The plan and as many random topologies (at most TTT_RANDOM) as the time left holds, each
    # run costing its cap plus start-up and the quiet gate's settling.
    n_random = min(TTT_RANDOM, int(ctx.left() // (TTT_BUDGET_S + TTT_OVERHEAD_S)) - 1)
    if n_random >= 1:
        r = run("time-to-target", ["--time-to-target", "--random", str(n_random), "--budget-s", f"{TTT_BUDGET_S:g}",
                                   "--algos", "ppo"], ctx.left() - 5)
        out["time_to_target"] = {"rc": r["rc"], "random": n_random, "log_tail": r["log_tail"]}
    else:
        out["time_to_target"] = {"skipped": f"{ctx.left():.0f} s left"}
    return out


def _summary(path: Path) -> dict:
    d = _read_json(path) or {}
    return {k: d.get(k) for k in ("points_run", "median_abs_error", "max_abs_error", "kind_accuracy")}


# ----------------------------------------------------------------- (c) planned run
def cd_seconds(ctx: Context) -> float:
    """(c)'s and (d)'s equal length: half of what is left after their start-up, capped."""
    if ctx.dry:
        return DRY_RUN_S
    return max(CD_MIN_S / 2, min(CD_CAP_S, (ctx.left() - 2 * RUN_OVERHEAD_S - 10.0) / 2))


def step_planned(ctx: Context, seconds: float) -> dict:
    prof = ctx.out / "profile-pong-ppo.json"
    use_prof = prof.is_file() and "error" not in (_read_json(prof) or {"error": 1})
    extra = ("--profile", str(prof)) if use_prof else ()
    plan_cmd = tianji("plan", str(JOBS["ppo"]), "--cpus", str(ctx.cores), "--gpus", str(ctx.gpus), "--json",
                      *extra, *sets(ctx.tiny("ppo")))
    try:
        q = subprocess.run(plan_cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "worker")]))})
        plan = json.loads(q.stdout) if q.returncode == 0 else {"error": q.stderr[-2000:]}
    except (subprocess.TimeoutExpired, ValueError) as e:
        plan = {"error": f"{type(e).__name__}: {e}"}
    res = tianji_run(ctx, "planned", ["spec.topology=auto", *gpu_sets(ctx)], seconds, extra)
    doc = {"step": "c", "job": "examples/pong-ppo.yaml", "profile": str(prof.name) if use_prof else None,
           "plan_command": " ".join(["tianji", *plan_cmd[3:]]), "plan": plan, "run": res}
    ctx.write("pong-ppo-planned.json", doc)
    return {"env_frames": res.get("env_frames"), "mean_return": res.get("mean_return"),
            "topology": (res.get("resolved") or {}).get("topology"), "error": res.get("error")}


# ----------------------------------------------------------------- (d) SB3
def step_sb3(ctx: Context, seconds: float) -> dict:
    path = ctx.out / "pong-sb3.json"
    try:
        import stable_baselines3  # noqa: F401
    except ImportError as e:
        ctx.write(path.name, {"step": "d", "skipped": f"stable-baselines3 is not importable ({e})"})
        return {"skipped": True}
    envs = 2 if ctx.dry else 16
    r = run_cmd([sys.executable, str(ROOT / "bench" / "device" / "sb3_pong.py"), "--seconds", f"{seconds:g}",
                 "--envs", str(envs), "--device", "cuda" if ctx.gpus else "cpu", "--out", str(path)]
                + (["--tiny"] if ctx.dry else []), seconds + 90.0, ctx.work / "sb3.log")
    doc = _read_json(path)
    if doc is None or r["rc"] != 0:
        doc = {**(doc or {}), "error": f"sb3_pong.py exited {r['rc']}" + (" (timed out)" if r["timed_out"] else ""),
               "log_tail": r["log_tail"]}
    doc.update(step="d", step_wall_seconds=r["wall_seconds"])
    ctx.write(path.name, doc)
    return {"env_frames": doc.get("env_frames"), "mean_return": doc.get("mean_return"), "error": doc.get("error")}


# ----------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="output folder (default docs/device; --dry-run: a temp folder)")
    ap.add_argument("--budget", type=float,
                    help="seconds for all steps (default 480; --dry-run: 900, a bound only: its steps are short)")
    ap.add_argument("--steps", default="abecd",
                    help="which steps to run, in the order a b e t c d v (default abecd; t and v: calls of their own)")
    ap.add_argument("--dry-run", action="store_true", help="every step briefly on the CPU, small batches")
    a = ap.parse_args(argv)
    ctx = Context(a, argv)
    print(f"device check: out {ctx.out}, work {ctx.work}, budget {ctx.budget:g}s, "
          f"gpu {ctx.machine.get('gpu')}", file=sys.stderr, flush=True)
    try:
        return run_steps(ctx, a.steps)
    finally:
        ctx.remove_work()


def run_steps(ctx: Context, steps: str) -> int:
    report: dict = {"steps": {}}
    cd = None
    for key, fn in (("a", step_profiles), ("b", step_scaling), ("e", step_pipeline), ("t", step_cartpole_trace),
                    ("c", step_planned), ("d", step_sb3), ("v", step_validation)):
        if key not in steps:
            continue
        t = time.monotonic()
        try:
            if key in "cd":
                cd = cd or cd_seconds(ctx)
                res = fn(ctx, cd)
            else:
                res = fn(ctx)
            status = "ok"
        except Exception as e:  # noqa: BLE001 - a failed step is recorded; the next one runs
            import traceback

            res, status = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}, "error"
        report["steps"][key] = {"status": status, "wall_seconds": round(time.monotonic() - t, 1), **res}
        ctx.write("run.json", {**report, "wall_seconds": round(time.monotonic() - ctx.t0, 1)})  # so far
        print(f"device check: step {key} {status} in {time.monotonic() - t:.0f}s: "
              f"{json.dumps(res, default=str)[:400]}", file=sys.stderr, flush=True)
    report["wall_seconds"] = round(time.monotonic() - ctx.t0, 1)
    report["cd_seconds"] = cd
    report["files"] = sorted(p.name for p in ctx.out.iterdir() if p.suffix == ".json")
    ctx.write("run.json", report)
    print(json.dumps({"out": str(ctx.out), **report}, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
