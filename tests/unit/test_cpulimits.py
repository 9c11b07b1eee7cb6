"""Each local worker's CPU bound by a cgroup of its own (worker/tianji/local/cpulimits.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tianji.local import cpulimits

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0
"""
V1_SELF = "4:memory:/x\n2:cpu,cpuacct:/user.slice\n0::/user.slice/session-1.scope\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
V2_SELF = "0::/system.slice/job.service\n"


def test_the_cpu_hierarchy_is_found_in_either_cgroup_version():
    from pathlib import Path

    assert cpulimits._cpu_hierarchy(V1_MOUNTS, V1_SELF) == (Path("/sys/fs/cgroup/cpu,cpuacct/user.slice"), 1, None)
    assert cpulimits._cpu_hierarchy(V2_MOUNTS, V2_SELF) == (Path("/sys/fs/cgroup/system.slice/job.service"), 2, None)
    assert cpulimits._cpu_hierarchy("proc /proc proc rw 0 0\n", "") == (
        None, 0, "no cpu cgroup controller is mounted")


def test_off_and_unknown_modes_are_said():
    assert cpulimits.decide("r", {"TIANJI_CPU_LIMITS": "off"}) == (None, "TIANJI_CPU_LIMITS=off")
    assert "is not one of off, shares, quota" in cpulimits.decide("r", {"TIANJI_CPU_LIMITS": "cap"})[1]
    limits, why = cpulimits.decide("r", {}, mounts="", proc_cgroup="")
    assert limits is None and why == "no cpu cgroup controller is mounted"
    assert cpulimits.describe(None, why) == {"off": why}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("mode", ["shares", "quota"])
def test_a_workers_cgroup_holds_its_cores_as_the_kubelet_writes_them(tmp_path, version, mode):
    """The kubelet's figures: shares = millicores x 1024 / 1000, the v2 weight by its conversion,
    a quota of cores x a 100 ms period."""
    run = tmp_path / "tianji-job-1"
    limits = cpulimits.CpuLimits(run, version, mode)
    assert limits.make("actor-0-0", 0.5) == str(run / "actor-0-0" / "cgroup.procs")
    limits.make("learner-0-0", 1.0)
    if version == 1:
        assert (run / "actor-0-0" / "cpu.shares").read_text() == "512"
        assert (run / "learner-0-0" / "cpu.shares").read_text() == "1024"
        quota = run / "actor-0-0" / "cpu.cfs_quota_us"
        assert (quota.read_text() == "50000") if mode == "quota" else not quota.exists()
    else:
        assert (run / "cgroup.subtree_control").read_text() == "+cpu"
        assert (run / "actor-0-0" / "cpu.weight").read_text() == "20"  # the kubelet's weight for 512 shares
        assert (run / "learner-0-0" / "cpu.weight").read_text() == "39"
        quota = run / "actor-0-0" / "cpu.max"
        assert (quota.read_text() == "50000 100000") if mode == "quota" else not quota.exists()
    assert limits.describe()["cores"] == {"actor-0-0": 0.5, "learner-0-0": 1.0}
    assert cpulimits.weight(2) == 1 and cpulimits.weight(262144) == 10000


def test_a_cgroup_that_cannot_be_made_stops_bounding_new_workers_only(tmp_path):
    """Workers already bounded keep their cgroups (one that holds a process cannot be removed);
    a restarted worker rejoins its own; new workers run unbounded and summary.json says why."""
    run = tmp_path / "tianji-job-1"
    limits = cpulimits.CpuLimits(run, 1, "shares")
    first = limits.make("actor-0-0", 0.5)
    (run / "learner-0-0").write_text("")  # a file where the next worker's folder goes: mkdir fails
    with pytest.raises(OSError):
        limits.make("learner-0-0", 1.0)
    assert limits.make("buffer-0-0", 0.5) is None
    assert limits.make("actor-0-0", 0.5) == first and (run / "actor-0-0" / "cpu.shares").exists()
    said = limits.describe()
    assert said["cores"] == {"actor-0-0": 0.5} and "learner-0-0" in said["stopped"]


def _real_limits(mode: str) -> cpulimits.CpuLimits:
    limits, why = cpulimits.decide(f"test-{os.getpid()}-{mode}", {"TIANJI_CPU_LIMITS": mode})
    if limits is None:
        pytest.skip(f"no cgroups to make here: {why}")
    return limits


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_spinning_worker_under_a_quota_gets_its_cores_and_no_more():
    limits = _real_limits("quota")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        limits.make("actor-0-0", 0.2)
        limits.join("actor-0-0", spin.pid)
        own = open(f"/proc/{spin.pid}/cgroup").read()
        assert f"/{limits.run.name}/actor-0-0" in own, own
        c0, t0 = _cpu_seconds(spin.pid), time.monotonic()
        time.sleep(2.0)
        used = (_cpu_seconds(spin.pid) - c0) / (time.monotonic() - t0)
        assert used <= 0.3, f"a 0.2-core quota let a spinning process use {used:.2f} cores"
    finally:
        spin.kill()
        spin.wait()
        left = limits.remove()
    assert left == [] and not limits.run.exists()


def test_a_worker_forked_by_the_template_joins_its_cgroup_before_it_runs(tmp_path):
    """join_self: the template's child writes its own pid while still root."""
    limits = _real_limits("shares")
    try:
        procs = limits.make("buffer-0-0", 0.25)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                cpulimits.join_self(procs)
                os.write(w, open("/proc/self/cgroup").read().encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            own = f.read()
        os.waitpid(pid, 0)
        assert f"/{limits.run.name}/buffer-0-0" in own, own
        assert (limits.run / "buffer-0-0" / ("cpu.shares" if limits.version == 1 else "cpu.weight")).exists()
    finally:
        assert limits.remove() == []


def test_a_killed_launchers_cgroups_are_swept_by_the_next_one():
    limits = _real_limits("shares")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = cpulimits.CpuLimits(limits.run.parent / f"tianji-job-{dead.pid}", limits.version, "shares")
    gone.make("actor-0-0", 0.5)  # as a launcher killed with SIGKILL leaves it: empty, its pid gone
    live = cpulimits.CpuLimits(limits.run.parent / f"tianji-job-{os.getpid()}", limits.version, "shares")
    live.make("actor-0-0", 0.5)
    try:
        assert cpulimits.sweep(limits.run.parent) == [gone.run.name]
        assert not gone.run.exists() and live.run.exists()
    finally:
        assert live.remove() == [] and gone.remove() == []
