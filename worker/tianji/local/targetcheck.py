"""A target is reached only when the saved policy meets it: the confirming evaluation.

Actors' returns are their own claims (docs/security.md): they only *trigger* this check. When
the mean of the last 100 episodes meets stop.meanReturn (StopRule.target_reached), the
launcher asks learner-0-0 for a checkpoint of the policy it has now (SIGUSR1: the learner
saves one at its next step and reports it) and, once it reports a checkpoint at or past the
version it had at the trigger, plays that checkpoint's policy in a process of its own: `tianji
eval CHECKPOINT --json` (the learner's job manifest from the checkpoint, a fixed count of
episodes per env, PPO at its mode, DQN epsilon-greedy), on envs seeded apart from every actor's
and the evaluator's. The run ends reached-target only when that evaluation's mean meets
stop.meanReturn; summary.json names the checkpoint and the evaluation (`target_evaluation`).
Otherwise training goes on, and the next trigger waits for a newer policy and RETRY_S.

Episodes: spec.evaluation.episodes when the job has an evaluator (the user's evaluation size),
else the stop rule's window (100).
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Optional

from tianji.control.contracts.rolereport import WINDOW

CHECKPOINT_WAIT_S = 120.0  # a learner in a long update (Pong on a busy box) takes a while to save
EVAL_TIMEOUT_S = 1800.0
RETRY_S = 10.0
SEED = 2 ** 31 + 7_777_777  # apart from actors' (env.seed + < 1.1e7) and the evaluator's (2^31 + blocks of envs)
CKPT = re.compile(r"^ckpt-(\d{12})\.pt$")
LEARNER = ("learner", 0, 0)


class TargetCheck:
    """The launcher's confirming evaluations: `trigger` when the stop rule is met, `poll` each turn
    of the main loop; `passed` holds the evaluation that confirmed the target."""

    def __init__(self, job, run_dir: Path, cli: list[str], env: dict[str, str]):
        self.job, self.run_dir, self.cli, self.env = job, run_dir, cli, env
        ev = job.spec.evaluation
        self.episodes = ev.episodes if ev.enabled else WINDOW
        self.epsilon = ev.epsilon if ev.enabled and job.spec.algorithm.name == "dqn" else None
        self.stage: Optional[str] = None  # None, "checkpoint" (asked for), "evaluating"
        self.since = 0.0
        self.version = 0  # learner-0-0's version at the trigger
        self.checkpoint: Optional[Path] = None
        self.proc: Optional[subprocess.Popen] = None
        self.log: Optional[IO] = None
        self.checks: list[dict] = []  # every evaluation, passed or not
        self.passed: Optional[dict] = None
        self.retry_at = 0.0
        self.retry_version = 0  # a new check waits for a policy newer than the last one evaluated

    @property
    def busy(self) -> bool:
        return self.stage is not None

    def ready(self, now: float, version: int) -> bool:
        """May the stop rule being met start a check now?"""
        return not self.busy and self.passed is None and now >= self.retry_at and version > self.retry_version

    def trigger(self, now: float, version: int, learner_pids: list[int]) -> None:
        """Ask the learners for a checkpoint of their policy now (learner-0-0's is evaluated)."""
        self.stage, self.since, self.version = "checkpoint", now, version
        for pid in learner_pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        print(f"tianji: the actors' mean return met stop.meanReturn; evaluating the policy at version "
              f"{version} before calling the target reached", file=sys.stderr)

    def poll(self, now: float, acc) -> Optional[dict]:
        """Advance the check; the confirming evaluation once it passes (also kept in `passed`)."""
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
                self._start(path, now)
                return
        if now - self.since > CHECKPOINT_WAIT_S:
            self._give_up(now, f"no checkpoint at version >= {self.version} within {CHECKPOINT_WAIT_S:g} s")

    def _start(self, path: Path, now: float) -> None:
        self.checkpoint, self.stage, self.since = path, "evaluating", now
        cmd = [*self.cli, "eval", str(path), "--episodes", str(self.episodes), "--seed", str(SEED), "--json"]
        if self.epsilon is not None:
            cmd += ["--epsilon", str(self.epsilon)]
        if self.log is None:
            self.log = open(self.run_dir / "logs" / "target-check.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, env=self.env,
                                     start_new_session=True)

    def _await_evaluation(self, now: float) -> Optional[dict]:
        if self.proc.poll() is None:
            if now - self.since > EVAL_TIMEOUT_S:
                self.close()
                self._give_up(now, f"the evaluation took over {EVAL_TIMEOUT_S:g} s")
            return None
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        code, self.proc = self.proc.returncode, None
        try:
            res = _result(out, code)
        except ValueError as e:
            self._give_up(now, f"the evaluation of {self.checkpoint.name} failed ({e}; logs/target-check.log)")
            return None
        check = {"checkpoint": self.checkpoint.name, "policy_version": res["policy_version"],
                 "episodes": res["episodes"], "mean_return": res["mean_return"], "std_return": res["std_return"],
                 "mean_length": res["mean_length"], "seed": SEED, "t": round(time.time(), 3)}
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

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            self.proc.stdout.close()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


def _result(out: bytes, code: int) -> dict:
    """`tianji eval --json`'s answer, checked (it is JSON, parsed as data: never unpickled)."""
    if code != 0:
        raise ValueError(f"exit code {code}")
    try:
        res = json.loads(out.decode().strip().splitlines()[-1])
    except (UnicodeDecodeError, IndexError, ValueError) as e:
        raise ValueError(f"no JSON result ({e})") from None
    for k in ("mean_return", "std_return", "mean_length"):
        if not isinstance(res.get(k), (int, float)) or not math.isfinite(res[k]):
            raise ValueError(f"{k} {res.get(k)!r}")
    for k in ("episodes", "policy_version"):
        if type(res.get(k)) is not int or res[k] < 0:
            raise ValueError(f"{k} {res.get(k)!r}")
    return res
