"""How a local run ends, and what it says: user code checked before anything starts, a run
that did none of its work is a failure naming the process and its error, and the target's
crossing is one record, the same in metrics.jsonl and summary.json, kept across --resume."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
import zmq

from helpers import EXAMPLES, ROOT, DeadProc, run_tianji
from tianji.control.contracts.rolereport import build_report
from tianji.control.spec import SpecError, load_job
from tianji.local import launcher as L
from tianji.local import resume as resume_
from tianji.local import supervisor
from tianji.local.runfiles import MetricsLog
from tianji.runtime.wire import encode

PPO = EXAMPLES / "cartpole-ppo.yaml"
CUSTOM = EXAMPLES / "custom-env"

USER_MODELS = '''\
import sys

import gymnasium as gym
from torch import nn


class Raises(nn.Module):
    def __init__(self, observation_space, action_space, config):
        super().__init__()
        raise RuntimeError("width must be even")


class BadForward(nn.Module):
    def __init__(self, observation_space, action_space, config):
        super().__init__()
        self.l = nn.Linear(observation_space.shape[0], action_space.n)

    def forward(self, obs):
        raise ValueError("forward is not written yet")

    def logits(self, obs):
        return self.l(obs)


class LearnerOnly(nn.Module):
    """Builds in `tianji run`'s check (no --role there); fails in the learner process."""

    def __init__(self, observation_space, action_space, config):
        super().__init__()
        if "--role" in sys.argv and sys.argv[sys.argv.index("--role") + 1] == "learner":
            raise RuntimeError("simulated learner fault")
        self.pi = nn.Linear(observation_space.shape[0], action_space.n)
        self.v = nn.Linear(observation_space.shape[0], 1)

    def forward(self, obs):
        return self.pi(obs.float()), self.v(obs.float())[:, 0]

    def logits(self, obs):
        return self.pi(obs.float())


class EnvRaises(gym.Env):
    def __init__(self, **kwargs):
        raise OSError("no simulator licence")


def wrapper_raises(env):
    raise KeyError("frame_skip")
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A user package `usercode_run` importable here and in the processes `tianji run` starts."""
    pkg = tmp_path / "pkgs" / "usercode_run"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.delitem(sys.modules, "usercode_run", raising=False)
    monkeypatch.setenv("PYTHONPATH", f"{pkg.parent}:{CUSTOM}:{ROOT / 'worker'}")
    return "usercode_run"


def manifest(tmp_path: Path, *sets: tuple[str, object]) -> Path:
    doc = yaml.safe_load(PPO.read_text())
    for path, value in sets:
        node = doc
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


# ----------------------------------------------------------------- entry points, before anything starts
@pytest.mark.parametrize("entry_point, says", [
    ("usercode_run:Missing", "spec.model.entryPoint: 'usercode_run:Missing': module 'usercode_run' has no "
                             "attribute 'Missing'"),
    ("usercode_run.nothere:Net", "spec.model.entryPoint: 'usercode_run.nothere:Net': cannot import "
                                 "'usercode_run.nothere': ModuleNotFoundError"),
    ("usercode_run:Raises", "spec.model.entryPoint: usercode_run:Raises(observation_space, action_space, config) "
                            "failed: RuntimeError: width must be even"),
])
def test_tianji_run_refuses_a_broken_model_naming_the_field_and_the_exception(tmp_path, user_pkg, entry_point, says):
    job = manifest(tmp_path, ("spec.model.entryPoint", entry_point), ("spec.model.imports", [user_pkg]))
    run_dir = tmp_path / "run"
    r = run_tianji("run", str(job), "--run-dir", str(run_dir), "--quiet", timeout=180)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"tianji: invalid job spec: {job}: {says}") and r.stderr.count("\n") == 1, r.stderr
    assert not run_dir.exists()  # nothing started


@pytest.mark.parametrize("sets, says", [
    ((("spec.model.entryPoint", "usercode_run:BadForward"),),
     "spec.model.entryPoint: usercode_run:BadForward: a forward pass on zeros failed: ValueError: forward is not "
     "written yet"),
    ((("spec.env.id", "usercode_run:EnvRaises"), ("spec.env.spaces", {"observation": {"shape": [4]},
                                                                      "action": {"n": 2}})),
     "spec.env.id: 'usercode_run:EnvRaises' cannot be used: OSError: no simulator licence"),
    ((("spec.env.wrappers", [{"entryPoint": "usercode_run:wrapper_raises"}]),),
     "spec.env.wrappers[0].entryPoint: 'usercode_run:wrapper_raises' cannot wrap the env: KeyError: 'frame_skip'"),
])
def test_every_entry_point_is_built_before_launch(tmp_path, user_pkg, sets, says):
    """The env (made from its entry point), each wrapper and the model, each naming its field."""
    from tianji.local.preflight import check_entry_points

    job = load_job(manifest(tmp_path, *sets, ("spec.model.imports", [user_pkg]),
                            ("spec.env.imports", [user_pkg])))
    with pytest.raises(SpecError) as e:
        check_entry_points(job, "job.yaml")
    assert str(e.value) == f"job.yaml: {says}", e.value


def test_a_good_user_model_passes_the_check(tmp_path, user_pkg):
    from tianji.local.preflight import check_entry_points

    job = load_job(manifest(tmp_path, ("spec.model.entryPoint", "usercode_run:LearnerOnly"),
                            ("spec.model.imports", [user_pkg])))
    assert check_entry_points(job, "job.yaml").n_actions == 2


# ----------------------------------------------------------------- a run that did none of its work
def crash(lt: L.Launcher, c: supervisor.Child, now: float, log: Path, error: str) -> None:
    """One incarnation of `c` that logged `error` and exited 1."""
    with open(log, "a") as f:
        f.write(f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{error}\n")
    c.proc, c.restart_at, c.started_at, c.last_report = DeadProc(), None, now - 0.1, None
    c.log = SimpleNamespace(name=str(log))
    lt._supervise(now)


def test_a_spent_restart_budget_names_the_process_and_its_error(launcher, tmp_path):
    c = next(x for x in launcher.children if x.role == "learner")
    launcher.children = [c]
    now = time.monotonic()
    for i in range(supervisor.MAX_RESTARTS):
        crash(launcher, c, now + i, tmp_path / "learner.log", "RuntimeError: simulated learner fault")
    assert launcher.error == (f"learner-0-0 failed {supervisor.MAX_RESTARTS} times in a row (last: exit code 1): "
                              f"RuntimeError: simulated learner fault; see {tmp_path / 'learner.log'}")
    s = launcher.summary(launcher._exit_reason(now), 130.0)
    line = L.ended_line("cartpole-ppo", "error", 130.0, s, "summary.json")
    assert line.startswith(f"tianji: cartpole-ppo failed after 130.0s: {launcher.error} (0 frames, no episode "
                           "finished)"), line
    assert s["mean_return"] is None  # no episodes: null, as in metrics.jsonl, not 0.0


def test_a_budget_spent_by_a_process_that_never_started_is_a_failure(launcher, tmp_path):
    """--max-seconds with a crash-looping learner: not `seconds` with 0 frames and exit 0."""
    everyone = launcher.children
    learner = next(x for x in everyone if x.role == "learner")
    launcher.children = [learner]
    crash(launcher, learner, time.monotonic(), tmp_path / "learner.log", "RuntimeError: simulated learner fault")
    launcher.children = everyone
    for c in launcher.children:
        c.reported = c is not learner and c.role != "actor"
        c.log = c.log or SimpleNamespace(name=f"{c.name}.log")
    assert launcher._verdict("seconds") == "error"
    assert launcher.error == ("learner-0-0 never started: it exited 1 time(s) (last: exit code 1): RuntimeError: "
                              f"simulated learner fault; see {tmp_path / 'learner.log'} "
                              "(nor did actor-0-0, actor-0-1)")
    for c in launcher.children:  # everyone reported, but not one env frame
        c.reported = True
    launcher.error = None
    assert launcher._verdict("frames") == "error" and "produced no env frame" in launcher.error


def test_a_budget_spent_without_one_trained_sample_is_a_failure(launcher, monkeypatch):
    """Every process reported and the actors produced frames, but every batch failed in the
    learner (a groupSync allreduce learner did, 2026-11-28): it trained nothing, so not exit 0."""
    for c in launcher.children:
        c.reported = True
        c.log = c.log or SimpleNamespace(name=f"{c.name}.log")
    totals = {"env_frames": launcher.frames_at_start + 7680.0, "received": 7680.0,
              "consumed": float(launcher.consumed_at_start), "train_steps": 0.0, "bytes_sent": 0.0}
    monkeypatch.setattr(launcher.acc, "totals", lambda group=None: dict(totals))
    assert launcher._verdict("seconds") == "error"
    assert launcher.error.startswith("the learners trained on no sample in ") and "7680 env frames" in launcher.error
    assert launcher.error.endswith("; see learner-0-0.log"), launcher.error
    launcher.error = None
    totals["consumed"] += 256.0  # one batch trained: the budget's end is a normal end
    assert launcher._verdict("seconds") == "seconds" and launcher.error is None


@pytest.mark.slow
def test_a_crash_looping_learner_under_max_seconds_exits_non_zero_saying_why(tmp_path, user_pkg):
    job = manifest(tmp_path, ("spec.model.entryPoint", "usercode_run:LearnerOnly"),
                   ("spec.model.imports", [user_pkg]))
    run_dir = tmp_path / "run"
    r = run_tianji("run", str(job), "--run-dir", str(run_dir), "--quiet", "--max-seconds", "40", timeout=300)
    s = json.loads((run_dir / "summary.json").read_text())
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and s["exit_reason"] == "error", (r.returncode, r.stderr[-3000:])
    assert last.startswith("tianji: cartpole-ppo failed after ") and "learner-0-0 never started" in last, last
    assert "RuntimeError: simulated learner fault" in last and s["error"] in last, last


# ----------------------------------------------------------------- the target's crossing
def report(job: str, role: str, pid: int, seq: int, *, frames: float = 0.0, returns=(), version: int = 0,
           t0: float = 0.0) -> dict:
    """`returns` finished 0.05 s apart from `t0` on."""
    now = time.time()
    extra = {"version": version, "checkpoint": f"ckpt-{version:06d}.pt"} if role == "learner" else {}
    return build_report(job=job, role=role, group=0, index=0, incarnation=f"{role}-{pid}", pid=pid,
                        started=now - 60, seq=seq, time=now, final=False,
                        snapshot={"counts": {"env_frames_total": frames}, "reasons": {}, "gauges": {}, "lag": {}},
                        episodes_total=len(returns), recent=[(t0 + 0.05 * i, r) for i, r in enumerate(returns)],
                        extra=extra)


def run_reports(lt: L.Launcher, batches: list[list[tuple[str, dict]]]) -> None:
    """Send each batch of (sender, report) to the launcher's report socket at once; drain until counted."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        pull.bind(lt.report_addr)
        push.connect(lt.report_addr)
        for batch in batches:
            for sender, meta in batch:
                push.send_multipart(encode("report", lt.job.name, sender, meta["seq"], 0, None, meta))
            time.sleep(0.2)
            for _ in range(len(batch) + 1):  # the crossing ends a drain early: the rest waits its turn
                lt._drain(pull, 0.2)
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        ctx.term()


def crossing_run(lt: L.Launcher, pids: tuple[int, int], t0: float) -> None:
    """A trained learner, then 100 episodes of 120 (the target is 100); `pids`: this launch's
    learner and actor. The actors' mean only triggers the check of the saved policy."""
    job = lt.job.name
    learner = next(c for c in lt.children if c.role == "learner")
    actor = next(c for c in lt.children if c.role == "actor")
    learner.pids, actor.pids = {pids[0]}, {pids[1]}
    run_reports(lt, [[("learner-0-0", report(job, "learner", pids[0], 1, version=3))],
                     [("actor-0-0", report(job, "actor", pids[1], 1, frames=20_000, returns=[120.0] * 100, t0=t0))]])


def confirm(lt: L.Launcher) -> None:
    """What the main loop does once the confirming evaluation of the saved policy has passed
    (local/targetcheck.py): the crossing."""
    lt.target_check.close()  # the evaluation the trigger started is not awaited here
    lt.target_check.passed = {"checkpoint": "ckpt-000000000003.pt", "policy_version": 3, "mean_return": 130.0}
    lt._cross_target(time.monotonic())


def test_the_target_is_one_record_in_metrics_and_summary_and_resuming_keeps_it(tmp_path, monkeypatch):
    job = load_job(PPO, ["spec.stop.meanReturn=100", "spec.network.encryption=none"])  # reports from this test
    lt = L.Launcher(job, tmp_path / "run", progress=False)
    with MetricsLog(lt.run_dir / "metrics.jsonl") as lt.metrics:
        crossing_run(lt, (101, 102), time.time() - 100)
        time.sleep(0.2)
        confirm(lt)
    assert lt._exit_reason(time.monotonic()) == "target"
    s = lt.summary(lt._verdict("target"), 30.0)
    records = [json.loads(x) for x in (lt.run_dir / "metrics.jsonl").read_text().splitlines()]
    (rec,) = [r for r in records if r.get("stop") == "target"]
    assert s["reached_target"] and rec["mean_return"] == s["mean_return_at_target"] == 120.0, (rec, s)
    assert (rec["t"], rec["env_frames"]) == (s["seconds_to_target"], s["frames_to_target"]) == (rec["t"], 20_000)
    lt._export()
    (lt.run_dir / "summary.json").write_text(json.dumps(s))

    monkeypatch.setattr(resume_, "missing_checkpoints", lambda job, run_dir: [])  # the learner resumes
    again = L.Launcher(load_job(lt.run_dir / "job.yaml"), lt.run_dir, progress=False, resume=True)
    with MetricsLog(lt.run_dir / "metrics.jsonl") as again.metrics:
        time.sleep(0.5)  # later on the clock: a new crossing would differ
        crossing_run(again, (201, 202), time.time() - 20)
        confirm(again)
    resumed = again.summary(again._verdict(again._exit_reason(time.monotonic())), 5.0)
    assert resumed["exit_reason"] == "target"
    for k in ("seconds_to_target", "frames_to_target", "mean_return_at_target"):
        assert resumed[k] == s[k], (k, resumed[k], s[k])
    records = [json.loads(x) for x in (lt.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["t"] for r in records if r.get("stop") == "target"] == [rec["t"]]  # no second crossing


def test_tianji_check_builds_everything_without_running_and_prints_the_spaces(tmp_path, user_pkg):
    """The check `tianji run` makes, on its own: for a Kubernetes job, where the image's packages are."""
    r = run_tianji("check", str(CUSTOM / "reach-goal-ppo.yaml"), timeout=180)
    assert r.returncode == 0, r.stderr
    assert '  spaces: {"observation": {"shape": [2], "dtype": "float32"}, "action": {"n": 3}}' in r.stdout, r.stdout
    job = manifest(tmp_path, ("spec.model.entryPoint", "usercode_run:Raises"), ("spec.model.imports", [user_pkg]))
    r = run_tianji("check", str(job), timeout=180)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    says = f"tianji: invalid job spec: {job}: spec.model.entryPoint: usercode_run:Raises("
    assert r.stderr.startswith(says), r.stderr


def test_a_box2d_env_without_box2d_points_at_the_extra():
    """LunarLander needs Box2D, which `make install` leaves out: the refusal names TianJi's extra."""
    import re

    from tianji.control.spec import EnvConfig
    from tianji.envs import check_env_spec

    extras = re.search(r"^box2d = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)
    assert extras and '"gymnasium[box2d]>=1.0"' in extras.group(1)
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401
        pytest.skip("Box2D is installed here")
    except ImportError:
        pass
    with pytest.raises(SpecError) as e:
        check_env_spec(EnvConfig(id="LunarLander-v3"), "job.yaml", "ppo")
    assert str(e.value) == ("job.yaml: spec.env.id: 'LunarLander-v3' cannot be used: DependencyNotInstalled: Box2D "
                            "is not installed: install TianJi's box2d extra, pip install -e '.[box2d]'")
