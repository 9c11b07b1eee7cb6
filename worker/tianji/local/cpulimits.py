"""Each local worker's CPU bounded by its role's `spec.resources.<role>.cpu`, as a pod's is.

On Kubernetes the kubelet puts every pod in a cgroup of its own: CPU shares from its request and
a CFS quota from its limit (the operator sets both to `resources.<role>.cpu`). So an actor whose
env code spins or floods burns its own pod's CPU, not the learner's. A local run as root does
the same with the machine's cgroups: one cgroup per worker under `tianji-<job>-<pid>` beside the
launcher's own, holding

    shares   cpu.shares = cpu x 1024 (v1) or cpu.weight (v2, the kubelet's conversion): a pod's
             request. Under contention each worker gets CPU in proportion to its cores, whatever
             its threads do; idle cores stay anyone's. The default: with one of 2 actors
             flooding, time to target 1.6x a clean run's (3.45x or none unbounded), and no clean
             run measurably slower (docs/benchmarks.md, bench/flood.py, bench/cpulimits.py)
    quota    the shares and a CFS quota of cpu x the 100 ms period (cpu.cfs_quota_us, v2
             cpu.max): a pod's limit too (TIANJI_CPU_LIMITS=quota). It holds a flooder to half a
             core, but the honest actor too, which then cannot make up for it: flood 1.95x,
             spin 3.1x (shares: 1.77x)

A forked worker joins its cgroup in the worker template's child while still root, before it
drops to its role's uid and before any other code runs; a spawned one (no template: a GPU
learner's job) is moved by the launcher as soon as it exists, while the interpreter is starting.
Its role's uid cannot write any cgroup file (they are root's, 0644), so it cannot leave.

TIANJI_CPU_LIMITS=off turns this off; without root, or without a writable cpu controller, no
worker's CPU is bounded and summary.json's `cpu_limits` says why.
"""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ENV = "TIANJI_CPU_LIMITS"
MODES = ("shares", "quota")
PERIOD_US = 100_000  # the kubelet's CFS period
MIN_SHARES = 2  # the kernel's (and the kubelet's) floor
REMOVE_WAIT_S = 2.0  # a worker killed a moment ago may still be leaving its cgroup


def weight(shares: int) -> int:
    """cgroup v2 cpu.weight for v1 shares: the kubelet's conversion (1..10000)."""
    return 1 + ((max(shares, MIN_SHARES) - 2) * 9999) // 262142


def shares(cores: float) -> int:
    return max(MIN_SHARES, int(round(cores * 1024)))


def _cpu_hierarchy(mounts: str, proc_cgroup: str) -> tuple[Optional[Path], int, Optional[str]]:
    """(the launcher's own cgroup folder in the cpu controller, its cgroup version, why not)."""
    v1 = v2 = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mount, kind, opts = parts[1], parts[2], parts[3].split(",")
        if kind == "cgroup" and "cpu" in opts:
            v1 = Path(mount)
        elif kind == "cgroup2" and v2 is None:
            v2 = Path(mount)
    for line in proc_cgroup.splitlines():
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if v1 is not None and "cpu" in controllers.split(","):
            return v1 / path.lstrip("/"), 1, None
        if v1 is None and v2 is not None and hid == "0":
            return v2 / path.lstrip("/"), 2, None
    return None, 0, "no cpu cgroup controller is mounted"


@dataclass
class CpuLimits:
    """The run's cgroup folder and each worker's cores."""

    run: Path
    version: int
    mode: str
    cores: dict[str, float] = field(default_factory=dict)
    stopped: Optional[str] = None  # why workers started from then on are not bounded

    def procs_file(self, name: str) -> str:
        return str(self.run / name / "cgroup.procs")

    def make(self, name: str, cores: float) -> Optional[str]:
        """`name`'s cgroup (made once, kept across its restarts); the file a pid is written to.
        None once stopped. An OSError stops bounding new workers: those already bounded keep their
        cgroups (a cgroup that holds a process cannot be removed) until remove() at the run's end."""
        if name in self.cores:  # a restart keeps its cgroup
            return self.procs_file(name)
        if self.stopped is not None:
            return None
        try:
            return self._make(name, cores)
        except OSError as e:
            self.stopped = f"cannot make {name}'s cgroup: {e}"
            raise

    def _make(self, name: str, cores: float) -> str:
        folder = self.run / name
        if name not in self.cores:
            if not self.cores:  # the run's own, at its first worker
                self.run.mkdir(exist_ok=True)
                if self.version == 2:
                    (self.run / "cgroup.subtree_control").write_text("+cpu")
            folder.mkdir(exist_ok=True)
            n = shares(cores)
            quota = max(1000, int(cores * PERIOD_US))
            if self.version == 1:
                (folder / "cpu.shares").write_text(str(n))
                if self.mode == "quota":
                    (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                    (folder / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (folder / "cpu.weight").write_text(str(weight(n)))
                if self.mode == "quota":
                    (folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            self.cores[name] = cores
        return self.procs_file(name)

    def join(self, name: str, pid: int) -> None:
        with open(self.procs_file(name), "w") as f:
            f.write(str(pid))

    def remove(self) -> list[str]:
        """Remove the run's cgroups (their processes have exited); what could not be removed."""
        left = []
        for folder in [*(self.run / n for n in self.cores), self.run]:
            deadline = time.monotonic() + REMOVE_WAIT_S
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        left.append(f"{folder}: {e.strerror}")
                        break
                    time.sleep(0.05)
        return left

    def describe(self) -> dict:
        out = {"mode": self.mode, "cgroup": str(self.run), "version": self.version, "cores": dict(self.cores)}
        if self.stopped is not None:
            out["stopped"] = self.stopped
        return out


def join_self(procs_file: Optional[str]) -> None:
    """This process into its cgroup (the worker template's child, as root, before anything else)."""
    if procs_file:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))


def _mode(environ) -> tuple[Optional[str], Optional[str]]:
    text = (environ.get(ENV) or "shares").strip().lower()
    if text in ("off", "0", "no", "false"):
        return None, f"{ENV}={text}"
    if text not in MODES:
        return None, f"{ENV}={text!r} is not one of off, {', '.join(MODES)}"
    return text, None


def _enable_v2(own: Path) -> Optional[str]:
    """v2 delegates a controller to child cgroups only through the parent's subtree_control."""
    try:
        if "cpu" not in (own / "cgroup.controllers").read_text().split():
            return f"the cpu controller is not available in {own}"
        if "cpu" not in (own / "cgroup.subtree_control").read_text().split():
            (own / "cgroup.subtree_control").write_text("+cpu")
    except OSError as e:  # EBUSY: the launcher's own cgroup holds processes (cgroup v2's no-internal-process rule)
        return f"cannot delegate the cpu controller in {own} ({e.strerror})"
    return None


def decide(run_id: str, environ=None, mounts: Optional[str] = None,
           proc_cgroup: Optional[str] = None) -> tuple[Optional[CpuLimits], Optional[str]]:
    """(the run's CPU limits, None), or (None, why no worker's CPU is bounded)."""
    environ = os.environ if environ is None else environ
    mode, why = _mode(environ)
    if mode is None:
        return None, why
    if mounts is None and (not hasattr(os, "geteuid") or os.geteuid() != 0):
        return None, "the launcher is not root: cgroups are root's to make"
    try:
        mounts = open("/proc/self/mounts").read() if mounts is None else mounts
        proc_cgroup = open("/proc/self/cgroup").read() if proc_cgroup is None else proc_cgroup
    except OSError as e:
        return None, f"cannot read this process's cgroups ({e.strerror})"
    own, version, why = _cpu_hierarchy(mounts, proc_cgroup)
    if own is None:
        return None, why
    if version == 2:
        why = _enable_v2(own)
        if why:
            return None, why
    if not os.access(own, os.W_OK):
        return None, f"cannot make cgroups in {own}"
    sweep(own)
    return CpuLimits(own / f"tianji-{run_id}", version, mode), None


def sweep(own: Path) -> list[str]:
    """Remove what killed launchers left: `tianji-<job>-<pid>` cgroups whose launcher is gone and
    that no process is in any more (rmdir refuses one that still holds a process)."""
    removed = []
    for run in own.glob("tianji-*-*"):
        pid = run.name.rsplit("-", 1)[1]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            for child in run.iterdir():
                if child.is_dir():
                    child.rmdir()
            run.rmdir()
            removed.append(run.name)
        except OSError:
            continue
    return removed


def describe(limits: Optional[CpuLimits], why: Optional[str]) -> dict:
    """summary.json's `cpu_limits`: each worker's cores and the mode, or why none is bounded."""
    return limits.describe() if limits is not None else {"off": why}
