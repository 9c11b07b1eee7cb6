"""`tianji run`: the local engine. One `tianji worker` process per role on this machine.

The launcher owns no training logic. It writes the resolved job to the run
dir, starts the workers (ipc:// sockets), collects their heartbeat reports,
restarts a worker that died or went silent (exponential back-off, capped),
shows progress, stops everyone at the stop criteria or on Ctrl-C/SIGTERM, and
writes `summary.json` and `metrics.jsonl`. Workers ask the kernel to kill
them if the launcher dies (PR_SET_PDEATHSIG), so no process outlives a run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

import zmq

from tianji.control.accounting import Aggregate
from tianji.observability.progress import Progress
from tianji.control.spec import TianJiJob, Topology, dump_job, load_job
from tianji.control.launch import worker_launch
from tianji.runtime.wire import WireError, decode

POLL_S = 0.1
SAMPLE_EVERY_S = 1.0
RECORD_EVERY_S = 1.0
STARTUP_TIMEOUT_S = 120.0  # first report (torch import on a loaded 2-core box can be slow)
HEARTBEAT_TIMEOUT_S = 30.0
STOP_GRACE_S = 15.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
MAX_RESTARTS = 10
ROLE_ORDER = ("learner", "buffer", "actor")


@dataclass
class Child:
    role: str
    group: int
    index: int
    proc: Optional[subprocess.Popen] = None
    log: Optional[IO] = None
    restarts: int = 0
    started_at: float = 0.0
    last_report: Optional[float] = None
    restart_at: Optional[float] = None
    exits: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.group}-{self.index}"


def resolve_topology(job: TianJiJob) -> TianJiJob:
    """`topology: auto` → the planner's topology and per-role resources for this machine."""
    if not job.spec.topology.auto:
        return job
    from tianji.control.plan import plan_for_job

    plan = plan_for_job(job)
    job = job.model_copy(deep=True)
    job.spec.topology = Topology(**plan.topology())
    for role in ("actor", "buffer", "learner"):
        rp = getattr(plan, role)
        r = getattr(job.spec.resources, role)
        r.cpu, r.gpu, r.threads = rp.cpu, rp.gpu, rp.threads
    return job


def default_run_dir(job: TianJiJob) -> Path:
    return Path("runs") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDirError(ValueError):
    pass


def run_job(job_path: Optional[str], overrides=(), run_dir: Optional[str] = None, max_seconds: Optional[float] = None,
            progress: bool = True, resume: Optional[str] = None) -> int:
    """Start a run (job_path) or continue one (resume=RUN_DIR, its job.yaml and newest checkpoints)."""
    if resume:
        rd = Path(resume)
        if not (rd / "job.yaml").is_file():
            raise RunDirError(f"--resume {resume}: no job.yaml there; is it a TianJi run directory?")
        job = load_job(rd / "job.yaml", overrides)
    else:
        job = resolve_topology(load_job(job_path, overrides))
        rd = Path(run_dir) if run_dir else default_run_dir(job)
        if (rd / "job.yaml").exists():
            raise RunDirError(f"{rd} already holds a run; continue it with `tianji run --resume {rd}` "
                              "or choose another --run-dir")
    summary = Launcher(job, rd.resolve(), max_seconds=max_seconds, progress=progress, resume=bool(resume)).run()
    return 0 if summary["exit_reason"] in ("target", "frames", "seconds") else (
        130 if summary["exit_reason"] == "interrupted" else 1)


class Launcher:
    def __init__(self, job: TianJiJob, run_dir: Path, max_seconds: Optional[float] = None, progress: bool = True,
                 resume: bool = False):
        self.job, self.run_dir = job, run_dir
        self.max_seconds = max_seconds
        self.progress_enabled = progress
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        self.job_file = run_dir / "job.yaml"
        self.job_file.write_text(dump_job(job))
        sock = run_dir / "sock"
        self.own_sock_dir = len(str(sock)) > 70  # unix socket paths are limited to 107 bytes
        self.sock_dir = Path(tempfile.mkdtemp(prefix="tianji-")) if self.own_sock_dir else sock
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        self.report_addr = f"ipc://{self.sock_dir}/launcher-report"
        t = job.spec.topology
        self.children = [Child(r, g, i) for r in ROLE_ORDER for g in range(t.groups)
                         for i in range(getattr(t, r + "s"))]
        self.dist_init = None
        if t.groups * t.learners > 1:  # data-parallel learners rendezvous on a free local port
            with socket.socket() as so:
                so.bind(("127.0.0.1", 0))
                self.dist_init = f"tcp://127.0.0.1:{so.getsockname()[1]}"
        self.agg = Aggregate()
        self.resumed_from: Optional[dict] = None
        if resume and (run_dir / "summary.json").exists():
            self._continue_counts(json.loads((run_dir / "summary.json").read_text()))
        self.rejected = 0
        self.interrupted = False
        self.error: Optional[str] = None

    def _continue_counts(self, prev: dict) -> None:
        """A resumed run keeps counting frames and episodes where the previous launch stopped."""
        self.resumed_from = {k: prev.get(k) for k in ("env_frames", "episodes", "policy_version", "exit_reason")}
        self.agg.retired["actor"]["env_frames_total"] = float(prev.get("env_frames", 0))
        self.agg.episodes_total = int(prev.get("episodes", 0))

    # ---------------------------------------------------------------- processes
    def _spawn(self, c: Child) -> None:
        launch = worker_launch(self.job, c.role, c.group, c.index, engine="local", job_file=str(self.job_file),
                               command=[sys.executable, "-m", "tianji.cli", "worker"], run_dir=str(self.run_dir),
                               report=self.report_addr, sock_dir=str(self.sock_dir), parent_pid=os.getpid(),
                               dist_init=self.dist_init)
        env = {**os.environ, **launch.env}
        if "GLIBC_TUNABLES" in os.environ:  # the user's own tunables win
            env["GLIBC_TUNABLES"] = os.environ["GLIBC_TUNABLES"]
        if c.log is None:
            c.log = open(self.run_dir / "logs" / f"{c.name}.log", "ab")
        # Own session: Ctrl-C reaches the launcher only, which then stops workers in order.
        c.proc = subprocess.Popen(launch.argv, stdout=c.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        c.started_at = time.monotonic()
        c.last_report = None
        c.restart_at = None

    def _supervise(self, now: float) -> None:
        for c in self.children:
            if c.restart_at is not None:
                if now >= c.restart_at:
                    self._spawn(c)
                continue
            code = c.proc.poll()
            silent = (now - c.last_report > HEARTBEAT_TIMEOUT_S) if c.last_report is not None \
                else (now - c.started_at > STARTUP_TIMEOUT_S)
            if code is None and not silent:
                continue
            if code is None:  # alive but not beating: treat as hung
                c.proc.kill()
                c.proc.wait()
                code = "no heartbeat"
            c.exits.append(code)
            if c.restarts >= MAX_RESTARTS:
                self.error = f"{c.name} failed {c.restarts + 1} times (last: {code}); see {c.log.name}"
                return
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** c.restarts)
            c.restarts += 1
            c.restart_at = now + delay
            print(f"tianji: {c.name} exited ({code}); restart {c.restarts} in {delay:.1f}s", file=sys.stderr)

    def _stop_children(self, sock: zmq.Socket) -> None:
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(c.proc and c.proc.poll() is None for c in self.children):
            self._drain(sock, 0.05)
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
        self._drain(sock, 0.2)  # final reports written just before exit
        for c in self.children:
            if c.log:
                c.log.close()

    # ---------------------------------------------------------------- reports
    def _drain(self, sock: zmq.Socket, timeout: float) -> None:
        if not sock.poll(timeout * 1000):
            return
        while True:
            try:
                frames = sock.recv_multipart(copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = decode(frames, job=self.job.name)
                meta = msg.meta
                if msg.kind != "report" or meta.get("role") not in ("actor", "buffer", "learner") \
                        or not isinstance(meta.get("group"), int) or not isinstance(meta.get("index"), int) \
                        or not isinstance(meta.get("pid"), int) or not isinstance(meta.get("metrics"), dict):
                    raise WireError("report", "malformed report")
            except WireError:
                self.rejected += 1
                continue
            key = self.agg.take(meta)
            if meta.get("episodes"):
                self._check_target(time.monotonic())
            for c in self.children:
                if (c.role, c.group, c.index) == key and c.proc is not None and c.proc.pid == meta["pid"]:
                    c.last_report = time.monotonic()

    # ---------------------------------------------------------------- stop rule
    def _exit_reason(self, now: float) -> Optional[str]:
        stop = self.job.spec.stop
        if self.error:
            return "error"
        if self.interrupted:
            return "interrupted"
        if self.agg.target_reached_at is not None:
            return "target"
        if stop.env_frames and self.agg.totals()["env_frames"] >= stop.env_frames:
            return "frames"
        limit = min(x for x in (stop.seconds, self.max_seconds, float("inf")) if x is not None)
        if self.agg.elapsed(now) >= limit:
            return "seconds"
        return None

    def _check_target(self, now: float) -> None:
        target = self.job.spec.stop.mean_return
        if target is None or self.agg.target_reached_at is not None:
            return
        if len(self.agg.episodes) >= 100 and self.agg.mean_return() >= target:
            self.agg.target_reached_at = self.agg.elapsed(now)

    # ---------------------------------------------------------------- outputs
    def _row(self, now: float) -> dict:
        agg = self.agg
        tot = agg.totals()
        dropped = sum(agg.reasons("samples_dropped_total").values())
        ckpts = [p.extra.get("checkpoint") for p in agg.procs.values() if p.role == "learner"]
        return {"elapsed": agg.elapsed(now), "env_frames": tot["env_frames"], **agg.rates(),
                "policy_version": agg.policy_version(), "lag": agg.lag(), "episodes": agg.episodes_total,
                "mean_return": agg.mean_return(), "dropped": dropped, "rejected": agg.rejected() + self.rejected,
                "restarts": self._restarts(), "checkpoint": next((c for c in ckpts if c), None)}

    def _restarts(self) -> dict[str, int]:
        out = {"actor": 0, "buffer": 0, "learner": 0}
        for c in self.children:
            out[c.role] += c.restarts
        return out

    def _record(self, f: IO, now: float) -> None:
        row = self._row(now)
        row["t"] = round(row.pop("elapsed"), 3)
        row["dropped_by_reason"] = self.agg.reasons("samples_dropped_total")
        row["processes"] = self.agg.role_rates()
        f.write(json.dumps(row) + "\n")
        f.flush()

    def summary(self, reason: str, wall: float) -> dict:
        agg, spec = self.agg, self.job.spec
        tot = agg.totals()
        t = spec.topology
        w = max(wall, 1e-9)
        mean = agg.mean_return()
        return {
            "job": self.job.name, "algorithm": spec.algorithm.name, "env": spec.env.id,
            "target_return": float(spec.stop.mean_return) if spec.stop.mean_return is not None else None,
            "reached_target": agg.target_reached_at is not None,
            "seconds_to_target": round(agg.target_reached_at, 3) if agg.target_reached_at is not None else None,
            "wall_seconds": round(wall, 3), "env_frames": int(tot["env_frames"]), "episodes": agg.episodes_total,
            "mean_return": float(mean) if mean is not None else 0.0,
            "throughput": {"produced_fps": tot["env_frames"] / w, "received_fps": tot["received"] / w,
                           "consumed_sps": tot["consumed"] / w, "train_steps_per_s": tot["train_steps"] / w},
            "policy_lag": {k: (v if v is not None else 0.0) for k, v in agg.lag().items()},
            "processes": {"actors": t.groups * t.actors, "buffers": t.groups * t.buffers,
                          "learners": t.groups * t.learners},
            "bytes_sent": int(tot["bytes_sent"]),
            "bytes_sent_per_frame": {r: agg.role_totals(r).get("bytes_sent_total", 0.0) / max(tot["env_frames"], 1.0)
                                     for r in ("actor", "buffer", "learner")},
            "rejected_messages": agg.rejected() + self.rejected,
            "rejected_by_reason": {**agg.reasons("messages_rejected_total"),
                                   **({"launcher_report": self.rejected} if self.rejected else {})},
            "exit_reason": reason,
            "restarts": self._restarts(),
            "dropped_samples": agg.reasons("samples_dropped_total"),
            "policy_version": agg.policy_version(),
            "run_dir": str(self.run_dir),
            **({"resumed_from": self.resumed_from} if self.resumed_from else {}),
            **({"error": self.error} if self.error else {}),
        }

    # ---------------------------------------------------------------- main loop
    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True

    def run(self) -> dict:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.report_addr)
        reason = "error"
        t0 = time.monotonic()
        try:
            with open(self.run_dir / "metrics.jsonl", "a") as mf, \
                    Progress(f"TianJi · {self.job.name}", self.progress_enabled, caption=str(self.run_dir)) as view:
                for c in self.children:
                    self._spawn(c)
                last_sample = last_record = 0.0
                while True:
                    self._drain(sock, POLL_S)
                    now = time.monotonic()
                    if not self.interrupted:
                        self._supervise(now)
                    if now - last_sample >= SAMPLE_EVERY_S:
                        last_sample = now
                        self.agg.sample(now)  # (the target is checked as episodes arrive, in _drain)
                        view.update(self._row(now))
                    if now - last_record >= RECORD_EVERY_S:
                        last_record = now
                        self._record(mf, now)
                    r = self._exit_reason(now)
                    if r:
                        reason = r
                        break
                self._stop_children(sock)
                now = time.monotonic()
                self.agg.sample(now)
                self._record(mf, now)
                view.update(self._row(now))
        except Exception as e:  # still write what we know: nothing is lost on failure
            import traceback

            traceback.print_exc()
            self.error = self.error or f"launcher failed: {type(e).__name__}: {e}"
            reason = "error"
            for c in self.children:
                if c.proc is not None and c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait()
        finally:
            sock.close()
            ctx.term()
            shutil.rmtree(self.sock_dir, ignore_errors=True)  # no socket file outlives the run
            for s, h in old.items():
                signal.signal(s, h)
        wall = time.monotonic() - t0
        summary = self.summary(reason, wall)
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")
        print(f"tianji: {self.job.name} ended ({reason}) after {wall:.1f}s: {int(summary['env_frames'])} frames, "
              f"mean return {summary['mean_return']:.1f}; summary: {self.run_dir / 'summary.json'}",
              file=sys.stderr)
        return summary
