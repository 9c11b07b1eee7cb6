"""The confirming evaluation's process is started ahead (local/targetcheck.py): once the learner
has trained, it waits, imported, for the one checkpoint it evaluates; a check then costs the
evaluation, and a process lost while waiting fails that check only."""
from __future__ import annotations

import hashlib
import json
import os
import time
from types import SimpleNamespace

import pytest
import torch

from kube.fakes import worker_report
from tianji.control.contracts.rolereport import parse_report
from tianji.control.spec import dump_job, parse_job
from tianji.local.targetcheck import Evaluation, TargetCheck, _result
from tianji.runtime import checkpoint

VERSION = 7


def _job(target):
    stop = {"meanReturn": target} if target is not None else {"seconds": 30}
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "tc"},
                      "spec": {"algorithm": {"name": "dqn"}, "stop": stop}})


def _left_policy(run_dir, job) -> str:
    """A CartPole Q-network that always pushes left (about 9.4 a episode), saved as a learner saves it;
    its file name. The job manifest inside it is the job's."""
    from tianji.algos.models import build_model
    from tianji.envs import probe_env

    model = build_model("dqn", job.spec.model, probe_env(job.spec.env), job.spec.env.seed)
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([1.0, 0.0]))
    path = checkpoint.save(run_dir / "checkpoints" / "0-0", VERSION,
                           {"model": model.state_dict(), "policy_version": VERSION, "manifest": dump_job(job)}, keep=1)
    return path.name


def _acc(job, name=None, digest=None, version=VERSION):
    rep = worker_report(job.name, "learner", 0, 0, version=version)
    if name:
        rep["extra"].update(checkpoint=name, checkpoint_sha256=digest)
    return SimpleNamespace(procs={("learner", 0, 0): parse_report(rep, job.name)}, mean_episode_length=lambda: 9.0)


def _run_dir(tmp_path):
    (tmp_path / "checkpoints" / "0-0").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    return tmp_path


def _with_policy(tmp_path):
    """A run dir holding the always-left policy: (run dir, job, checkpoint name, its SHA-256)."""
    rd = _run_dir(tmp_path)
    job = _job(5.0)
    name = _left_policy(rd, job)
    return rd, job, name, hashlib.sha256((rd / "checkpoints" / "0-0" / name).read_bytes()).hexdigest()


def _until(tc, acc, timeout=120.0):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        got = tc.poll(time.monotonic(), acc)
        if got is not None or not tc.busy:
            return got
        time.sleep(0.05)
    raise AssertionError("the check did not end")


def test_a_warm_evaluation_confirms_the_saved_policy(tmp_path):
    rd, job, name, digest = _with_policy(tmp_path)
    tc = TargetCheck(job, rd, dict(os.environ))
    try:
        tc.poll(0.0, _acc(job, version=0))
        assert tc.spare is None  # nothing trained yet: not in the start-up rush
        tc.poll(0.0, _acc(job))
        spare = tc.spare
        assert spare is not None and spare.proc.poll() is None  # started ahead, waiting
        time.sleep(3.0)  # it imports while training would go on
        tc.trigger(time.monotonic(), VERSION, [])
        t = time.monotonic()
        passed = _until(tc, _acc(job, name, digest))
        took = time.monotonic() - t
        assert passed is not None and tc.passed == passed, tc.checks
        assert passed["checkpoint"] == name and passed["policy_version"] == VERSION and passed["episodes"] == 100
        assert 8.0 <= passed["mean_return"] <= 11.0, passed  # always left: the pole falls in about 9 steps
        assert 0 < passed["seconds"] <= took + 0.5, passed  # the trigger to the verdict
        assert spare.proc.returncode == 0 and tc.spare is None and tc.running is None
        tc.poll(time.monotonic(), _acc(job))
        assert tc.spare is None  # the target is confirmed: no next check
        print(f"check after warm start: {took:.2f} s")
    finally:
        tc.close()


def test_an_evaluation_process_lost_while_waiting_fails_that_check_only(tmp_path, capsys):
    rd, job, name, digest = _with_policy(tmp_path)
    tc = TargetCheck(job, rd, dict(os.environ))
    try:
        tc.poll(0.0, _acc(job))
        lost = tc.spare
        lost.proc.kill()
        lost.proc.wait()
        tc.trigger(0.0, VERSION, [])
        assert tc.poll(1.0, _acc(job, name, digest)) is None and not tc.busy and tc.checks == []
        assert "the evaluation process is gone" in capsys.readouterr().err
        tc.poll(2.0, _acc(job))
        assert tc.spare is not None and tc.spare is not lost  # the next check gets a new one
        assert tc.ready(20.0, VERSION + 1)
    finally:
        tc.close()
    assert lost.proc.returncode is not None


def test_a_job_without_a_target_starts_no_evaluation(tmp_path):
    job = _job(None)
    tc = TargetCheck(job, _run_dir(tmp_path), dict(os.environ))
    tc.poll(0.0, _acc(job))
    assert tc.spare is None
    tc.close()


@pytest.mark.parametrize("request_", [{"episodes": "100", "seed": 1, "step_cap": 1000},
                                      {"episodes": 0, "seed": 1, "step_cap": 1000},
                                      {"episodes": 10, "seed": 1, "step_cap": 1000, "epsilon": True},
                                      {"episodes": 10, "seed": 1, "step_cap": 1000}, [1, 2]])
def test_the_evaluation_process_refuses_a_bad_request(tmp_path, request_):
    """Its arguments are data, checked: a wrong type, no checkpoint, not an object: no result."""
    with open(tmp_path / "log", "ab") as log:
        ev = Evaluation(dict(os.environ), log)
        try:
            ev.sock.sendall(json.dumps(request_).encode())
            ev.sock.close()
            assert ev.proc.wait(60) != 0
            out = ev.proc.stdout.read()
        finally:
            ev.close()
    with pytest.raises(ValueError):
        _result(out, ev.proc.returncode)
    assert b"Error" in (tmp_path / "log").read_bytes()
