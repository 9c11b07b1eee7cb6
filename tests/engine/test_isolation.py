"""Role isolation of a `tianji run` started as root (worker/tianji/local/isolation.py): each role
runs under a uid of its own without capabilities, or the launcher says why it cannot.

This machine's Python lives under /root (mode 0700), out of every role uid's reach, so the live
run starts the launcher in a mount namespace of its own whose /root is a 0755 tmpfs holding only
the interpreter (`reachable_python`): what a container whose Python is in /usr sees."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from helpers import EXAMPLES, ROOT, tianji_cmd
from tianji.control.spec import load_job
from tianji.local import cpulimits, isolation

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="role isolation needs root (and unshare for the live run)")
JOB = EXAMPLES / "cartpole-ppo.yaml"
ACTOR = isolation.RoleUids(isolation.DEFAULT_BASE).creds("actor")

# /root replaced by a 0755 tmpfs that holds only what the interpreter needs (its pyenv), inside a
# private mount namespace: the machine's /root is untouched.
REACHABLE_PYTHON = """set -e
stage="$STAGE"
mkdir -p "$stage"
mount --bind /root "$stage"
mount -t tmpfs -o mode=755 tianji-root /root
for top in $TOPS; do mkdir -p "/root/$top" && mount --bind "$stage/$top" "/root/$top"; done
exec "$@"
"""


def reachable_python(cmd: list[str], stage: Path) -> list[str]:
    """`cmd` where /root holds only the interpreter; `stage`: an empty folder the real /root is
    seen at meanwhile (in that namespace only)."""
    real = Path(os.path.realpath(sys.executable))
    tops = sorted({p.relative_to("/root").parts[0] for p in (real, Path(sys.prefix).resolve(),
                                                           Path(sys.base_prefix).resolve())
                   if p.is_relative_to("/root")})
    return ["env", f"TOPS={' '.join(tops)}", f"STAGE={stage}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", REACHABLE_PYTHON, "reachable-python", *cmd]


def test_the_launcher_says_why_roles_cannot_get_uids_of_their_own(tmp_path):
    job = load_job(JOB)
    private = tmp_path / "private"  # under pytest's 0700 folder, and 0700 itself
    run = private / "run"
    run.mkdir(parents=True)
    private.chmod(0o700)
    (run / "job.yaml").write_text("x")
    uids, why = isolation.decide(job, run, run / "job.yaml", environ={})
    assert uids is None and why.startswith(str(Path(tempfile.gettempdir()) / "pytest-of-root")), why
    assert f" by uid {ACTOR.uid} (a role's)" in why, why
    assert isolation.decide(job, run, run / "job.yaml", {"TIANJI_ROLE_UIDS": "off"}) == (
        None, "TIANJI_ROLE_UIDS=off")
    assert "is not a uid from 1000" in isolation.decide(job, run, run / "job.yaml", {"TIANJI_ROLE_UIDS": "12"})[1]
    taken = next((p for p in pwd.getpwall() if 1000 <= p.pw_uid < 2**31 - 8), None)
    if taken is not None:  # an account's uid inside the range is never borrowed
        why = isolation.decide(job, run, run / "job.yaml", {"TIANJI_ROLE_UIDS": str(taken.pw_uid)})[1]
        assert f"uid {taken.pw_uid} is the account {taken.pw_name!r}" in why, why
    assert isolation.describe(None, "why") == {"off": "why"} and isolation.describe(None, None) is None


def test_a_dropped_process_has_its_role_uid_and_no_capability(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the actor, report what it is and can do
        try:
            isolation.drop(ACTOR)
            status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
            try:
                secret.read_text()
                read = "allowed"
            except PermissionError:
                read = "denied"
            os.write(w, json.dumps({"ids": os.getresuid() + os.getresgid(), "groups": os.getgroups(),
                                    "caps": [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")],
                                    "read": read, "umask": os.umask(0)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    assert got["ids"] == [ACTOR.uid] * 3 + [ACTOR.gid] * 3 and got["groups"] == [ACTOR.gid], got
    assert got["caps"][:2] == ["0000000000000000"] * 2, got  # setresuid away from 0 clears them
    assert got["read"] == "denied" and got["umask"] == isolation.UMASK, got


def test_a_probe_that_hangs_on_a_user_module_is_stopped(monkeypatch):
    """A user package that hangs as it is imported (find_spec imports the parent) cannot hold the
    launcher: the probe is killed after PROBE_TIMEOUT_S and the roles stay root, saying why."""
    top = Path(tempfile.mkdtemp(prefix="tianji-probe-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "slowpkg").mkdir(mode=0o755)
        (top / "slowpkg" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
        (top / "slowpkg" / "mod.py").write_text("")
        monkeypatch.syspath_prepend(str(top))
        monkeypatch.setattr(isolation, "PROBE_TIMEOUT_S", 1.0)
        why = isolation._probe(ACTOR, [], ["slowpkg.mod"])
        assert why == f"the probe as uid {ACTOR.uid} did not answer within 1 s", why
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.slow
def test_a_run_as_root_gives_each_role_its_own_uid_and_trains():
    """A hostile actor (bad_envs:RoleProbe) runs as the actor's uid, with no capability; it can
    neither read the learner's environment or memory, nor signal it, nor rewrite the job,
    the learner's checkpoints or the launcher's socket; the run trains to its target."""
    top = Path(tempfile.mkdtemp(prefix="tianji-iso-", dir="/tmp"))
    try:
        top.chmod(0o755)
        out = top / "out"
        out.mkdir(mode=0o1777)
        out.chmod(0o1777)
        run_dir, probe = top / "run", out / "probe.json"
        doc = yaml.safe_load(JOB.read_text())
        doc["spec"]["env"]["wrappers"] = [{"entryPoint": "bad_envs:RoleProbe",
                                           "kwargs": {"out": str(probe), "run_dir": str(run_dir)}}]
        doc["spec"]["env"]["episodeBounds"] = {"maxSteps": 500, "rewardPerStep": [0, 1]}
        # Room for PPO to recover from a collapse: seeds 11-22 reach the target within 105k frames,
        # but one CI run fell from 277 to 117 at 250k and ran out of the example's 400k.
        doc["spec"]["stop"]["envFrames"] = 1_000_000
        job = top / "job.yaml"
        job.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(EXAMPLES / "custom-env"),
                                                            str(ROOT / "worker")])}
        env.pop("TIANJI_ROLE_UIDS", None)
        done = subprocess.run(reachable_python(tianji_cmd("run", str(job), "--run-dir", str(run_dir)), top / "stage"),
                              capture_output=True, text=True, timeout=420, cwd=ROOT, env=env)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert done.returncode == 0 and summary["reached_target"], done.stdout[-3000:] + done.stderr[-3000:]
        uids = isolation.RoleUids(isolation.DEFAULT_BASE)
        assert summary["isolation"]["uids"] == {r: uids.creds(r).uid for r in isolation.ROLES}, summary
        facts = json.loads(probe.read_text())
        assert (facts["uid"], facts["euid"], facts["groups"]) == (ACTOR.uid, ACTOR.uid, [ACTOR.gid]), facts
        assert facts["cap_eff"] == "0000000000000000" and facts["learner_pid"], facts
        for attempt in ("learner_environ", "learner_mem", "signal_learner", "rewrite_job", "write_checkpoints",
                        "remove_report_socket"):
            assert facts[attempt] == "denied", (attempt, facts)
        ckpts = sorted((run_dir / "checkpoints" / "0-0").glob("ckpt-*.pt"))
        assert ckpts and ckpts[-1].stat().st_uid == uids.creds("learner").uid
        assert "not under a uid of its own" not in done.stderr, done.stderr
        # ... and in a cgroup of its own (local/cpulimits.py), which it cannot leave or widen
        limits = summary["cpu_limits"]
        can, why = cpulimits.decide("probe", environ={})
        if can is None:  # a root without a writable cpu controller (a container): said, not faked
            assert limits == {"off": why}, limits
            return
        assert limits["mode"] == "shares" and set(limits["cores"]) == {
            "actor-0-0", "actor-0-1", "buffer-0-0", "learner-0-0"}, limits
        assert facts["cgroup"].rsplit("/", 2)[-2:] in (
            [Path(limits["cgroup"]).name, "actor-0-0"], [Path(limits["cgroup"]).name, "actor-0-1"]), facts
        assert facts["leave_cgroup"] == "denied" and facts["raise_cpu_shares"] == "denied", facts
        assert not Path(limits["cgroup"]).exists()  # removed with the run
    finally:
        shutil.rmtree(top, ignore_errors=True)
