"""Replay snapshots (spec.checkpoint.replaySnapshot): a DQN buffer's ring on disk, so that a
resumed run does not start from an empty replay and a new warm-up.

One file per buffer, `<state dir>/checkpoints/replay-g<group>-b<index>.npz`: an uncompressed
numpy .npz of the ring's transitions, oldest first (obs, next_obs, actions, returns,
discounts, versions). Written as temp file + fsync + rename (a crash never leaves half a
file under the final name), read with `allow_pickle=False`, and checked against the job
before a single transition enters the ring: field set, shapes and dtypes from the job's
spaces, finite values, actions in range, discounts in [0, 1], versions non-negative, at
most replayCapacity transitions, and (before reading) member sizes within what that
capacity can hold. Anything else raises SnapshotError; the buffer logs it and starts empty.

Cost: the buffer's loop pays only for a copy of the filled ring (`ordered`); the write runs
in a thread (`Snapshotter`) from that copy, and a snapshot still being written makes the
next one wait for the following interval. bench/replay_snapshot.py measures both halves.
The copy doubles the ring's memory for the duration of the write: with Atari-sized replays
(GBs) that is why the option is off by default.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from tianji.runtime.atomicfile import atomic_write
from tianji.runtime.storage import Replay

log = logging.getLogger("tianji")

FIELDS = ("obs", "next_obs", "actions", "returns", "discounts", "versions")
MAX_VERSION = 2 ** 62
TMP_PREFIX = ".replay-tmp-"
NPY_HEADER_SLACK = 4096  # an .npy member is its array plus a header of at most a few hundred bytes


class SnapshotError(ValueError):
    """A snapshot file this job must not load (the message says why)."""


def snapshot_path(state_dir: str | Path, group: int, index: int) -> Path:
    return Path(state_dir) / "checkpoints" / f"replay-g{group}-b{index}.npz"


def expected(info) -> dict[str, tuple[tuple, str]]:
    """Per-transition shape and dtype of each field for a job's (discrete-action) spaces."""
    o = (tuple(info.obs_shape), np.dtype(info.obs_dtype).name)
    return {"obs": o, "next_obs": o, "actions": ((), "int64"), "returns": ((), "float32"),
            "discounts": ((), "float32"), "versions": ((), "int64")}


def ordered(replay: Replay) -> Optional[dict[str, np.ndarray]]:
    """A copy of the ring's transitions, oldest first (None when empty)."""
    if replay.size == 0:
        return None
    if replay.size < replay.capacity:  # not wrapped yet: slots 0..size-1 in insertion order
        return {k: v[:replay.size].copy() for k, v in replay.data.items()}
    p = replay.pos
    return {k: np.concatenate([v[p:], v[:p]]) for k, v in replay.data.items()}


def write(path: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Atomically replace `path` with an .npz of `arrays` (temp file, fsync, rename)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{TMP_PREFIX}{os.getpid()}-{final.name}")
    return atomic_write(final, tmp, lambda f: np.savez(f, **arrays))


def remove_temp_files(path: str | Path) -> None:
    """Temp files a killed writer of this snapshot left behind."""
    p = Path(path)
    if p.parent.is_dir():
        for t in p.parent.glob(f"{TMP_PREFIX}*-{p.name}"):
            t.unlink(missing_ok=True)


def load(path: str | Path, info, capacity: int) -> dict[str, np.ndarray]:
    """The snapshot's transitions, validated against the job; SnapshotError otherwise."""
    want = expected(info)
    try:
        with zipfile.ZipFile(path) as z:  # sizes first: never read more than the ring can hold
            members = {i.filename: i.file_size for i in z.infolist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise SnapshotError(f"unreadable ({type(e).__name__}: {e})") from None
    names = {n.removesuffix(".npy") for n in members}
    if names != set(FIELDS) or len(members) != len(FIELDS):
        raise SnapshotError(f"fields {sorted(members)}, expected {[f + '.npy' for f in FIELDS]}")
    for k, (shape, dtype) in want.items():
        limit = capacity * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + NPY_HEADER_SLACK
        if members[k + ".npy"] > limit:
            raise SnapshotError(f"{k}: {members[k + '.npy']} bytes, more than replayCapacity {capacity} holds")
    try:
        with np.load(path, allow_pickle=False) as z:
            a = {k: z[k] for k in FIELDS}
    except Exception as e:  # noqa: BLE001 - CRC mismatch, truncated member, object arrays (pickle refused)
        raise SnapshotError(f"unreadable ({type(e).__name__}: {e})") from None
    n = len(a["actions"]) if a["actions"].ndim else -1
    if not 1 <= n <= capacity:
        raise SnapshotError(f"{n} transitions, expected 1..replayCapacity ({capacity})")
    for k, (shape, dtype) in want.items():
        x = a[k]
        if x.shape != (n, *shape) or x.dtype.name != dtype:
            raise SnapshotError(f"{k}: {x.dtype.name}{list(x.shape)}, expected {dtype}{[n, *shape]}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise SnapshotError(f"{k}: non-finite values")
    if a["actions"].min() < 0 or a["actions"].max() >= info.n_actions:
        raise SnapshotError(f"actions outside 0..{info.n_actions - 1}")
    if a["discounts"].min() < 0.0 or a["discounts"].max() > 1.0:
        raise SnapshotError("discounts outside [0, 1]")
    if a["versions"].min() < 0 or a["versions"].max() > MAX_VERSION:
        raise SnapshotError("versions outside 0..2^62")
    return a


class Snapshotter:
    """Writes one buffer's snapshots: the copy in the caller's thread, the write in a thread of its own."""

    def __init__(self, path: Path):
        self.path = path
        self.thread: Optional[threading.Thread] = None
        self.last: dict = {"transitions": 0, "copy_s": 0.0, "write_s": 0.0, "error": None}

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, replay: Replay) -> bool:
        """Copy the ring and write it in the background; False (nothing done) if the previous
        write is still running or the ring is empty."""
        if self.busy():
            return False
        t0 = time.perf_counter()
        arrays = ordered(replay)
        if arrays is None:
            return False
        copy_s = time.perf_counter() - t0
        self.thread = threading.Thread(target=self._write, args=(arrays, copy_s), name="replay-snapshot",
                                       daemon=True)
        self.thread.start()
        return True

    def _write(self, arrays: dict, copy_s: float) -> None:
        t0 = time.perf_counter()
        try:
            write(self.path, arrays)
        except OSError as e:  # a full disk: keep the previous snapshot, try again next interval
            log.error("replay snapshot %s failed (%s); will retry", self.path, e)
            self.last = {**self.last, "error": str(e)}
            return
        self.last = {"transitions": len(arrays["actions"]), "copy_s": copy_s,
                     "write_s": time.perf_counter() - t0, "error": None}

    def wait(self, timeout: Optional[float] = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
