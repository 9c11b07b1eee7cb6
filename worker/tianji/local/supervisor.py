"""The launcher's restart policy: which worker to restart, when, and when to give up.

A worker that exits or stays silent is restarted after an exponential back-off
(BACKOFF_BASE_S doubling to BACKOFF_CAP_S). MAX_RESTARTS failures of one worker in a
row end the run (an evaluator's: its evaluations only); a worker that ran HEALTHY_S
before it failed starts a fresh count, so a slow trickle of faults never ends a run.
A run that reached its time or frame budget without doing its work (`idle_run`: a
training process that never reported, no env frame, or no sample trained on) ends as a
failure that names the process and the last error in its log.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Optional

STARTUP_TIMEOUT_S = 120.0  # first report (torch import on a loaded 2-core box can be slow)
HEARTBEAT_TIMEOUT_S = 30.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
MAX_RESTARTS = 10  # failures of one worker in a row that end the run (the 10th is not restarted)
HEALTHY_S = 60.0
NO_HEARTBEAT = "no heartbeat"


@dataclass
class Child:
    """One worker process of the run (role, group, index) across its incarnations."""

    role: str
    group: int
    index: int
    proc: Optional[object] = None  # subprocess.Popen, or the worker template's forked child
    log: Optional[IO] = None
    restarts: int = 0
    failures: int = 0  # in a row: reset by a healthy interval (HEALTHY_S)
    pids: set = field(default_factory=set)  # every incarnation's pid: reports from anyone else are refused
    started_at: float = 0.0
    last_report: Optional[float] = None
    restart_at: Optional[float] = None
    exits: list = field(default_factory=list)
    log_offset: int = 0  # where the current incarnation's output starts in its (appended) log
    reported: bool = False  # any incarnation of this launch has sent a report
    last_error: Optional[str] = None  # the exception line the last failed incarnation logged

    @property
    def name(self) -> str:
        return f"{self.role}-{self.group}-{self.index}"

    @property
    def key(self) -> tuple[str, int, int]:
        return self.role, self.group, self.index


def failed(c: Child, now: float) -> Optional[object]:
    """The exit code of a worker that has failed by `now` ("no heartbeat" for a silent one,
    which is killed first), or None while it runs and reports."""
    code = c.proc.poll()
    silent = (now - c.last_report > HEARTBEAT_TIMEOUT_S) if c.last_report is not None \
        else (now - c.started_at > STARTUP_TIMEOUT_S)
    if code is None and not silent:
        return None
    if code is None:  # alive but not beating: treat as hung
        c.proc.kill()
        c.proc.wait()
        code = NO_HEARTBEAT
    return code


def count_failure(c: Child, now: float, code: object) -> Optional[float]:
    """Count one failure of `c`; the back-off before its restart (restart_at is set), or None
    when this was its MAX_RESTARTS-th failure in a row: it is not restarted."""
    c.exits.append(code)
    if now - c.started_at >= HEALTHY_S:  # a slow trickle of faults never ends a run
        c.failures = 0
    c.failures += 1
    if c.failures >= MAX_RESTARTS:
        return None
    delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (c.failures - 1))
    c.restarts += 1
    c.restart_at = now + delay
    return delay


def exit_text(code: object) -> str:
    """An exit as a person reads it: "exit code 1", "killed by signal 9", "no heartbeat"."""
    if isinstance(code, int):
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return str(code)


def failure_text(c: Child) -> str:
    """How `c` failed last: its exit and the exception its log ends with, and where the log is."""
    last = f" (last: {exit_text(c.exits[-1])})" if c.exits else ""
    error = f": {c.last_error}" if c.last_error else ""
    log = f"; see {c.log.name}" if c.log is not None else ""
    return f"{last}{error}{log}"


def idle_run(children: list[Child], new_frames: int, new_consumed: int, elapsed: float) -> Optional[str]:
    """Why a run that reached its time or frame budget did none of its work, or None: a
    training process (not the evaluator) that never reported in this launch, no env frame
    produced, or no sample trained on. The first such process in the children's order
    (learners first) is named."""
    silent = [c for c in children if c.role != "evaluator" and not c.reported]
    if silent:
        c, others = silent[0], [x.name for x in silent[1:]]
        more = f" (nor did {', '.join(others[:3])}{' and more' if len(others) > 3 else ''})" if others else ""
        if c.exits:
            return f"{c.name} never started: it exited {len(c.exits)} time(s){failure_text(c)}{more}"
        log = f"; see {c.log.name}" if c.log is not None else ""
        return f"{c.name} never started: no report in the run's {elapsed:.0f} s (still starting, or hung){log}{more}"
    if new_frames <= 0:
        return f"the actors produced no env frame in {elapsed:.0f} s"
    if new_consumed <= 0:
        logs = [c.log.name for c in children if c.role == "learner" and c.log is not None][:1]
        return (f"the learners trained on no sample in {elapsed:.0f} s, though the actors produced {new_frames} "
                f"env frames{'; see ' + logs[0] if logs else ''}")
    return None
