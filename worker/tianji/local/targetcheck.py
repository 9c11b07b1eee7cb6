"""A target is reached only when the saved policy meets it: the confirming evaluation.

Actors' returns are their own claims (docs/security.md): they only *trigger* this check. When
the mean of the last 100 episodes meets stop.meanReturn (StopRule.target_reached), the
launcher asks learner-0-0 for a checkpoint of the policy it has now (SIGUSR1: the learner
saves one at its next step and reports it, with the file's SHA-256) and, once it reports a
checkpoint at or past the version it had at the trigger, reads that file, checks its digest
against the learner's (authenticated) report, and plays it from a sealed in-memory copy in a
process of its own (`python -m tianji.local.targetcheck --serve`: runtime/evaluation.evaluate, as
`tianji eval`: the job manifest from the checkpoint, a fixed count of episodes per env, PPO at
its mode, DQN epsilon-greedy, on envs seeded apart from every actor's and the evaluator's). A
file another process rewrote is not evaluated, nor can it be changed while it is. The
evaluating process makes itself non-inspectable before it loads anything (runtime/security.py).
The run ends reached-target only when that evaluation's mean meets stop.meanReturn;
summary.json names the checkpoint and the evaluation (`target_evaluation`). Otherwise training
goes on, and the next trigger waits for a newer policy and RETRY_S.

That process is started before it is needed, once the learner has trained a first version of
a job with a target: it makes itself non-inspectable, imports torch and Gymnasium (1.4 s of
CPU), and waits on a Unix socket for the one request it serves (the sealed copy's descriptor
and the evaluation's arguments, SCM_RIGHTS). The check then costs the evaluation alone, not a
cold interpreter on a machine busy training, and the process exits as soon as its answer is
written (the interpreter's teardown skipped); a new one is started after each check that did
not confirm.

Episodes: spec.evaluation.episodes when the job has an evaluator (the user's evaluation size),
else the stop rule's window (100).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Optional

# Shared with the operator's check (one contract: episodes, seed, step cap, how an answer is read).
from tianji.control.contracts.confirm import (
    CHECKPOINT_WAIT_S,
    CKPT,
    EVAL_TIMEOUT_S,
    RETRY_S,
    SEED,
    parse_result,
    step_cap,
)
from tianji.control.contracts.rolereport import WINDOW

LEARNER = ("learner", 0, 0)


def learner_version(acc) -> int:
    """learner-0-0's policy version, as its last report gave it (0 before any)."""
    rep = acc.procs.get(LEARNER)
    return int(rep.extra.get("version", 0) or 0) if rep is not None else 0


class TargetCheck:
    """The launcher's confirming evaluations: `trigger` when the stop rule is met, `poll` each turn
    of the main loop; `passed` holds the evaluation that confirmed the target."""

    def __init__(self, job, run_dir: Path, env: dict[str, str], creds=None):
        """`creds` (local/isolation.Creds): the uid the evaluation runs as (None: the launcher's)."""
        self.job, self.run_dir, self.env, self.creds = job, run_dir, env, creds
        ev = job.spec.evaluation
        self.episodes = ev.episodes if ev.enabled else WINDOW
        self.epsilon = ev.epsilon if ev.enabled and job.spec.algorithm.name == "dqn" else None
        self.stage: Optional[str] = None  # None, "checkpoint" (asked for), "evaluating"
        self.since = 0.0
        self.triggered = 0.0  # when the current check was asked for
        self.version = 0  # learner-0-0's version at the trigger
        self.checkpoint: Optional[Path] = None
        self.copy: Optional[int] = None  # the sealed in-memory copy the evaluation reads
        self.log: Optional[IO] = None
        self.checks: list[dict] = []  # every evaluation, passed or not
        self.passed: Optional[dict] = None
        self.retry_at = 0.0
        self.retry_version = 0  # a new check waits for a policy newer than the last one evaluated
        self.spare: Optional[Evaluation] = None  # started ahead, waiting for its checkpoint
        self.running: Optional[Evaluation] = None  # the one evaluating

    @property
    def busy(self) -> bool:
        return self.stage is not None

    def ready(self, now: float, version: int) -> bool:
        """May the stop rule being met start a check now?"""
        return not self.busy and self.passed is None and now >= self.retry_at and version > self.retry_version

    def trigger(self, now: float, version: int, learner_pids: list[int]) -> None:
        """Ask the learners for a checkpoint of their policy now (learner-0-0's is evaluated)."""
        self.stage, self.since, self.version = "checkpoint", now, version
        self.triggered = now
        for pid in learner_pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        print(f"tianji: the actors' mean return met stop.meanReturn; evaluating the policy at version "
              f"{version} before calling the target reached", file=sys.stderr)

    def poll(self, now: float, acc) -> Optional[dict]:
        """Advance the check; the confirming evaluation once it passes (also kept in `passed`)."""
        self._warm(acc)
        if self.stage == "checkpoint":
            self._await_checkpoint(now, acc)
        elif self.stage == "evaluating":
            return self._await_evaluation(now)
        return None

    def _await_checkpoint(self, now: float, acc) -> None:
        rep = acc.procs.get(LEARNER)
        name = rep.extra.get("checkpoint") if rep is not None else None
        m = CKPT.match(name or "")
        if m and int(m.group(1)) >= self.version:
            path = self.run_dir / "checkpoints" / "0-0" / name
            if path.is_file():
                try:
                    self.copy = sealed_copy(path, rep.extra.get("checkpoint_sha256"))
                except ValueError as e:
                    self._give_up(now, str(e))
                    return
                self._start(path, now, acc.mean_episode_length())
                return
        if now - self.since > CHECKPOINT_WAIT_S:
            self._give_up(now, f"no checkpoint at version >= {self.version} within {CHECKPOINT_WAIT_S:g} s")

    def _warm(self, acc) -> None:
        """Start the next check's process ahead, once the learner has trained (not in the start-up
        rush, and never for a job without a target)."""
        if self.spare is not None or self.running is not None or self.passed is not None \
                or self.job.spec.stop.mean_return is None:
            return
        if learner_version(acc) >= 1:
            self.spare = self._evaluation()

    def _evaluation(self) -> Evaluation:
        if self.log is None:
            self.log = open(self.run_dir / "logs" / "target-check.log", "ab")
        return Evaluation(self.env, self.log, self.creds)

    def _start(self, path: Path, now: float, mean_length: Optional[float]) -> None:
        self.checkpoint, self.stage, self.since = path, "evaluating", now
        request = {"episodes": self.episodes, "seed": SEED, "step_cap": step_cap(mean_length),
                   "epsilon": self.epsilon}
        if self.copy is None:
            request["path"] = str(path)
        ev, self.spare = self.spare or self._evaluation(), None
        try:
            ev.submit(request, self.copy)
        except OSError as e:  # it died waiting (killed, out of memory): this check fails, the next starts afresh
            ev.close()
            self._give_up(now, f"the evaluation process is gone ({e}; logs/target-check.log)")
            return
        finally:
            self._close_copy()
        self.running = ev

    def _await_evaluation(self, now: float) -> Optional[dict]:
        code = self.running.proc.poll()
        if code is None:
            if now - self.since > EVAL_TIMEOUT_S:
                self.running.close()
                self.running = None
                self._give_up(now, f"the evaluation took over {EVAL_TIMEOUT_S:g} s")
            return None
        out = self.running.proc.stdout.read()
        self.running.close()
        self.running = None
        try:
            res = _result(out, code)
        except ValueError as e:
            self._give_up(now, f"the evaluation of {self.checkpoint.name} failed ({e}; logs/target-check.log)")
            return None
        check = {"checkpoint": self.checkpoint.name, "policy_version": res["policy_version"],
                 "episodes": res["episodes"], "mean_return": res["mean_return"], "std_return": res["std_return"],
                 "mean_length": res["mean_length"], "seed": SEED, "t": round(time.time(), 3),
                 "seconds": round(now - self.triggered, 3)}  # the trigger to the verdict: the check's own cost
        self.checks.append(check)
        target = self.job.spec.stop.mean_return
        if check["mean_return"] >= target:
            self.stage, self.passed = None, check
            return check
        self._give_up(now, f"its {check['episodes']} episodes return {check['mean_return']:.1f} < "
                           f"stop.meanReturn {target:g}", version=check["policy_version"])
        return None

    def _give_up(self, now: float, why: str, version: Optional[int] = None) -> None:
        print(f"tianji: not the target yet: {why}; training goes on", file=sys.stderr)
        self.stage = None
        self.retry_at = now + RETRY_S
        self.retry_version = max(self.retry_version, self.version if version is None else version)

    def summary(self) -> dict:
        """summary.json's `target_evaluation` (the evaluation that confirmed the target, or null)
        and `target_checks` (how many evaluations were made, the last one)."""
        return {"target_evaluation": self.passed,
                "target_checks": {"count": len(self.checks), "last": self.checks[-1] if self.checks else None}}

    def _close_copy(self) -> None:
        if self.copy is not None:
            os.close(self.copy)
            self.copy = None

    def close(self) -> None:
        self._close_copy()
        for ev in (self.running, self.spare):
            if ev is not None:
                ev.close()
        self.running = self.spare = None
        if self.log is not None:
            self.log.close()
            self.log = None


class Evaluation:
    """One confirming evaluation's process (`--serve`): started at once, it isolates itself and
    imports what an evaluation needs, then waits for `submit`; its one JSON line is on `proc.stdout`."""

    def __init__(self, env: dict[str, str], log: IO, creds=None):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tianji.local.targetcheck", "--serve", str(theirs.fileno())],
                stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True, pass_fds=(theirs.fileno(),),
                **(creds.popen() if creds else {}))
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()

    def submit(self, request: dict, fd: Optional[int]) -> None:
        """Send the evaluation's arguments and, where there is one, the checkpoint's descriptor (OSError
        if the process is gone). A small message: the socket holds it until the process reads it."""
        if self.proc.poll() is not None:
            raise OSError(f"exit code {self.proc.returncode}")
        socket.send_fds(self.sock, [json.dumps(request).encode()], [] if fd is None else [fd])
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def sealed_copy(path: Path, sha256: Optional[str]) -> Optional[int]:
    """A read-only in-memory copy of checkpoint `path` (a sealed memfd: nobody can change it), after
    checking its digest against the one the learner reported; ValueError if the file is not what
    the learner wrote. None where there is no memfd (the file is then evaluated as it is)."""
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{path.name} is not the file learner-0-0 wrote (its SHA-256 differs): not evaluated")
    if sha256 is None:
        print(f"tianji: learner-0-0 reported no digest of {path.name}; evaluating the file as it is", file=sys.stderr)
    return sealed_bytes(data)


def sealed_bytes(data: bytes) -> Optional[int]:
    """A sealed memfd (close-on-exec) holding `data`, read from its start: no one can write, grow or
    shrink it. None where there is no memfd. `sealed_copy` and `tianji confirm` (cli/confirm.py) use it."""
    if not hasattr(os, "memfd_create"):
        return None
    import fcntl

    fd = os.memfd_create("tianji-checkpoint", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _result(out: bytes, code: int) -> dict:
    """The evaluation's answer, checked (it is JSON, parsed as data: never unpickled)."""
    try:
        text = out.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"no JSON result ({e})") from None
    return parse_result(text, code)


def isolate() -> None:
    """Make this process non-inspectable by the user's other processes before it loads anything
    (runtime/security.forbid_inspection), and refuse to go on under a debugger attached before
    that (KeyError_): the confirming evaluation's first step, here and in `tianji confirm`."""
    from tianji.runtime import security

    if security.forbid_inspection():
        security.untraced()


def _serve(channel: int) -> dict:
    """`--serve`: import what an evaluation needs, then wait for the launcher's one request on the
    socket `channel` (Evaluation.submit) and evaluate it. Its arguments are checked, as data."""
    import torch

    import tianji.algos.models  # noqa: F401 - imported now, before the request: the check's own time is the evaluation
    import tianji.envs  # noqa: F401
    from tianji.runtime.evaluation import evaluate

    torch.set_num_threads(1)
    with socket.socket(fileno=channel) as sock:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    if not data:
        raise SystemExit(0)  # the launcher closed it unused (the run ended)
    req = json.loads(data)
    if not isinstance(req, dict):
        raise ValueError(f"bad request: {data[:200]!r}")
    ints = {k: req.get(k) for k in ("episodes", "seed", "step_cap")}
    if any(type(v) is not int or v < 0 for v in ints.values()) or ints["episodes"] < 1:
        raise ValueError(f"bad request: {data[:200]!r}")
    eps = req.get("epsilon")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))):
        raise ValueError(f"bad epsilon {eps!r}")
    source = f"/dev/fd/{fds[0]}" if fds else req.get("path")
    if not isinstance(source, str):
        raise ValueError("the request names no checkpoint")
    return evaluate(Path(source), ints["episodes"], ints["seed"], eps, step_cap=ints["step_cap"])


def main(argv: Optional[list[str]] = None) -> int:
    """The confirming evaluation's own process: not inspectable by the run's other processes
    (runtime/security.forbid_inspection, and no debugger attached before that), then
    runtime/evaluation.evaluate of CHECKPOINT (a path, or /dev/fd/N), or of the checkpoint that
    comes over the socket of `--serve FD`; its result as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m tianji.local.targetcheck")
    p.add_argument("checkpoint", nargs="?")
    p.add_argument("--serve", type=int, metavar="FD", help="wait for one request on this Unix socket")
    p.add_argument("--episodes", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--epsilon", type=float, default=None)
    p.add_argument("--step-cap", type=int, default=None, help="cut an episode after this many steps")
    a = p.parse_args(argv)
    if a.serve is None and (a.checkpoint is None or a.episodes is None or a.seed is None):
        p.error("CHECKPOINT, --episodes and --seed are required without --serve")
    isolate()
    if a.serve is not None:
        print(json.dumps(_serve(a.serve)), flush=True)
        sys.stderr.flush()
        # The launcher's verdict waits for this exit: skip the interpreter's teardown of torch and
        # Gymnasium (0.3-0.5 s of CPU measured), which nothing here needs (no file is left open).
        os._exit(0)
    from tianji.runtime.evaluation import evaluate

    print(json.dumps(evaluate(Path(a.checkpoint), a.episodes, a.seed, a.epsilon, step_cap=a.step_cap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
