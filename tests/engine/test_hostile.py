"""Hostile input at a live run: no message crashes a role, poisons the model or forges the launcher's
counts. Real roles over real sockets (`tianji run`, tests/conftest.py's running_tianji)."""
import collections
import contextlib
import random
import time

import pytest
import torch
import zmq

import hostile
from helpers import EXAMPLES, as_job_client, ipc, last_record, wait_for
from tianji.runtime import checkpoint

PPO = str(EXAMPLES / "cartpole-ppo.yaml")


def finite_checkpoints(run_dir) -> int:
    paths = checkpoint.list_checkpoints(run_dir / "checkpoints" / "0-0")
    assert paths, "no checkpoint written"
    for p in paths:
        st = checkpoint.load(p)
        for k, t in st["model"].items():
            assert torch.isfinite(t).all(), f"{p.name}: {k} is not finite"
    return len(paths)


@contextlib.contextmanager
def attacker(run):
    """send(msgs) pushes (target, frames, reason) triples and returns the rejects they must cause.
    The sockets stay open until the block ends: a closed connection discards what its peer had not
    read yet (ZeroMQ), which would be a message neither rejected nor accepted."""
    ctx = zmq.Context()

    def send(msgs) -> collections.Counter:
        want = collections.Counter()
        for target, frames, reason in msgs:
            socks[target].send_multipart(frames)
            want[reason] += 1
        return want

    try:
        socks = hostile.sockets(ctx, run.run_dir)
        yield send
    finally:  # every socket of ctx, also those of a half-made set: a leaked context can hang at GC
        ctx.destroy(linger=0)


def wait_counted(run, n: int, timeout: float = 120) -> None:
    wait_for(lambda: (last_record(run.run_dir) or {}).get("rejected", 0) >= n, timeout,
             f"{n} rejected messages to be counted")


def test_each_hostile_class_is_a_counted_reject_and_nothing_restarts(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000", "--set", "spec.stop.seconds=300",
                         "--set", "spec.stop.envFrames=100000000",
                         "--set", "spec.checkpoint.intervalSeconds=2")
    run.wait_for_frames(0)
    with attacker(run) as send:
        want = send([(t, f, r) for _, t, f, r in hostile.classes() * 3])
        wait_counted(run, sum(want.values()))
    # a 12 MB message is refused by ZeroMQ itself (MAXMSGSIZE) before it is allocated: not counted
    big = [hostile.msgpack.packb(hostile.header("fragment", arr=[["obs", "uint8", [12 << 20]]])), b"\0" * (12 << 20)]
    ctx = zmq.Context()
    s = as_job_client(ctx.socket(zmq.PUSH), run.run_dir)
    s.connect(ipc(run.run_dir, "buffer-0-0-fragments"))
    s.send_multipart(big)
    s.close(linger=2000)
    ctx.term()
    frames = run.frames()
    run.wait_for_frames(frames + 10000)  # and training goes on
    assert run.interrupt() == 130
    s = run.summary()
    assert s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}, s["restarts"]
    assert s["rejected_by_reason"] == dict(want), (s["rejected_by_reason"], dict(want))
    assert s["throughput"]["consumed_sps"] > 0 and s["policy_version"] > 0
    assert "nonfinite" not in s["dropped_samples"]
    finite_checkpoints(run.run_dir)


@pytest.mark.slow
def test_fuzz_thousands_of_mutated_messages_at_a_live_run(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.envFrames=400000", "--set", "spec.stop.seconds=600",
                         "--set", "spec.checkpoint.intervalSeconds=5")
    # The buffers bound versions by what their learner announced: fuzz once it has announced one, so
    # that every mutation's reason is determined by the message alone.
    wait_for(lambda: ((last_record(run.run_dir) or {}).get("policy_version") or 0) >= 1, 120,
             "the learner's first update")
    rng = random.Random(11)
    want = collections.Counter()
    with attacker(run) as send:
        for _ in range(6):  # bursts spread over the run
            want += send([hostile.fuzz(rng) for _ in range(500)])
            time.sleep(0.3)
        wait_counted(run, sum(want.values()), 300)
    assert run.wait(timeout=600) == 0, run.output()[-3000:]
    s = run.summary()
    assert sum(want.values()) == 3000
    assert s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}, s["restarts"]
    assert s["rejected_by_reason"] == dict(want), (s["rejected_by_reason"], dict(want))
    assert s["reached_target"] and s["exit_reason"] == "target", s
    finite_checkpoints(run.run_dir)
