"""The launcher's restart policy: which worker to restart, when, and when to give up.

A worker that exits or stays silent is restarted after an exponential back-off
(BACKOFF_BASE_S doubling to BACKOFF_CAP_S). MAX_RESTARTS failures of one worker in a
row end the run (an evaluator's: its evaluations only); a worker that ran HEALTHY_S
before it failed starts a fresh count, so a slow trickle of faults never ends a run.
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
