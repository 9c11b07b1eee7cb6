"""`tianji run`: the local engine. One `tianji worker` process per role on this machine.

The local engine is an adapter: processes instead of pods. Everything that
gives a run its meaning is tianji.control's, shared with the operator: the plan
(`resolve`), the worker command and environment (`worker_launch`), the counting
(`Accounting`) and the stop rule (`StopRule`). What is left here: write the
resolved job to the run dir, start the workers (ipc:// sockets), feed their
pushed reports to the accounting, restart a worker that died or went silent
(exponential back-off, capped), show progress, stop everyone at the stop rule
or on Ctrl-C/SIGTERM, and write `summary.json`, `metrics.jsonl` (with the learners'
statistics and the lag histogram), TensorBoard event files (and W&B, if `spec.wandb`),
all from the same records, and `accounting.json` (what `--resume` continues counting from). Workers ask the
kernel to kill them if the launcher dies (PR_SET_PDEATHSIG), so no process
outlives a run. `--metrics-port` serves every role's metrics for Prometheus.
"""
from __future__ import annotations

import json
import math
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

from tianji.control.accounting import Accounting, StopRule
from tianji.control.report import parse_report
from tianji.control.launch import worker_launch
from tianji.control.plan import Profile, resolve
from tianji.control.spec import TianJiJob, dump_job, load_job
from tianji.envs import check_env_spec, spaces_of
from tianji.local import zygote
from tianji.local.worker_logs import last_exception
from tianji.observability.exporter import JobExporter
from tianji.observability.learnerstats import lag_histogram, learner_stats
from tianji.observability.runlog import RunLog
from tianji.observability.progress import Progress
from tianji.runtime.security import covers, sender_identity
from tianji.runtime.sequence import SeqGuard
from tianji.runtime.wire import WireError, decode

POLL_S = 0.1
SAMPLE_EVERY_S = 1.0
RECORD_EVERY_S = 1.0
STARTUP_TIMEOUT_S = 120.0  # first report (torch import on a loaded 2-core box can be slow)
HEARTBEAT_TIMEOUT_S = 30.0
STOP_GRACE_S = 15.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
SUMMARY_RETRY_S = 10.0
MAX_RESTARTS = 10  # consecutive failures; a worker that ran HEALTHY_S before failing starts a fresh budget
HEALTHY_S = 60.0
ROLE_ORDER = ("learner", "buffer", "actor")
CLI = [sys.executable, "-m", "tianji.cli"]  # + ["worker", ...]: the worker entry point, spawned or forked


@dataclass
class Child:
    role: str
    group: int
    index: int
    proc: Optional[subprocess.Popen] = None
    log: Optional[IO] = None
    restarts: int = 0
    failures: int = 0  # consecutive: reset by a healthy interval (HEALTHY_S)
    pids: set = field(default_factory=set)  # every incarnation's pid: reports from anyone else are refused
    started_at: float = 0.0
    last_report: Optional[float] = None
    restart_at: Optional[float] = None
    exits: list = field(default_factory=list)
    log_offset: int = 0  # where the current incarnation's output starts in its (appended) log

    @property
    def name(self) -> str:
        return f"{self.role}-{self.group}-{self.index}"


def default_run_dir(job: TianJiJob) -> Path:
    return Path("runs") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDirError(ValueError):
    pass


def run_job(job_path: Optional[str], overrides=(), run_dir: Optional[str] = None, max_seconds: Optional[float] = None,
            progress: bool = True, resume: Optional[str] = None, metrics_port: Optional[int] = None,
            profile: Optional[Profile] = None, tensorboard_port: Optional[int] = None) -> int:
    """Start a run (job_path) or continue one (resume=RUN_DIR, its job.yaml and newest checkpoints).
    `profile`: what the planner sizes the job with (`--profile`, as the operator's TIANJI_PROFILE)."""
    prof = profile
    if resume:
        rd = Path(resume)
        if not (rd / "job.yaml").is_file():
            raise RunDirError(f"--resume {resume}: no job.yaml there; is it a TianJi run directory?")
        job, _ = resolve(load_job(rd / "job.yaml", overrides), prof)
    else:
        job, _ = resolve(load_job(job_path, overrides), prof)
        # before any process starts (needs Gymnasium: not in control)
        info = check_env_spec(job.spec.env, str(job_path), job.spec.algorithm.name)
        job.spec.env.spaces = spaces_of(info)  # buffers and learners read them; they build no env
        rd = Path(run_dir) if run_dir else default_run_dir(job)
        if (rd / "job.yaml").exists():
            raise RunDirError(f"{rd} already holds a run; continue it with `tianji run --resume {rd}` "
                              "or choose another --run-dir")
    if job.spec.wandb is not None:  # W&B is optional: say what to install before anything starts
        from tianji.observability.wandb_log import WandbMissing, require_wandb

        try:
            require_wandb()
        except WandbMissing as e:
            raise RunDirError(str(e)) from None
    summary = Launcher(job, rd.resolve(), max_seconds=max_seconds, progress=progress, resume=bool(resume),
                       metrics_port=metrics_port, tensorboard_port=tensorboard_port).run()
    return 0 if summary["exit_reason"] in ("target", "frames", "seconds") else (
        130 if summary["exit_reason"] == "interrupted" else 1)


class Launcher:
    def __init__(self, job: TianJiJob, run_dir: Path, max_seconds: Optional[float] = None, progress: bool = True,
                 resume: bool = False, metrics_port: Optional[int] = None, tensorboard_port: Optional[int] = None):
        self.job, self.run_dir = job, run_dir
        self.tensorboard_port = tensorboard_port
        self.runlog: Optional[RunLog] = None
        self.stop_rule = StopRule(job.spec.stop, max_seconds)
        self.metrics_port = metrics_port
        self.exporter: Optional[JobExporter] = None
        self.progress_enabled = progress
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        self.job_file = run_dir / "job.yaml"
        self.job_file.write_text(dump_job(job))
        sock = run_dir / "sock"
        self.own_sock_dir = len(str(sock)) > 70  # unix socket paths are limited to 107 bytes
        self.sock_dir = Path(tempfile.mkdtemp(prefix="tianji-")) if self.own_sock_dir else sock
        if sock.is_symlink():  # left by a launcher that was SIGKILLed: its folder and the link
            old = Path(os.path.realpath(sock))
            if old.parent == Path(tempfile.gettempdir()).resolve() and old.name.startswith("tianji-"):
                shutil.rmtree(old, ignore_errors=True)
            sock.unlink()
        elif sock.exists():
            shutil.rmtree(sock, ignore_errors=True)
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        if self.own_sock_dir:  # <run_dir>/sock still leads to the sockets (resolve it: the path is short)
            sock.symlink_to(self.sock_dir, target_is_directory=True)
        os.chmod(self.sock_dir, 0o700)  # whatever the umask: only this user may connect
        self.report_addr = f"ipc://{self.sock_dir}/launcher-report"
        t = job.spec.topology
        self.children = [Child(r, g, i) for r in ROLE_ORDER for g in range(t.groups)
                         for i in range(getattr(t, r + "s"))]
        if job.spec.evaluation.enabled:  # spec.evaluation: one evaluator, following learner-0-0
            self.children.append(Child("evaluator", 0, 0))
        self.keys_dir: Optional[Path] = None
        self.rings: dict = {}
        if job.spec.network.encryption == "curve":
            self._issue_keys()
        self._by_key = {(c.role, c.group, c.index): c for c in self.children}
        self.dist_init = None
        if t.groups * t.learners > 1:  # data-parallel learners rendezvous on a free local port
            with socket.socket() as so:
                so.bind(("127.0.0.1", 0))
                self.dist_init = f"tcp://127.0.0.1:{so.getsockname()[1]}"
        self.acc = Accounting()
        self.report_seqs = SeqGuard()
        self.resumed_from: Optional[dict] = None
        self.t_offset = 0.0  # a resumed run's clock continues the previous launches'
        self.warnings: list[str] = []
        self.learner_reported = False
        if resume:
            self._continue_counts()
            self._check_checkpoints()
        self.started = time.monotonic()
        self.target_reached_at: Optional[float] = None
        self.target_backing: Optional[dict] = None  # the checkpoint and version behind a reached target
        self.mean_at_target: Optional[float] = None  # the mean-100 that met the stop rule
        self.interrupted = False
        self.error: Optional[str] = None
        self.zygote: Optional[zygote.Zygote] = None

    def _issue_keys(self) -> None:
        """A CURVE key pair per process (and the launcher's), fresh for each launch: each worker's
        keyring is its own 0600 file under <run dir>/keys (runtime/security.py)."""
        from tianji.runtime import security

        self.keys_dir = self.run_dir / "keys"
        shutil.rmtree(self.keys_dir, ignore_errors=True)  # a previous launch's keys are void
        (self.run_dir / "curve.json").unlink(missing_ok=True)  # so is an older version's job-wide key
        self.keys_dir.mkdir(mode=0o700)
        self.rings = security.issue([c.name for c in self.children] + [security.LAUNCHER])
        for c in self.children:
            security.write_keyring(self.keys_dir / f"{c.name}.json", self.rings[c.name])

    def _continue_counts(self) -> None:
        """A resumed run keeps counting (frames, episodes, the last 100 returns, lag) where the
        previous launch stopped: its accounting is restored whole."""
        state, prev = self.run_dir / "accounting.json", self.run_dir / "summary.json"
        if state.exists():
            self.acc = Accounting(json.loads(state.read_text()))
        if prev.exists():
            s = json.loads(prev.read_text())
            self.resumed_from = {k: s.get(k) for k in ("env_frames", "episodes", "policy_version", "exit_reason",
                                                       "wall_seconds")}
        last = _last_record(self.run_dir / "metrics.jsonl")
        if last is not None:  # covers a launcher that was SIGKILLed before writing its summary
            self.t_offset = float(last.get("t", 0.0))
            self.resumed_from = self.resumed_from or {}
            self.resumed_from.setdefault("policy_version", last.get("policy_version"))
            self.resumed_from.setdefault("env_frames", last.get("env_frames"))
        elif self.resumed_from and self.resumed_from.get("wall_seconds"):
            self.t_offset = float(self.resumed_from["wall_seconds"])

    def _check_checkpoints(self) -> None:
        """Say so, on the console and in summary.json, when a learner will start from scratch."""
        from tianji.runtime import checkpoint  # torch: only when resuming

        t = self.job.spec.topology
        for g in range(t.groups):
            for i in range(t.learners):
                d = checkpoint.checkpoint_dir(self.run_dir, g, i)
                if checkpoint.load_latest(d) is None:
                    msg = f"learner-{g}-{i}: no usable checkpoint, starting from scratch"
                    self.warnings.append(msg)
                    print(f"tianji: {msg}", file=sys.stderr)
                    self.acc.restart_window(time.time())  # the previous returns were not this policy's

    # ---------------------------------------------------------------- processes
    def _spawn(self, c: Child) -> None:
        launch = worker_launch(self.job, c.role, c.group, c.index, engine="local", job_file=str(self.job_file),
                               command=[*CLI, "worker"], run_dir=str(self.run_dir),
                               report=self.report_addr, sock_dir=str(self.sock_dir), parent_pid=os.getpid(),
                               dist_init=self.dist_init,
                               curve_keys=str(self.keys_dir / f"{c.name}.json") if self.keys_dir else None)
        env = _worker_env(launch)
        if c.log is None:
            c.log = open(self.run_dir / "logs" / f"{c.name}.log", "ab")
        c.log.flush()
        c.log_offset = os.fstat(c.log.fileno()).st_size
        c.proc = None
        if self.zygote is not None:  # forked from the pre-imported template (same entry point, same env)
            try:
                c.proc = self.zygote.spawn(launch.argv[len(CLI):], env, c.log.name)
            except OSError as e:
                print(f"tianji: worker template failed ({e}); starting workers as new processes", file=sys.stderr)
                self._close_zygote()
        if c.proc is None:
            # Own session: Ctrl-C reaches the launcher only, which then stops workers in order.
            c.proc = subprocess.Popen(launch.argv, stdout=c.log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        c.pids.add(c.proc.pid)
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
            if now - c.started_at >= HEALTHY_S:  # a slow trickle of faults never ends a run
                c.failures = 0
            if c.failures >= MAX_RESTARTS and c.role == "evaluator":  # training goes on without evaluations
                print(f"tianji: {c.name} failed {c.failures + 1} times in a row (last: {code}); no more "
                      f"evaluations this run (see {c.log.name})", file=sys.stderr)
                self.warnings.append(f"{c.name} gave up after {c.failures + 1} failures")
                c.restart_at = math.inf
                continue
            if c.failures >= MAX_RESTARTS:
                self.error = f"{c.name} failed {c.failures + 1} times in a row (last: {code}); see {c.log.name}"
                return
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** c.failures)
            c.failures += 1
            c.restarts += 1
            c.restart_at = now + delay
            error = last_exception(Path(c.log.name), c.log_offset) if code != "no heartbeat" else None
            print(f"tianji: {c.name} exited ({code}){': ' + error if error else ''}; restart {c.restarts} in "
                  f"{delay:.1f}s{f' (traceback in {c.log.name})' if error else ''}", file=sys.stderr)

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

    def _start_zygote(self) -> None:
        """The pre-imported worker template (local/zygote.py); without it each worker imports torch."""
        if not zygote.enabled() or self.job.spec.resources.learner.gpu > 0:  # CUDA and fork do not mix
            return
        c = self.children[0]
        launch = worker_launch(self.job, c.role, c.group, c.index, engine="local", job_file=str(self.job_file),
                               run_dir=str(self.run_dir), sock_dir=str(self.sock_dir), parent_pid=os.getpid())
        try:
            zygote.set_subreaper(True)  # forked workers are re-parented to us, not to init
            self.zygote = zygote.Zygote(_worker_env(launch), str(self.run_dir / "logs" / "zygote.log"))
        except OSError as e:
            print(f"tianji: no worker template ({e}); starting workers as new processes", file=sys.stderr)
            self.zygote = None

    def _close_zygote(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

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
                rep = self._report(frames)
                self.acc.take(rep)
                if rep.key[0] == "learner":
                    self.learner_reported = True
            except Exception:  # noqa: BLE001 - (WireError, ReportError, anything): a counted reject
                self.acc.rejected += 1
                continue
            if rep.episodes_total and self.target_reached_at is None and self.stop_rule.target_reached(self.acc):
                self.target_reached_at = time.monotonic() - self.started
                self.mean_at_target = self.acc.mean_return()
            for c in self.children:
                if (c.role, c.group, c.index) == rep.key and c.proc is not None and c.proc.pid == rep.pid:
                    c.last_report = time.monotonic()

    def _report(self, frames: list):
        """A worker's report, refused (WireError, ReportError) unless its sender is the process the
        transport authenticated, the (role, group, index) inside is that process, its pid one of that
        process's incarnations, and its sequence number new (a replayed report is refused)."""
        msg = decode(frames, job=self.job.name)
        if msg.kind != "report":
            raise WireError("report", f"{msg.kind!r} on the report socket")
        if self.rings and not covers(sender_identity(frames[0]), msg.sender):
            raise WireError("sender", f"a report as {msg.sender!r} with another process's key")
        rep = parse_report(msg.meta, job=self.job.name)
        child = self._by_key.get(rep.key)
        if child is None or child.name != msg.sender or rep.pid not in child.pids:  # only our own workers
            raise WireError("report", f"report from pid {rep.pid} as {rep.key} sent by {msg.sender!r}")
        self.report_seqs.accept(msg.sender, msg.seq)
        return rep

    # ---------------------------------------------------------------- stop rule
    def _verdict(self, reason: str) -> str:
        """The one place a run's result is decided, once every process has stopped and sent its final
        report: "target" stands only if the learners' final checkpoint, of a policy past version 0,
        backs it (then `target_backing` names both); otherwise the run ends in "error", saying why."""
        if reason != "target":
            return reason
        ckpt, version = self.acc.checkpoint(), self.acc.policy_version()
        if ckpt is None or version <= 0:
            self.error = self.error or ("the target was met but no checkpoint of a trained policy backs it "
                                        f"(checkpoint {ckpt}, policy version {version})")
            return "error"
        self.target_backing = {"checkpoint": ckpt, "policy_version": version}
        return reason

    def _exit_reason(self, now: float) -> Optional[str]:
        if self.error:
            return "error"
        if self.interrupted:
            return "interrupted"
        if self.target_reached_at is not None:
            return "target"
        return self.stop_rule.check(self.acc, now - self.started)

    # ---------------------------------------------------------------- outputs
    def _row(self, now: float) -> dict:
        v = self.acc.view(self.t_offset + now - self.started)
        version = v["policy_version"]
        if not self.learner_reported and self.resumed_from and self.resumed_from.get("policy_version") is not None \
                and not self.warnings:
            version = max(version, self.resumed_from["policy_version"])  # until the resumed learner reports
        return {"elapsed": self.t_offset + now - self.started, "env_frames": v["env_frames"], **v["rates"],
                "policy_version": version, "lag": v["policy_lag"], "episodes": v["episodes"],
                "mean_return": v["mean_return"], "dropped": sum(v["dropped_samples"].values()),
                "rejected": v["rejected_messages"], "restarts": self._restarts(), "checkpoint": self.acc.checkpoint(),
                **({"eval_return": self.acc.eval_last["return_mean"]} if self.acc.eval_last else {})}

    def _restarts(self) -> dict[str, int]:
        out = {"actor": 0, "buffer": 0, "learner": 0}
        if self.job.spec.evaluation.enabled:
            out["evaluator"] = 0
        for c in self.children:
            out[c.role] += c.restarts
        return out

    def _record(self, f: "_Appender", now: float) -> None:
        row = self._row(now)
        row["t"] = round(row.pop("elapsed"), 3)
        row["dropped_by_reason"] = self.acc.reasons("samples_dropped_total")
        row["learner"] = learner_stats(self.acc)
        row["lag_hist"] = lag_histogram(self.acc)
        row["processes"] = self.acc.processes()
        f.append(json.dumps(row) + "\n")
        if self.runlog is not None:
            self.runlog.write(row)
        self._export()

    def _export(self) -> None:
        if self.exporter is not None:
            self.exporter.update(self.acc)
        try:
            _write_json(self.run_dir / "accounting.json", self.acc.state())
        except OSError as e:  # a full disk: keep running, the next record retries
            _warn_once(self, "accounting", f"cannot write accounting.json ({e.strerror}); retrying")

    def _write_summary(self, summary: dict) -> Path:
        """summary.json, retried while the disk is full (SUMMARY_RETRY_S); then a fallback file in
        the temp dir, and the summary on stderr: a run's result is never lost."""
        path = self.run_dir / "summary.json"
        deadline = time.monotonic() + SUMMARY_RETRY_S
        while True:
            try:
                _write_json(path, summary)
                return path
            except OSError as e:
                if time.monotonic() >= deadline:
                    err = e
                    break
                _warn_once(self, "summary", f"cannot write {path} ({e.strerror}); retrying for {SUMMARY_RETRY_S:g}s")
                time.sleep(0.5)
        summary = {**summary, "error": summary.get("error") or f"summary.json not written: {err.strerror}"}
        for d in (Path(tempfile.gettempdir()), Path.home()):
            fb = d / f"tianji-{self.job.name}-{os.getpid()}-summary.json"
            try:
                _write_json(fb, summary)
                print(f"tianji: {path}: {err.strerror}; summary written to {fb}", file=sys.stderr)
                return fb
            except OSError:
                continue
        print(f"tianji: {path}: {err.strerror}; summary: {json.dumps(summary)}", file=sys.stderr)
        return path

    def summary(self, reason: str, wall: float) -> dict:
        """summary.json: the accounting's view (the numbers the TianJiJob status shows) plus
        what only a local run has (restarts, run dir, exit reason)."""
        acc, spec, t = self.acc, self.job.spec, self.job.spec.topology
        wall = self.t_offset + wall  # a resumed run: the whole run's time
        v = acc.view(wall, spec.evaluation)
        frames = max(v["env_frames"], 1)
        rejected = acc.reasons("messages_rejected_total")
        reached = reason == "target"  # (decided by _verdict, backed by a checkpoint)
        backing = self.target_backing if reached else None
        return {
            "job": self.job.name, "algorithm": spec.algorithm.name, "env": spec.env.id,
            "target_return": float(spec.stop.mean_return) if spec.stop.mean_return is not None else None,
            "reached_target": reached,
            "seconds_to_target": round(self.t_offset + self.target_reached_at, 3) if reached else None,
            "mean_return_at_target": self.mean_at_target if reached else None,
            "target_checkpoint": backing and backing["checkpoint"],
            "target_policy_version": backing and backing["policy_version"],
            "wall_seconds": round(wall, 3), "env_frames": v["env_frames"], "episodes": v["episodes"],
            "mean_return": v["mean_return"] if v["mean_return"] is not None else 0.0,
            "throughput": v["throughput"],
            "policy_lag": {k: (x if x is not None else 0.0) for k, x in v["policy_lag"].items()},
            "policy_lag_hist": lag_histogram(acc),
            "learner_stats": learner_stats(acc),
            "processes": {"actors": t.groups * t.actors, "buffers": t.groups * t.buffers,
                          "learners": t.groups * t.learners},
            "bytes_sent": v["bytes_sent"],
            "bytes_sent_per_frame": {r: acc.role_totals(r).get("bytes_sent_total", 0.0) / frames
                                     for r in ("actor", "buffer", "learner")},
            "rejected_messages": v["rejected_messages"],
            "rejected_by_reason": {**rejected, **({"launcher_report": acc.rejected} if acc.rejected else {})},
            "exit_reason": reason,
            "restarts": self._restarts(),
            "dropped_samples": v["dropped_samples"],
            "dropped_fraction": v["dropped_fraction"], "replay_ratio": v["replay_ratio"],
            "policy_version": v["policy_version"],
            "evaluation": v["evaluation"],
            "run_dir": str(self.run_dir),
            **({"resumed_from": self.resumed_from} if self.resumed_from else {}),
            **({"error": self.error} if self.error else {}),
            **({"warnings": self.warnings} if self.warnings else {}),
        }

    # ---------------------------------------------------------------- main loop
    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True

    def run(self) -> dict:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        ctx = zmq.Context()
        curve = None
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 4 << 20)
        if self.rings:  # reports, too, only from the job's processes, each as itself
            from tianji.runtime.security import LAUNCHER, Curve

            curve = Curve(ctx, self.rings[LAUNCHER])
            curve.server(sock)
        sock.bind(self.report_addr)
        reason = "error"
        t0 = self.started = time.monotonic()
        self.exporter = JobExporter(self.job.name) if self.metrics_port else None
        try:
            self.runlog = RunLog(self.job, self.run_dir, self.tensorboard_port)
            if self.exporter is not None:
                self.exporter.serve(self.metrics_port)
            with _Appender(self.run_dir / "metrics.jsonl", self) as mf, \
                    Progress(f"TianJi · {self.job.name}", self.progress_enabled, caption=str(self.run_dir)) as view:
                self._start_zygote()
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
                        self.acc.sample(now)  # (the target is checked as episodes arrive, in _drain)
                        view.update(self._row(now))
                    if now - last_record >= RECORD_EVERY_S:
                        last_record = now
                        self._record(mf, now)
                    r = self._exit_reason(now)
                    if r:
                        reason = r
                        break
                self._stop_children(sock)
                reason = self._verdict(reason)
                now = time.monotonic()
                self.acc.sample(now)
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
            self._close_zygote()
            if zygote.enabled():
                try:
                    zygote.set_subreaper(False)
                except OSError:
                    pass
            sock.close()
            if curve is not None:
                curve.close()
            ctx.term()
            shutil.rmtree(self.sock_dir, ignore_errors=True)  # no socket file outlives the run
            if self.own_sock_dir:
                (self.run_dir / "sock").unlink(missing_ok=True)
            if self.exporter is not None:
                self.exporter.close()
            if self.runlog is not None:
                self.runlog.close()
            for s, h in old.items():
                signal.signal(s, h)
        wall = time.monotonic() - t0
        summary = self.summary(reason, wall)
        self._export()
        self._write_summary(summary)
        print(f"tianji: {self.job.name} ended ({reason}) after {wall:.1f}s: {int(summary['env_frames'])} frames, "
              f"mean return {summary['mean_return']:.1f}; summary: {self.run_dir / 'summary.json'}",
              file=sys.stderr)
        return summary


def _worker_env(launch) -> dict[str, str]:
    env = {**os.environ, **launch.env}
    if "GLIBC_TUNABLES" in os.environ:  # the user's own tunables win
        env["GLIBC_TUNABLES"] = os.environ["GLIBC_TUNABLES"]
    return env


def _write_json(path: Path, doc: dict) -> None:
    """Atomically: a reader (or a crash) never sees half a file; a failed write leaves no temp file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _warn_once(owner, key: str, text: str) -> None:
    seen = owner.__dict__.setdefault("_warned", set())
    if key not in seen:
        seen.add(key)
        print(f"tianji: {text}", file=sys.stderr)


def _last_record(path: Path) -> Optional[dict]:
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last complete line
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


class _Appender:
    """metrics.jsonl, one line per record, that survives a full disk: a line that cannot be
    written waits (at most MAX_PENDING, oldest dropped first) and goes out, in order, with the next
    record that can; a half-written line is cut off again, so the file stays valid JSON lines."""

    MAX_PENDING = 3600

    def __init__(self, path: Path, owner=None):
        self.path, self.owner = path, owner
        self.pending: list[str] = []

    def __enter__(self) -> "_Appender":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()

    def append(self, line: str) -> None:
        self.pending.append(line)
        del self.pending[:-self.MAX_PENDING]
        self.flush()

    def _write(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def flush(self) -> None:
        if not self.pending:
            return
        try:
            self._write("".join(self.pending).encode())
        except OSError as e:
            _warn_once(self.owner or self, "metrics", f"cannot write {self.path} ({e.strerror}); "
                       "keeping records in memory and retrying")
            return
        self.pending.clear()
