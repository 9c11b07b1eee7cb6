"""Replay snapshots (checkpoint.replaySnapshot): round trip, refusals, limiter preload, buffer resume."""
import logging
import zipfile

import numpy as np
import pytest

from tianji.control.contracts.ratelimit import SampleToInsertRatio
from tianji.control.spec import SpecError, parse_job
from tianji.envs import EnvInfo
from tianji.runtime import replay_snapshot as rs
from tianji.runtime.storage import Replay

INFO = EnvInfo(obs_shape=(4,), obs_dtype="float32", n_actions=2)


def transitions(n, start=0, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n).astype(np.int64), "returns": np.arange(start, start + n, dtype=np.float32),
            "discounts": np.full(n, 0.97, np.float32), "versions": np.arange(n, dtype=np.int64)}


def wrapped_replay():
    r = Replay(10, seed=0)
    r.put(transitions(7, start=0))
    r.put(transitions(6, start=7, seed=1))  # 13 inserted into 10 slots: returns 3..12 survive
    return r


def test_ordered_is_oldest_first_and_a_copy():
    r = wrapped_replay()
    a = rs.ordered(r)
    np.testing.assert_array_equal(a["returns"], np.arange(3, 13, dtype=np.float32))
    a["returns"][:] = -1
    assert r.data["returns"].min() >= 0  # the buffer's ring is untouched by what the writer holds
    assert rs.ordered(Replay(5, 0)) is None


def test_round_trip_restores_contents_and_insertion_order(tmp_path):
    r = wrapped_replay()
    p = rs.write(rs.snapshot_path(tmp_path, 0, 1), rs.ordered(r))
    assert p.name == "replay-g0-b1.npz" and p.parent.name == "checkpoints"
    assert not list(p.parent.glob(".replay-tmp-*"))
    a = rs.load(p, INFO, capacity=10)
    fresh = Replay(10, seed=0)
    assert fresh.put(a) == 10
    for k in rs.FIELDS:
        np.testing.assert_array_equal(fresh.data[k], rs.ordered(r)[k])
    fresh.put(transitions(2, start=13))  # the next inserts overwrite the oldest restored ones
    np.testing.assert_array_equal(np.sort(fresh.data["returns"]), np.arange(5, 15, dtype=np.float32))


def write_raw(tmp_path, arrays, name="replay-g0-b0.npz"):
    p = tmp_path / name
    with open(p, "wb") as f:
        np.savez(f, **arrays)
    return p


def refused(p, match, capacity=100, info=INFO):
    with pytest.raises(rs.SnapshotError, match=match):
        rs.load(p, info, capacity)


@pytest.mark.parametrize("field,value,match", [
    ("returns", np.nan, "non-finite"),
    ("obs", np.inf, "non-finite"),
    ("next_obs", -np.inf, "non-finite"),
    ("actions", 2, "actions outside"),
    ("actions", -1, "actions outside"),
    ("discounts", 1.5, "discounts outside"),
    ("versions", -3, "versions outside"),
])
def test_bad_values_are_refused(tmp_path, field, value, match):
    a = transitions(20)
    a[field][5] = value
    refused(write_raw(tmp_path, a), match)


def test_mismatched_shapes_dtypes_fields_and_sizes_are_refused(tmp_path):
    a = transitions(20)
    refused(write_raw(tmp_path, {**a, "obs": a["obs"][:, :3]}), "obs: float32")  # another env's observations
    refused(write_raw(tmp_path, {**a, "obs": a["obs"].astype(np.float64)}), "obs: float64")
    refused(write_raw(tmp_path, {**a, "actions": a["actions"].astype(np.int32)}), "actions: int32")
    refused(write_raw(tmp_path, {**a, "versions": a["versions"][:19]}), "versions")  # lengths disagree
    refused(write_raw(tmp_path, {k: v for k, v in a.items() if k != "discounts"}), "fields")
    refused(write_raw(tmp_path, {**a, "extra": np.zeros(3)}), "fields")
    refused(write_raw(tmp_path, {k: v[:0] for k, v in a.items()}), "0 transitions")
    # a job with a smaller ring
    refused(write_raw(tmp_path, a), r"20 transitions, expected 1..replayCapacity \(10\)", capacity=10)
    atari = EnvInfo(obs_shape=(4, 84, 84), obs_dtype="uint8", n_actions=6)
    refused(write_raw(tmp_path, a), "obs", info=atari)


def test_pickled_object_arrays_are_never_loaded(tmp_path):
    a = transitions(20)
    a["returns"] = np.array([object()] * 20, dtype=object)
    p = tmp_path / "replay-g0-b0.npz"
    with open(p, "wb") as f:
        np.savez(f, **a)  # savez pickles object arrays; load must refuse them
    refused(p, "unreadable")


def test_truncated_and_corrupted_files_are_refused(tmp_path):
    p = rs.write(tmp_path / "replay-g0-b0.npz", transitions(50))
    data = p.read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    refused(tmp_path / "t.npz", "unreadable")
    flipped = bytearray(data)
    flipped[200] ^= 0xFF  # inside the first member's data: the zip CRC no longer matches
    (tmp_path / "c.npz").write_bytes(bytes(flipped))
    refused(tmp_path / "c.npz", "unreadable")
    (tmp_path / "e.npz").write_bytes(b"")
    refused(tmp_path / "e.npz", "unreadable")
    refused(tmp_path / "missing.npz", "unreadable")


def test_a_lying_member_size_is_refused_before_reading(tmp_path):
    p = tmp_path / "replay-g0-b0.npz"
    a = transitions(20)
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as z:  # small on disk, huge inflated
        for k in a:
            z.writestr(k + ".npy", b"\0" * (50 << 20) if k == "obs" else b"x")
    refused(p, "more than replayCapacity")


def test_a_failed_write_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    p = rs.write(tmp_path / "replay-g0-b0.npz", transitions(5))

    def full_disk(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rs.os, "fsync", full_disk)
    with pytest.raises(OSError):
        rs.write(p, transitions(50))
    assert len(rs.load(p, INFO, 100)["actions"]) == 5
    assert not list(tmp_path.glob(".replay-tmp-*"))


def test_snapshotter_writes_in_a_thread_and_skips_while_busy(tmp_path):
    r = wrapped_replay()
    s = rs.Snapshotter(tmp_path / "replay-g0-b0.npz")
    assert s.start(r)
    s.wait()
    assert s.last["transitions"] == 10 and s.last["error"] is None and s.last["write_s"] > 0
    assert len(rs.load(s.path, INFO, 10)["actions"]) == 10
    assert not rs.Snapshotter(tmp_path / "x.npz").start(Replay(4, 0))  # nothing to write


# ------------------------------------------------------------------ limiter
def test_preload_lets_a_full_snapshot_sample_at_once_and_keeps_the_ratio():
    lim = SampleToInsertRatio.for_replay(8, learning_starts=1000, batch=1024, fragment=64)
    assert not lim.can_sample(1024)
    assert lim.preload(50_000) == 1000  # counted up to learningStarts, no more
    assert lim.sampling and lim.sample(1024)
    # the allowance is error_buffer, as right after a fresh warm-up: the ratio stays bounded
    n = 0
    while lim.sample(1024):
        n += 1
    assert (n + 1) * 1024 <= lim.error_buffer
    assert lim.realised_ratio() is None  # counted from the learning start: no new inserts yet
    with pytest.raises(ValueError):
        lim.preload(1)


def test_preload_below_learning_starts_needs_only_the_rest():
    lim = SampleToInsertRatio.for_replay(8, learning_starts=1000, batch=64, fragment=64)
    lim.preload(900)
    assert not lim.sampling
    lim.insert(64)
    assert not lim.sampling
    lim.insert(64)
    assert lim.sampling and lim.can_sample(64)


# ------------------------------------------------------------------ spec
def job(**ckpt):
    return {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "j"},
            "spec": {"algorithm": {"name": "dqn", "replayCapacity": 1000, "learningStarts": 100},
                     "env": {"id": "CartPole-v1"}, "checkpoint": ckpt}}


def test_spec_replay_snapshot_defaults_off_and_is_refused_for_ppo():
    assert parse_job(job()).spec.checkpoint.replay_snapshot is False
    assert parse_job(job(replaySnapshot=True)).spec.checkpoint.replay_snapshot is True
    ppo = job(replaySnapshot=True)
    ppo["spec"]["algorithm"] = {"name": "ppo"}
    with pytest.raises(SpecError, match="replaySnapshot"):
        parse_job(ppo)
    with pytest.raises(SpecError, match="ReadWriteOncePod"):
        parse_job(job(replaySnapshot=True, size="1Gi", accessMode="ReadWriteOncePod"))
    with pytest.raises(SpecError):
        parse_job(job(replaySnapshot="sometimes"))


# ------------------------------------------------------------------ buffer
@pytest.fixture
def make_buffer(monkeypatch):
    from tianji.control.contracts.addressing import Addresses
    from tianji.runtime import security
    from tianji.runtime.roles.buffer import Buffer

    def make(tmp_path):
        rings = security.issue(["buffer-0-0", "learner-0-0"])
        security.write_keyring(tmp_path / "buffer.json", rings["buffer-0-0"])
        monkeypatch.setenv("TIANJI_CURVE_KEYS", str(tmp_path / "buffer.json"))
        j = parse_job(job(replaySnapshot=True))
        b = Buffer(j, 0, 0, Addresses(j.name, run_dir=tmp_path), run_dir=str(tmp_path))
        b.setup()
        return b
    return make


def test_buffer_restores_its_snapshot_and_may_sample_at_once(tmp_path, make_buffer):
    rs.write(rs.snapshot_path(tmp_path, 0, 0), transitions(300))
    b = make_buffer(tmp_path)
    try:
        assert len(b.replay) == 300 and b.metrics.gauges["replay_restored"] == 300
        assert b.limiter.sampling and b._next_batch() is not None  # no new warm-up
        b.replay.put(transitions(5, start=1000))
        b.teardown()  # the final snapshot holds the latest ring
        assert len(rs.load(rs.snapshot_path(tmp_path, 0, 0), INFO, 1000)["actions"]) == 305
    finally:
        b.ctx.destroy(linger=0)


def test_buffer_refuses_a_bad_snapshot_logs_why_and_starts_empty(tmp_path, caplog, make_buffer):
    a = transitions(300)
    a["returns"][7] = np.nan
    (tmp_path / "checkpoints").mkdir()
    write_raw(tmp_path / "checkpoints", a)
    with caplog.at_level(logging.ERROR, logger="tianji"):
        b = make_buffer(tmp_path)
    try:
        assert len(b.replay) == 0 and not b.limiter.sampling
        assert "refused (returns: non-finite values)" in caplog.text
    finally:
        b.ctx.destroy(linger=0)


# ------------------------------------------------------------------ a real run, then --resume
@pytest.mark.slow
def test_resumed_dqn_run_starts_from_its_replay_and_trains_without_a_new_warm_up(running_tianji):
    from helpers import EXAMPLES, read_summary, run_tianji, wait_for

    dqn = str(EXAMPLES / "cartpole-dqn.yaml")
    run = running_tianji(dqn, "--set", "spec.checkpoint.replaySnapshot=true", "--set",
                         "spec.checkpoint.intervalSeconds=3", "--set", "spec.algorithm.replayCapacity=100000",
                         "--set", "spec.stop.meanReturn=100000")
    path = rs.snapshot_path(run.run_dir, 0, 0)
    wait_for(path.exists, 120, "a periodic replay snapshot")  # written while the run goes on
    run.wait_for_frames(4000)
    run.interrupt()  # graceful: the buffer writes its last snapshot at exit
    first = run.summary()
    n = len(rs.load(path, INFO, 100_000)["actions"])
    assert n >= 1024, n
    # Resume with learningStarts = the whole snapshot and fewer new frames than that: the
    # learner can only train in the resumed run if the buffer starts from the snapshot.
    new_frames = max(256, n // 2)
    r = run_tianji("run", "--resume", str(run.run_dir), "--quiet",
                   "--set", f"spec.algorithm.learningStarts={n}",
                   "--set", f"spec.stop.envFrames={first['env_frames'] + new_frames}",
                   "--set", "spec.stop.meanReturn=100000", timeout=300)
    second = read_summary(run.run_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert second["policy_version"] > first["policy_version"], (first["policy_version"], second["policy_version"])
    log = (run.run_dir / "logs" / "buffer-0-0.log").read_text()
    assert f"loaded {n} transitions" in log, log[-2000:]
    assert "refused" not in log
