"""Fault tolerance of the local engine: killed roles restart, checkpoints resume, corrupt ones are skipped."""
import logging
import os
import signal

import pytest
import torch

from helpers import EXAMPLES, read_summary, run_tianji, wait_for
from tianji.runtime import checkpoint

PPO = str(EXAMPLES / "cartpole-ppo.yaml")


def pid_of(role: str, run_dir) -> int | None:
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if (str(run_dir).encode() in b" ".join(cmd) and b"--role" in cmd
                and cmd[cmd.index(b"--role") + 1] == role.encode()):
            return int(d)
    return None


def test_truncated_newest_checkpoint_is_reported_and_previous_used(tmp_path, caplog):
    d = tmp_path / "ck"
    for v in (10, 20):
        checkpoint.save(d, v, {"model": {"w": torch.ones(3) * v}, "policy_version": v}, keep=3)
    newest = checkpoint.list_checkpoints(d)[-1]
    newest.write_bytes(newest.read_bytes()[:40])
    with caplog.at_level(logging.ERROR, logger="tianji"):
        path, state = checkpoint.load_latest(d)
    assert state["policy_version"] == 10 and path.name.endswith("000000000010.pt")
    assert "unreadable" in caplog.text and newest.name in caplog.text


def test_checkpoints_keep_last_k_and_refuse_pickled_objects(tmp_path):
    d = tmp_path / "ck"
    for v in range(5):
        checkpoint.save(d, v, {"model": {}, "policy_version": v}, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(d)] == ["ckpt-000000000003.pt", "ckpt-000000000004.pt"]
    evil = d / "ckpt-000000000009.pt"
    torch.save({"model": {}, "policy_version": 9, "x": logging.getLogger("x")}, evil)  # needs arbitrary unpickling
    assert checkpoint.load_latest(d)[1]["policy_version"] == 4


@pytest.mark.slow
def test_killed_actor_is_restarted_and_training_reaches_target(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.envFrames=500000")
    run.wait_for_frames(10000)
    victim = pid_of("actor", run.run_dir)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: pid_of("actor", run.run_dir) not in (None, victim), 60, "the actor to come back")
    run.wait(timeout=600)
    s = run.summary()
    assert s["restarts"]["actor"] >= 1, s
    assert s["reached_target"] and s["exit_reason"] == "target", s


@pytest.mark.slow
def test_killed_learner_resumes_from_its_checkpoint(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.envFrames=500000", "--set", "spec.checkpoint.intervalSeconds=2")
    ckdir = run.run_dir / "checkpoints" / "0-0"
    wait_for(lambda: checkpoint.list_checkpoints(ckdir), 120, "a first checkpoint")
    run.wait_for_frames(20000)
    victim = pid_of("learner", run.run_dir)
    os.kill(victim, signal.SIGKILL)
    ck_version = int(checkpoint.list_checkpoints(ckdir)[-1].name[5:17])
    run.wait(timeout=600)
    s = run.summary()
    log = (run.run_dir / "logs" / "learner-0-0.log").read_text()
    assert s["restarts"]["learner"] >= 1, s
    assert "resumed from" in log
    resumed_at = int(log.split("at policy_version ")[1].split()[0])
    assert resumed_at >= ck_version
    assert s["policy_version"] >= resumed_at
    assert s["reached_target"], s


def test_resume_continues_counting_frames_and_versions(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000")
    run.wait_for_frames(15000)
    run.interrupt()
    first = run.summary()
    assert first["exit_reason"] == "interrupted"
    r = run_tianji("run", PPO, "--run-dir", str(run.run_dir), timeout=60)
    assert r.returncode == 2 and "--resume" in r.stderr  # an existing run is never silently overwritten
    target = first["env_frames"] + 10000
    r = run_tianji("run", "--resume", str(run.run_dir), "--quiet", "--set", f"spec.stop.envFrames={target}",
                   "--set", "spec.stop.meanReturn=100000", timeout=300)
    second = read_summary(run.run_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert second["exit_reason"] == "frames" and second["env_frames"] >= target
    assert second["resumed_from"]["env_frames"] == first["env_frames"]
    log = (run.run_dir / "logs" / "learner-0-0.log").read_text()
    assert "resumed from" in log
    assert second["policy_version"] >= first["policy_version"] > 0
