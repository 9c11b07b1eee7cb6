"""What a DQN replay snapshot (spec.checkpoint.replaySnapshot) costs the buffer: a full CartPole
ring (examples/cartpole-dqn.yaml: replayCapacity 1M transitions, 56 MB).

    copy_s        the copy of the ring the buffer's loop makes (runtime/replay_snapshot.ordered)
    write_s       temp file + fsync + rename of that copy (in the snapshot thread)
    load_s        load + validation at resume (replay_snapshot.load) and the ring fill
    loop_gap_*    the longest pause of a loop doing buffer-like work (inserting fragments' transitions,
                  sampling batches) without a snapshot, and while the thread writes one: what the
                  write costs the receive loop through the GIL
    sync_write_s  the same write done in the loop instead (what a thread-less snapshot would stall it)

    python -m bench.replay_snapshot [--transitions 1000000] [--repeats 3]
Prints one JSON object (medians over the repeats).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import emit, stamp
from tianji.envs import EnvInfo
from tianji.runtime import replay_snapshot as rs
from tianji.runtime.storage import Replay

INFO = EnvInfo(obs_shape=(4,), obs_dtype="float32", n_actions=2)


def fill(n: int) -> Replay:
    r = Replay(n, seed=0)
    rng = np.random.default_rng(0)
    chunk = 65536
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        r.put({"obs": rng.normal(size=(m, 4)).astype(np.float32), "actions": rng.integers(0, 2, m),
               "returns": rng.normal(size=m).astype(np.float32),
               "next_obs": rng.normal(size=(m, 4)).astype(np.float32),
               "discounts": np.full(m, 0.97, np.float32), "versions": np.full(m, 7, np.int64)})
    return r


def busy_loop(r: Replay, seconds: float, stop=None) -> float:
    """Longest gap between iterations of buffer-like work (insert 64 transitions, sample 1024)."""
    tr = {k: v[:64].copy() for k, v in r.data.items()}
    worst, last, end = 0.0, time.perf_counter(), time.perf_counter() + seconds
    while time.perf_counter() < end and (stop is None or not stop()):
        r.put(tr)
        r.sample(1024)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


def once(r: Replay, d: Path) -> dict:
    path = d / "replay-g0-b0.npz"
    base_gap = busy_loop(r, 1.0)
    snap = rs.Snapshotter(path)
    t0 = time.perf_counter()
    snap.start(r)
    gap = busy_loop(r, 60.0, stop=lambda: not snap.busy())
    snap.wait()
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    rs.write(path, rs.ordered(r))
    sync = time.perf_counter() - t0
    t0 = time.perf_counter()
    a = rs.load(path, INFO, r.capacity)
    Replay(r.capacity, 1).put(a)
    load = time.perf_counter() - t0
    return {"copy_s": snap.last["copy_s"], "write_s": snap.last["write_s"], "threaded_wall_s": wall,
            "loop_gap_idle_s": base_gap, "loop_gap_during_write_s": gap, "sync_write_s": sync, "load_s": load,
            "file_bytes": path.stat().st_size}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--transitions", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    a = p.parse_args()
    r = fill(a.transitions)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        runs = [once(r, Path(d)) for _ in range(a.repeats)]
    out = {**stamp("replay_snapshot"), **{k: statistics.median(x[k] for x in runs) for k in runs[0]}}
    out.update(transitions=a.transitions, repeats=a.repeats, ring_bytes=sum(v.nbytes for v in r.data.values()),
               loadavg_1m=os.getloadavg()[0])
    emit(out)


if __name__ == "__main__":
    main()
