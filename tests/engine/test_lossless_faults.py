"""Faults that lose nothing: a full disk, a SIGKILLed launcher, unusable checkpoints."""
import errno
import json
import os
import signal

import pytest

from helpers import EXAMPLES, read_summary, run_tianji, wait_for, worker_pids
from tianji.control.spec import load_job
from tianji.local import launcher as L
from tianji.local import runfiles
from tianji.runtime import atomicfile, checkpoint

PPO = str(EXAMPLES / "cartpole-ppo.yaml")


def enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_metrics_survive_a_full_disk_in_order_and_without_half_lines(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    ap = runfiles.MetricsLog(path)
    ap.append('{"t": 1}\n')
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd, data):  # writes a few bytes, then the disk is full
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:3]))
        enospc()

    monkeypatch.setattr(runfiles.os, "write", half_then_full)
    ap.append('{"t": 2}\n')
    ap.append('{"t": 3}\n')
    assert path.read_text() == '{"t": 1}\n' and len(ap.pending) == 2  # the half line was cut off again
    monkeypatch.setattr(runfiles.os, "write", real_write)
    ap.append('{"t": 4}\n')
    assert [json.loads(x)["t"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_summary_goes_to_a_fallback_when_the_run_dir_stays_full(tmp_path, monkeypatch, capsys):
    lt = L.Launcher(load_job(PPO), tmp_path / "run", progress=False)
    real = atomicfile.atomic_write_json

    def full_run_dir(path, doc):
        if str(path).startswith(str(tmp_path / "run")):
            enospc()
        return real(path, doc)

    monkeypatch.setattr(atomicfile, "atomic_write_json", full_run_dir)
    monkeypatch.setattr(runfiles, "SUMMARY_RETRY_S", 0.2)
    monkeypatch.setattr(runfiles.tempfile, "gettempdir", lambda: str(tmp_path))
    lt._export()  # accounting.json: a warning, not a crash
    where = lt._write_summary(lt.summary("seconds", 1.0))
    assert where.parent == tmp_path and json.loads(where.read_text())["exit_reason"] == "seconds"
    assert "No space left" in json.loads(where.read_text())["error"]
    assert "summary written to" in capsys.readouterr().err
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_a_failed_checkpoint_write_leaves_no_temp_file(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", enospc)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 5, {"model": {}, "policy_version": 5}, keep=2)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / ".tmp-123-ckpt-000000000001.pt").write_bytes(b"half")  # a killed writer's
    assert checkpoint.remove_temp_files(tmp_path) and list(tmp_path.iterdir()) == []


def test_resume_after_sigkill_continues_time_frames_versions_and_cleans_sockets(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000", "--set", "spec.checkpoint.intervalSeconds=2")
    run.wait_for_frames(20000)
    wait_for(lambda: checkpoint.list_checkpoints(run.run_dir / "checkpoints" / "0-0"), 60, "a checkpoint")
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    wait_for(lambda: not worker_pids(run.run_dir), 30, "the workers to go")
    assert not (run.run_dir / "summary.json").exists()
    first = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (run.run_dir / "sock" / "launcher-report").exists()  # what a killed launcher leaves
    target = first[-1]["env_frames"] + 8000
    r = run_tianji("run", "--resume", str(run.run_dir), "--quiet", "--set", f"spec.stop.envFrames={target}",
                   "--set", "spec.stop.meanReturn=100000", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_summary(run.run_dir)
    rows = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    second = rows[len(first):]
    assert second[0]["t"] >= first[-1]["t"] and all(b["t"] >= a["t"] for a, b in zip(rows, rows[1:]))
    assert second[0]["env_frames"] >= first[-1]["env_frames"] and s["env_frames"] >= target
    assert min(x["policy_version"] for x in second) > 0  # versions carry on, no drop to 0
    assert s["wall_seconds"] >= first[-1]["t"] and s["episodes"] >= first[-1]["episodes"]
    assert not (run.run_dir / "sock").exists()
    assert "warnings" not in s


def test_no_usable_checkpoint_is_said_on_the_console_and_in_the_summary(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000", "--set", "spec.checkpoint.intervalSeconds=2")
    run.wait_for_frames(5000)
    assert run.interrupt() == 130
    for p in checkpoint.list_checkpoints(run.run_dir / "checkpoints" / "0-0"):
        p.write_bytes(b"garbage")
    r = run_tianji("run", "--resume", str(run.run_dir), "--quiet", "--max-seconds", "3", timeout=300)
    assert "learner-0-0: no usable checkpoint, starting from scratch" in r.stderr
    assert read_summary(run.run_dir)["warnings"] == ["learner-0-0: no usable checkpoint, starting from scratch"]
