"""`tianji run` end to end: bad messages on a live socket, Ctrl-C, kill -9, and agents that learn."""
import pickle
import signal
import time

import msgpack
import numpy as np
import pytest
import zmq

from helpers import EXAMPLES, as_job_client, ipc, read_summary, run_tianji, wait_for, worker_pids
from tianji.runtime.wire import encode

PPO = str(EXAMPLES / "cartpole-ppo.yaml")
DQN = str(EXAMPLES / "cartpole-dqn.yaml")


def bad_messages():
    good_obs = np.zeros((32, 4, 4), np.float32)
    truncated = encode("fragment", "cartpole-ppo", "evil", 0, 0, {"obs": good_obs})
    truncated[1] = bytes(truncated[1])[:100]
    hdr = {"k": "fragment", "v": 1, "job": "cartpole-ppo", "from": "evil", "seq": 0, "pv": 0,
           "arr": [["obs", "float32", [1 << 20, 1 << 10]]], "meta": {}}
    oversized = [msgpack.packb(hdr), b"\0" * 16]
    wrong_shape = encode("fragment", "cartpole-ppo", "evil", 0, 0, {"obs": np.zeros((3, 3), np.float32)})
    return {
        "malformed": [b"\x93not-msgpack\xc1"],
        "truncated": truncated,
        "oversized": oversized,
        "pickled": [pickle.dumps({"k": "fragment", "obs": good_obs})],
        "wrong_job": encode("fragment", "someone-else", "evil", 0, 0, {"obs": good_obs}),
        "wrong_fields": wrong_shape,
    }


def test_bad_messages_to_live_buffer_are_rejected_and_training_continues(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.envFrames=30000", "--set", "spec.stop.meanReturn=100000",
                         "--set", "spec.stop.seconds=240")
    run.wait_for_frames(0)
    ctx = zmq.Context()
    s = as_job_client(ctx.socket(zmq.PUSH), run.run_dir)
    s.connect(ipc(run.run_dir, "buffer-0-0-fragments"))
    msgs = bad_messages()
    for frames in msgs.values():
        s.send_multipart(frames)
    time.sleep(0.5)
    s.close(linger=1000)
    ctx.term()
    run.wait(timeout=300)
    s = run.summary()
    assert s["exit_reason"] == "frames", s
    assert s["rejected_messages"] >= len(msgs), s
    assert {"pickle", "header", "shape", "size", "job"} <= set(s["rejected_by_reason"]), s["rejected_by_reason"]
    assert s["env_frames"] >= 30000 and s["throughput"]["consumed_sps"] > 0


def test_sigint_stops_every_process_and_writes_summary(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.seconds=300")
    run.wait_for_frames(0)
    assert len(worker_pids(run.run_dir)) == 4  # 2 actors, 1 buffer, 1 learner
    assert run.interrupt() == 130
    s = run.summary()
    assert s["exit_reason"] == "interrupted" and s["env_frames"] > 0
    assert worker_pids(run.run_dir) == []
    assert not (run.run_dir / "sock").exists()  # no leftover socket files
    assert list((run.run_dir / "checkpoints" / "0-0").glob("ckpt-*.pt"))  # the learner saved on the way out


def test_a_killed_launcher_leaves_no_worker_behind(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.seconds=300")
    wait_for(lambda: len(worker_pids(run.run_dir)) == 4, 60, "the 4 workers to start")
    # SIGKILL gives the launcher no chance to stop anyone: the workers go by PR_SET_PDEATHSIG.
    assert run.stop() == []
    assert run.proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_ppo_learns_cartpole_through_tianji_run(tmp_path):
    run = tmp_path / "run"
    r = run_tianji("run", PPO, "--run-dir", str(run), "--quiet", "--set", "spec.stop.envFrames=400000",
                   "--set", "spec.stop.seconds=900", timeout=1000)
    s = read_summary(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert s["processes"]["actors"] >= 2
    assert s["reached_target"] and s["exit_reason"] == "target", s
    assert s["mean_return_at_target"] >= 475 and s["mean_return"] >= 450 and s["env_frames"] <= 400000 + 10000


@pytest.mark.slow
def test_dqn_learns_cartpole_through_tianji_run(tmp_path):
    run = tmp_path / "run"
    r = run_tianji("run", DQN, "--run-dir", str(run), "--quiet", "--set", "spec.stop.meanReturn=300",
                   "--set", "spec.stop.envFrames=400000", "--set", "spec.stop.seconds=900", timeout=1000)
    s = read_summary(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert s["processes"]["actors"] >= 2
    assert s["reached_target"] and s["mean_return_at_target"] >= 300 and s["mean_return"] >= 250, s
