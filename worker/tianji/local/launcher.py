"""`tianji run`: the local engine. One `tianji worker` process per role on this machine.

The local engine is an adapter: processes instead of pods. Everything that
gives a run its meaning is tianji.control's, shared with the operator: the plan
(`resolve`), the worker command and environment (`worker_launch`), the counting
(`Accounting`) and the stop rule (`StopRule`). What is left here: write the
resolved job to the run dir, start the workers (ipc:// sockets), feed their
pushed reports to the accounting, restart a worker that died or went silent
(local/supervisor.py), show progress, stop everyone at the stop rule or on
Ctrl-C/SIGTERM, and write `metrics.jsonl` (with the learners' statistics and the lag
histogram), TensorBoard event files (and W&B, if `spec.wandb`), all from the same
records, `accounting.json` (what `--resume` continues counting from, local/resume.py)
and `summary.json` (local/summary.py), so that a full disk loses nothing
(local/runfiles.py). Workers ask the kernel to kill them if the launcher dies
(PR_SET_PDEATHSIG), so no process outlives a run. `--metrics-port` serves every
role's metrics for Prometheus.
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
import time
from pathlib import Path
from typing import Optional

import zmq

from tianji.control.contracts.accounting import Accounting, StopRule
from tianji.control.contracts.episodes import EpisodeBounds
from tianji.control.contracts.launch import ENV_CURVE_KEYS, ENV_CURVE_KEYS_FD, learner_device, worker_launch
from tianji.control.contracts.rolereport import parse_report
from tianji.control.planner.plan import Profile, resolve
from tianji.control.spec import SpecError, TianJiJob, dump_job, load_job, stop_problem
from tianji.control.spec.lagbound import staleness_notes
from tianji.envs import spaces_of
from tianji.local import cpulimits, isolation, runfiles, zygote
from tianji.local import resume as resume_
from tianji.local.preflight import check_entry_points, note_on_stderr
from tianji.local.runfiles import MetricsLog, Warner
from tianji.local.summary import ended_line, run_summary
from tianji.local.supervisor import NO_HEARTBEAT, Child, count_failure, exit_text, failed, failure_text, idle_run
from tianji.local.targetcheck import TargetCheck, learner_version
from tianji.local.worker_logs import last_exception
from tianji.observability.exporter import JobExporter
from tianji.observability.learnerstats import lag_histogram, learner_stats
from tianji.observability.progress import Progress
from tianji.observability.runlog import RunLog
from tianji.runtime import atomicfile
from tianji.runtime.replayguard import SeqGuard
from tianji.runtime.security import covers, sender_identity
from tianji.runtime.validate import episode_bounds
from tianji.runtime.wire import WireError, decode

POLL_S = 0.1
SAMPLE_EVERY_S = 1.0
RECORD_EVERY_S = 1.0
STOP_GRACE_S = 15.0
ROLE_ORDER = ("learner", "buffer", "actor")
PUBLIC_KEYS = "public-keys.json"  # <run dir>/: every process's public CURVE key (nothing secret)
# Tests only: also write every process's secret keyring to this folder (tests play insiders with them).
ENV_EXPORT_KEYS = "TIANJI_TEST_EXPORT_KEYS"
CLI = [sys.executable, "-m", "tianji.cli"]  # + ["worker", ...]: the worker entry point, spawned or forked


def default_run_dir(job: TianJiJob) -> Path:
    return Path("runs") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunDirError(ValueError):
    pass


def run_job(job_path: Optional[str], overrides=(), run_dir: Optional[str] = None, max_seconds: Optional[float] = None,
            progress: bool = True, resume: Optional[str] = None, metrics_port: Optional[int] = None,
            profile: Optional[Profile] = None, tensorboard_port: Optional[int] = None) -> int:
    """Start a run (job_path) or continue one (resume=RUN_DIR, its job.yaml and newest checkpoints).
    `profile`: what the planner sizes the job with (`--profile`, as the operator's TIANJI_PROFILE)."""
    if resume:
        rd = Path(resume)
        if not (rd / "job.yaml").is_file():
            raise RunDirError(f"--resume {resume}: no job.yaml there; is it a TianJi run directory?")
        job, _ = resolve(load_job(rd / "job.yaml", overrides), profile)
        check_stop(job, rd / "job.yaml", max_seconds)
    else:
        job, _ = resolve(load_job(job_path, overrides), profile)
        check_stop(job, job_path, max_seconds)
        info = check_entry_points(job, str(job_path))  # before any process starts (local/preflight.py)
        for text in staleness_notes(job.spec):  # settings that imply heavy drops or lag (control/spec/lagbound.py)
            note_on_stderr(text)
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


def check_stop(job: TianJiJob, source, max_seconds: Optional[float]) -> None:
    """A local run must be able to end: a stop rule, or --max-seconds (control/spec/run.py)."""
    if (problem := stop_problem(job.spec.stop, max_seconds)) is not None:
        raise SpecError(f"{source}: {problem}")


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
        self.warn = Warner()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        self.job_file = run_dir / "job.yaml"
        self.job_file.write_text(dump_job(job))
        self.sock_dir, self.own_sock_dir = runfiles.socket_dir(run_dir)
        self.report_addr = f"ipc://{self.sock_dir}/launcher-report"
        t = job.spec.topology
        self.children = [Child(r, g, i) for r in ROLE_ORDER for g in range(t.groups)
                         for i in range(getattr(t, r + "s"))]
        if job.spec.evaluation.enabled:  # spec.evaluation: one evaluator, following learner-0-0
            self.children.append(Child("evaluator", 0, 0))
        self.rings: dict = {}
        if job.spec.network.encryption == "curve":
            self._issue_keys()
        self._by_key = {c.key: c for c in self.children}
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
            self.acc, self.resumed_from, self.t_offset = resume_.previous_counts(run_dir)
            missing = resume_.missing_checkpoints(job, run_dir)
            self.warnings += missing
            if missing:  # a learner starts over: the previous launches' returns were not its policy's
                self.acc.restart_window(time.time())
        self.frames_at_start = int(self.acc.totals()["env_frames"])  # a resumed run's earlier launches'
        self.consumed_at_start = int(self.acc.totals()["consumed"])
        self.started = time.monotonic()
        self.target_reached_at: Optional[float] = None  # this launch's clock; the crossing is the accounting's
        self.target_backing: Optional[dict] = None  # the checkpoint and version behind a reached target
        self.metrics: Optional[MetricsLog] = None  # while the main loop runs: the crossing's record goes there
        self.role_uids, why = isolation.decide(job, run_dir, self.job_file)  # a launcher run as root
        self.isolation = isolation.describe(self.role_uids, why)
        if why:
            self.warn("isolation", f"every role runs as root, not under a uid of its own: {why} "
                                   "(docs/security.md)")
        self._isolate()
        # A cgroup per worker, as root; or why none is bounded.
        self.cpu_limits, self.cpu_limits_off = cpulimits.decide(f"{job.name}-{os.getpid()}")
        check_env = {**_worker_env(None), "OMP_NUM_THREADS": "1"}
        if self.role_uids is not None:
            check_env["HOME"] = str(self.role_uids.home(run_dir, "confirm"))
        self.target_check = TargetCheck(job, run_dir, check_env, creds=self._creds("confirm"))
        self.bounds = _episode_bounds(job)  # what one of the env's episodes can be (refused otherwise)
        self.refused: dict[str, int] = {}  # reports and handshakes this launcher refused, by reason
        self.report_curve = None  # the report socket's CURVE (its ZAP handler counts refused handshakes)
        self.stopping = False
        self.interrupted = False
        self.error: Optional[str] = None
        self.zygote: Optional[zygote.Zygote] = None

    def _issue_keys(self) -> None:
        """A CURVE key pair per process (and the launcher's), fresh for each launch, held in this
        process's memory only: each worker gets its keyring on a descriptor as it starts (`_spawn`).
        Only the public keys are written (<run dir>/public-keys.json). A previous version's key
        files (keys/, curve.json) are void and removed."""
        from tianji.runtime import security

        shutil.rmtree(self.run_dir / "keys", ignore_errors=True)
        (self.run_dir / "curve.json").unlink(missing_ok=True)
        security.forbid_inspection()  # this process holds every key: no ptrace, no /proc/PID/mem
        self.rings = security.issue([c.name for c in self.children] + [security.LAUNCHER])
        security.write_public_keys(self.run_dir / PUBLIC_KEYS, self.rings)
        export = os.environ.get(ENV_EXPORT_KEYS)
        if export:  # tests only: they play insiders holding one process's key
            print(f"tianji: {ENV_EXPORT_KEYS} is set: writing every process's SECRET key to {export}",
                  file=sys.stderr)
            os.makedirs(export, mode=0o700, exist_ok=True)
            for name, ring in self.rings.items():
                security.write_keyring(Path(export) / f"{name}.json", ring)

    # ---------------------------------------------------------------- processes
    def _isolate(self) -> None:
        """The folders each role writes, its own (local/isolation.py): `checkpoints/` the buffers'
        (replay snapshots), `checkpoints/G-I/` learner G-I's."""
        if self.role_uids is None:
            return
        ckpt = self.run_dir / "checkpoints"
        owned = [("buffer", ckpt)] + [("learner", ckpt / f"{c.group}-{c.index}") for c in self.children
                                      if c.role == "learner"]
        isolation.prepare(self.role_uids, self.run_dir, self.sock_dir, owned)

    def _creds(self, role: str) -> Optional[isolation.Creds]:
        return None if self.role_uids is None else self.role_uids.creds(role)

    def _launch(self, c: Child, **kw):
        if c.role == "learner":  # one GPU per learner while there are enough (launch.learner_device)
            kw["device"] = learner_device(self.job, c.group, c.index, visible_gpus(self.job))
        return worker_launch(self.job, c.role, c.group, c.index, engine="local", job_file=str(self.job_file),
                             run_dir=str(self.run_dir), sock_dir=str(self.sock_dir), parent_pid=os.getpid(),
                             host_cores=len(os.sched_getaffinity(0)), **kw)

    def _spawn(self, c: Child) -> None:
        launch = self._launch(c, command=[*CLI, "worker"], report=self.report_addr, dist_init=self.dist_init)
        env = _worker_env(launch)
        creds = self._creds(c.role)
        if self.role_uids is not None:
            env["HOME"] = str(self.role_uids.home(self.run_dir, c.role))
        if c.log is None:
            c.log = open(self.run_dir / "logs" / f"{c.name}.log", "ab")
        c.log.flush()
        c.log_offset = os.fstat(c.log.fileno()).st_size
        c.proc = None
        keys = self._keyring_fd(c)  # this worker's keyring, for it alone to inherit
        cgroup = self._cgroup(c)
        try:
            if keys is not None:
                env[ENV_CURVE_KEYS_FD] = str(keys)
            if self.zygote is not None:  # forked from the pre-imported template (same entry point, same env)
                try:
                    c.proc = self.zygote.spawn(launch.argv[len(CLI):], env, c.log.name,
                                               fd=None if keys is None else (ENV_CURVE_KEYS_FD, keys), creds=creds,
                                               cgroup=cgroup)
                except OSError as e:
                    print(f"tianji: worker template failed ({e}); starting workers as new processes",
                          file=sys.stderr)
                    self._close_zygote()
            if c.proc is None:
                # Own session: Ctrl-C reaches the launcher only, which then stops workers in order.
                c.proc = subprocess.Popen(launch.argv, stdout=c.log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, pass_fds=() if keys is None else (keys,),
                                          **(creds.popen() if creds else {}))
                if cgroup is not None:  # at once: the interpreter is still starting, no user code has run
                    self._join_cgroup(c)
        finally:
            if keys is not None:
                os.close(keys)
        c.pids.add(c.proc.pid)
        c.started_at = time.monotonic()
        c.last_report = None
        c.restart_at = None

    def _cgroup(self, c: Child) -> Optional[str]:
        """The cgroup.procs file `c` joins (local/cpulimits.py; None: its CPU is not bounded)."""
        if self.cpu_limits is None:
            return None
        try:
            return self.cpu_limits.make(c.name, getattr(self.job.spec.resources, c.role).cpu)
        except OSError as e:  # those already bounded stay so; their cgroups go at the run's end
            self.warn("cpu_limits", f"cannot make {c.name}'s cgroup ({e}): no worker started from now on "
                                    "has its CPU bounded")
            return None

    def _join_cgroup(self, c: Child) -> None:
        try:
            self.cpu_limits.join(c.name, c.proc.pid)
        except OSError as e:  # the process exited already, or the cgroup went: said, not fatal
            self.warn(f"cpu_limits_join_{c.name}", f"{c.name} (pid {c.proc.pid}) could not join its cgroup ({e}): "
                                                   "its CPU is not bounded")

    def _remove_cgroups(self) -> None:
        if self.cpu_limits is not None:  # its description stays for summary.json
            for left in self.cpu_limits.remove():
                self.warn("cpu_limits", f"cgroup not removed: {left}")

    def _supervise(self, now: float) -> None:
        for c in self.children:
            if c.restart_at is not None:
                if now >= c.restart_at:
                    self._spawn(c)
                continue
            code = failed(c, now)
            if code is None:
                continue
            error = last_exception(Path(c.log.name), c.log_offset) if code != NO_HEARTBEAT else None
            c.last_error = error or c.last_error  # a later kill without a traceback keeps the cause in view
            delay = count_failure(c, now, code)
            if delay is None and c.role == "evaluator":  # training goes on without evaluations
                print(f"tianji: {c.name} failed {c.failures} times in a row{failure_text(c)}; no more "
                      "evaluations this run", file=sys.stderr)
                self.warnings.append(f"{c.name} gave up after {c.failures} failures")
                c.restart_at = math.inf
                continue
            if delay is None:
                self.error = f"{c.name} failed {c.failures} times in a row{failure_text(c)}"
                return
            print(f"tianji: {c.name} exited ({exit_text(code)}){': ' + error if error else ''}; restart "
                  f"{c.restarts} in {delay:.1f}s{f' (traceback in {c.log.name})' if error else ''}", file=sys.stderr)

    def _stop_children(self, sock: zmq.Socket) -> None:
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(c.proc and c.proc.poll() is None for c in self.children):
            self._drain(sock, 0.05)
        self._kill_children()
        self._drain(sock, 0.2)  # final reports written just before exit
        for c in self.children:
            if c.log:
                c.log.close()

    def _kill_children(self) -> None:
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()

    def _keyring_fd(self, c: Child) -> Optional[int]:
        if not self.rings:
            return None
        from tianji.runtime.security import keyring_fd

        return keyring_fd(self.rings[c.name])

    def _start_zygote(self) -> None:
        """The pre-imported worker template (local/zygote.py); without it each worker imports torch."""
        if not zygote.enabled() or self.job.spec.resources.learner.gpu > 0:  # CUDA and fork do not mix
            return
        launch = self._launch(self.children[0])
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
                child = self._by_key[rep.key]
                self.acc.take(rep)
                child.reported = True
                if rep.key[0] == "learner":
                    self.learner_reported = True
            except Exception as e:  # noqa: BLE001 - (WireError, ReportError, anything): a counted reject
                self._refuse(getattr(e, "reason", "report"), str(e))
                continue
            if child.proc is not None and child.proc.pid == rep.pid:
                child.last_report = time.monotonic()
            if rep.episodes_total and self.target_reached_at is None and not self.stopping \
                    and self.stop_rule.target_reached(self.acc):
                self._check_target(time.monotonic())

    def _check_target(self, now: float) -> None:
        """The actors' mean met stop.meanReturn: only a trigger. The saved policy must meet it too
        (local/targetcheck.py); `_cross_target` follows once it has."""
        version = learner_version(self.acc)
        if self.target_check.ready(now, version):
            pids = [c.proc.pid for c in self.children if c.role == "learner" and c.proc is not None
                    and c.last_report is not None and c.proc.poll() is None]  # set up: SIGUSR1 is handled
            self.target_check.trigger(now, version, pids)

    def _count_handshakes(self) -> None:
        """CURVE handshakes the report socket's ZAP handler refused (a key not of this launch)."""
        seen = self.refused.get("handshake", 0)
        if self.report_curve is not None and self.report_curve.refused > seen:
            self._refuse("handshake", "(a key not of this run)", self.report_curve.refused - seen)

    def _refuse(self, reason: str, detail: str = "", n: int = 1) -> None:
        """A report (or handshake) refused: counted in the accounting (rejected_messages), by reason here."""
        self.acc.rejected += n
        self.refused[reason] = self.refused.get(reason, 0) + n
        if self.refused[reason] <= 3 or self.refused[reason] % 1000 == 0:
            print(f"tianji: refused ({reason}): {detail[:300]} [{self.refused[reason]} so far]", file=sys.stderr)

    def _cross_target(self, now: float) -> None:
        """The saved policy met stop.meanReturn (the confirming evaluation passed): the crossing
        (its time, frames and mean) is the accounting's, kept once, and its metrics record is
        written now, so that summary.json's seconds_to_target, frames_to_target and
        mean_return_at_target are that record's. A resumed run whose earlier launch crossed keeps
        that crossing (and its record)."""
        self.target_reached_at = now - self.started
        row = self._row(now)
        _, new = self.acc.cross_target(self.stop_rule.stop.mean_return, row["elapsed"], row["env_frames"],
                                       row["mean_return"])
        if new and self.metrics is not None:
            self._record(self.metrics, now, row=row, stop="target")

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
        if rep.role == "actor":  # episodes the env cannot produce refuse the whole report
            if (why := self.bounds.refusal(rep.recent)) is not None:
                raise WireError("return", f"{msg.sender}: {why}")
        self.report_seqs.accept(msg.sender, msg.seq, exclusive=bool(self.rings))  # a key per process
        return rep

    # ---------------------------------------------------------------- stop rule
    def _verdict(self, reason: str) -> str:
        """The one place a run's result is decided, once every process has stopped and sent its final
        report: "target" stands only if a checkpoint of a policy past version 0 backs it, the one the
        confirming evaluation played (then `target_backing` names both); otherwise the run ends in
        "error", saying why."""
        if reason in ("seconds", "frames"):  # a budget spent: was any work done?
            totals = self.acc.totals()
            idle = idle_run(self.children, int(totals["env_frames"]) - self.frames_at_start,
                            int(totals["consumed"]) - self.consumed_at_start, time.monotonic() - self.started)
            if idle is not None:
                self.error = self.error or idle
                return "error"
        if reason != "target":
            return reason
        passed = self.target_check.passed or {}
        ckpt, version = passed.get("checkpoint"), passed.get("policy_version", 0)
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
        return self.stop_rule.budget(self.acc, now - self.started)  # a target needs the saved policy

    # ---------------------------------------------------------------- outputs
    def _row(self, now: float) -> dict:
        v = self.acc.view(self.t_offset + now - self.started)
        version = v["policy_version"]
        if not self.learner_reported and self.resumed_from and self.resumed_from.get("policy_version") is not None \
                and not self.warnings:
            version = max(version, self.resumed_from["policy_version"])  # until the resumed learner reports
        return {"elapsed": self.t_offset + now - self.started, "env_frames": v["env_frames"], **v["rates"],
                "policy_version": version, "lag": v["policy_lag"], "episodes": v["episodes"],
                "mean_return": v["mean_return"], "mean_episode_length": v["mean_episode_length"],
                "dropped": sum(v["dropped_samples"].values()),
                "rejected": v["rejected_messages"], "restarts": self._restarts(), "checkpoint": self.acc.checkpoint(),
                **({"eval_return": self.acc.eval_last["return_mean"]} if self.acc.eval_last else {})}

    def _restarts(self) -> dict[str, int]:
        out = {"actor": 0, "buffer": 0, "learner": 0}
        if self.job.spec.evaluation.enabled:
            out["evaluator"] = 0
        for c in self.children:
            out[c.role] += c.restarts
        return out

    def _record(self, f: MetricsLog, now: float, row: Optional[dict] = None, stop: Optional[str] = None) -> None:
        """One metrics.jsonl record (and TensorBoard's, W&B's); `stop`: the stop rule this record met."""
        row = dict(row or self._row(now))
        row["t"] = round(row.pop("elapsed"), 3)
        if stop is not None:
            row["stop"] = stop
        row["dropped_by_reason"] = self.acc.reasons("samples_dropped_total")
        row["learner"] = learner_stats(self.acc)
        row["lag_hist"] = lag_histogram(self.acc)
        row["processes"] = self.acc.processes()
        self._export()  # before the row: a launcher killed between the two never resumes behind its last row
        f.append(json.dumps(row) + "\n")
        if self.runlog is not None:
            self.runlog.write(row)

    def _export(self) -> None:
        if self.exporter is not None:
            self.exporter.update(self.acc, self.refused)
        try:
            atomicfile.atomic_write_json(self.run_dir / "accounting.json", self.acc.state())
        except OSError as e:  # a full disk: keep running, the next record retries
            self.warn("accounting", f"cannot write accounting.json ({e.strerror}); retrying")

    def _write_summary(self, summary: dict) -> Path:
        return runfiles.write_summary(self.run_dir / "summary.json", summary,
                                      f"tianji-{self.job.name}-{os.getpid()}-summary.json", self.warn)

    def summary(self, reason: str, wall: float) -> dict:
        """`reason` as `_verdict` decided it: a target is reached only with its backing."""
        crossing = self.acc.target_crossing
        reached = reason == "target" and crossing is not None and self.target_backing is not None
        out = run_summary(self.job, self.acc, reason=reason, wall=self.t_offset + wall,
                          crossing=crossing if reached else None,
                          target=self.target_backing if reached else None, restarts=self._restarts(),
                          run_dir=str(self.run_dir), resumed_from=self.resumed_from, error=self.error,
                          warnings=self.warnings, isolation=self.isolation)
        # the launcher's own refusals by reason (their total is the accounting's, persisted)
        by = {k: v for k, v in out["rejected_by_reason"].items() if k != "launcher_report"}
        extra = self.acc.rejected - sum(self.refused.values())  # counted by an earlier launch (--resume)
        for r, n in {**self.refused, **({"report": extra} if extra > 0 else {})}.items():
            by[f"launcher_{r}"] = by.get(f"launcher_{r}", 0) + n
        out["rejected_by_reason"] = by
        out.update(self.target_check.summary())  # the saved policy's evaluations (a target needs one)
        over: dict[str, float] = {}  # samples each sender lost over its fair share at the buffers
        for (role, _, _), p in self.acc.procs.items():
            for sender, n in p.extra.get("over_share", {}).items() if role == "buffer" else ():
                over[sender] = over.get(sender, 0) + int(n)
        out["dropped_over_share_by_sender"] = over
        out["cpu_limits"] = cpulimits.describe(self.cpu_limits, self.cpu_limits_off)
        return out

    # ---------------------------------------------------------------- main loop
    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True

    def _loop(self, sock: zmq.Socket) -> str:
        """Start the workers, count their reports, supervise them, record; the exit reason."""
        with MetricsLog(self.run_dir / "metrics.jsonl", self.warn) as mf, \
                Progress(f"TianJi · {self.job.name}", self.progress_enabled, caption=str(self.run_dir)) as view:
            self.metrics = mf
            self._start_zygote()
            for c in self.children:
                self._spawn(c)
            last_sample = last_record = 0.0
            while True:
                self._drain(sock, POLL_S)
                now = time.monotonic()
                if not self.interrupted:
                    self._supervise(now)
                if self.target_check.poll(now, self.acc) is not None and self.target_reached_at is None:
                    self._cross_target(now)  # the saved policy met the target
                if now - last_sample >= SAMPLE_EVERY_S:
                    last_sample = now
                    self._count_handshakes()
                    self.acc.sample(now)  # (the target is checked as episodes arrive, in _drain)
                    view.update(self._row(now))
                if now - last_record >= RECORD_EVERY_S:
                    last_record = now
                    self._record(mf, now)
                reason = self._exit_reason(now)
                if reason:
                    break
            self.stopping = True
            self.target_check.close()
            self._stop_children(sock)
            self._count_handshakes()
            reason = self._verdict(reason)
            now = time.monotonic()
            self.acc.sample(now)
            self._record(mf, now)
            view.update(self._row(now))
        return reason

    def _report_socket(self, ctx: zmq.Context):
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 4 << 20)
        curve = None
        if self.rings:  # reports, too, only from the job's processes, each as itself
            from tianji.runtime.security import LAUNCHER, Curve

            curve = Curve(ctx, self.rings[LAUNCHER])
            curve.server(sock)
        sock.bind(self.report_addr)
        isolation.share_socket(self.report_addr[len("ipc://"):], self.role_uids)
        return sock, curve

    def run(self) -> dict:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        ctx = zmq.Context()
        sock, curve = self._report_socket(ctx)
        self.report_curve = curve
        reason = "error"
        t0 = self.started = time.monotonic()
        self.exporter = JobExporter(self.job.name) if self.metrics_port else None
        try:
            self.runlog = RunLog(self.job, self.run_dir, self.tensorboard_port)
            if self.exporter is not None:
                self.exporter.serve(self.metrics_port)
            reason = self._loop(sock)
        except Exception as e:  # still write what we know: nothing is lost on failure
            import traceback

            traceback.print_exc()
            self.error = self.error or f"launcher failed: {type(e).__name__}: {e}"
            reason = "error"
            self._kill_children()
        finally:
            self._close_zygote()
            self.target_check.close()
            if zygote.enabled():
                try:
                    zygote.set_subreaper(False)
                except OSError:
                    pass
            sock.close()
            if curve is not None:
                curve.close()
            ctx.term()
            runfiles.remove_socket_dir(self.run_dir, self.sock_dir, self.own_sock_dir)
            self._remove_cgroups()
            for closable in (self.exporter, self.runlog):
                if closable is not None:
                    closable.close()
            for s, h in old.items():
                signal.signal(s, h)
        wall = time.monotonic() - t0
        summary = self.summary(reason, wall)
        self._export()
        self._write_summary(summary)
        print(ended_line(self.job.name, reason, wall, summary, self.run_dir / "summary.json"), file=sys.stderr)
        return summary


def visible_gpus(job: TianJiJob) -> int:
    """CUDA devices this process sees (0 when learners are given none: torch is not imported then).
    torch's count reads NVML without creating a CUDA context, and workers are new processes
    (no zygote with a GPU learner), so the launcher holds no GPU state."""
    if job.spec.resources.learner.gpu <= 0:
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA: the learners fall back to the CPU and say so
        return 0


def _episode_bounds(job: TianJiJob) -> EpisodeBounds:
    try:
        return episode_bounds(job.spec.env)
    except Exception as e:  # noqa: BLE001 - bounds are a check on top: none is no reason not to run
        print(f"tianji: the env's episode bounds are unknown ({e}); episodes are not bounded", file=sys.stderr)
        return EpisodeBounds()


def _worker_env(launch) -> dict[str, str]:
    """A worker's environment (None: the launcher's own, without what no child may see)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_EXPORT_KEYS, ENV_CURVE_KEYS, ENV_CURVE_KEYS_FD)}
    if launch is None:
        return env
    env.update(launch.env)
    for key in ("GLIBC_TUNABLES", "OMP_WAIT_POLICY"):  # the user's own settings win
        if key in os.environ:
            env[key] = os.environ[key]
    return env
