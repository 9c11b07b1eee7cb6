"""A container of the local kubelet (pods.py) as a process group: one start's record
(`Incarnation`), its termination message, and the kill: SIGTERM to the group, SIGKILL after
the grace period, then whatever is left in the group (the group plays the container's cgroup)."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

TERMINATION_MESSAGE_MAX = 4096  # bytes the kubelet keeps of a termination message


def iso(ts: Optional[float] = None) -> str:
    return datetime.datetime.fromtimestamp(time.time() if ts is None else ts, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


class PodStartError(RuntimeError):
    """The container cannot be created from this spec (reported as a waiting reason)."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


@dataclass
class Incarnation:
    """One start of one container: what ran, where its output and termination message went."""

    namespace: str
    pod: str
    uid: str
    container: str
    restart_count: int
    labels: dict
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    termination_path: Path
    pid: int = 0
    started: float = 0.0
    finished: Optional[float] = None
    exit_code: Optional[int] = None
    signals: list[str] = field(default_factory=list)  # what the kubelet sent (SIGTERM, SIGKILL)
    proc: Any = field(default=None, repr=False)
    runtime: Any = field(default=None, repr=False)  # a container runtime's handle (kill, finish); None: a process group

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def pod_dir(self) -> Path:
        """The pod's folder on the node: logs/, termination/, volumes/ (emptyDirs on disk, ConfigMaps)."""
        return self.log_path.parent.parent

    def termination_message(self) -> str:
        """What the kubelet puts in state.terminated.message: the file's first 4096 bytes."""
        try:
            with open(self.termination_path, "rb") as f:
                return f.read(TERMINATION_MESSAGE_MAX).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def final_report(self) -> Optional[dict]:
        """The termination message as JSON (the worker's final report), or None."""
        text = self.termination_message().strip()
        if not text:
            return None
        try:
            out = json.loads(text)
        except ValueError:
            return None
        return out if isinstance(out, dict) else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pgid_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[2])


def processes_in_groups(pgids: set[int]) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose process group is in `pgids`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if _pgid_of(pid) in pgids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state == "Z":
                    continue  # exited; only waiting to be reaped
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out.append((pid, cmd))
    return out


def kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal(inc: Incarnation, sig: int) -> bool:
    """Signal the container: its process group, or through its runtime (crun kill)."""
    return inc.runtime.kill(sig) if inc.runtime is not None else kill_group(inc.pid, sig)


async def reap(inc: Incarnation) -> int:
    """Wait for the container's main process; then SIGKILL whatever is left in its process group
    (the container's cgroup goes with it: no stragglers)."""
    rc = await inc.proc.wait()
    _signal(inc, signal.SIGKILL)
    if inc.runtime is not None:
        await asyncio.to_thread(inc.runtime.finish)
    if inc.exit_code is None:
        inc.exit_code, inc.finished = _exit_code(rc), time.time()
    return inc.exit_code


async def stop_container(inc: Incarnation, grace: float) -> int:
    """SIGTERM the container's process group, SIGKILL it after `grace` seconds (the kubelet's kill)."""
    if inc.exit_code is not None:
        return inc.exit_code
    if inc.proc.returncode is None and _signal(inc, signal.SIGTERM):
        inc.signals.append("SIGTERM")
    try:
        await asyncio.wait_for(asyncio.shield(inc.proc.wait()), max(grace, 0.0))
    except asyncio.TimeoutError:
        if _signal(inc, signal.SIGKILL):
            inc.signals.append("SIGKILL")
    return await reap(inc)
