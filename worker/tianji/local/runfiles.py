"""What a local run writes to disk, written so that a full disk or a crash loses nothing.

    MetricsLog       metrics.jsonl, one JSON line a record; lines wait in memory while the
                     disk is full and go out in order when it has room again
    write_summary    summary.json, retried for SUMMARY_RETRY_S, then a fallback file in the
                     temp dir (or home), then stderr: a run's result is never lost
    socket_dir       the folder of the run's ipc:// sockets (0700), cleaned of a killed run's
    last_record      the newest complete line of a metrics.jsonl (where --resume continues)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from tianji.runtime import atomicfile

SUMMARY_RETRY_S = 10.0
SOCK_PATH_MAX = 70  # unix socket paths are limited to 107 bytes: longer run dirs get a temp folder


class Warner:
    """Prints each kind of warning once (a full disk would otherwise print every second)."""

    def __init__(self):
        self.seen: set[str] = set()

    def __call__(self, key: str, text: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            print(f"tianji: {text}", file=sys.stderr)


class MetricsLog:
    """metrics.jsonl, one line per record, that survives a full disk: a line that cannot be
    written waits (at most MAX_PENDING, oldest dropped first) and goes out, in order, with the next
    record that can; a half-written line is cut off again, so the file stays valid JSON lines."""

    MAX_PENDING = 3600

    def __init__(self, path: Path, warn: Optional[Warner] = None):
        self.path, self.warn = path, warn or Warner()
        self.pending: list[str] = []

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.flush()

    def append(self, line: str) -> None:
        self.pending.append(line)
        del self.pending[:-self.MAX_PENDING]
        self.flush()

    def _write(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def flush(self) -> None:
        if not self.pending:
            return
        try:
            self._write("".join(self.pending).encode())
        except OSError as e:
            self.warn("metrics", f"cannot write {self.path} ({e.strerror}); keeping records in memory and retrying")
            return
        self.pending.clear()


def write_summary(path: Path, summary: dict, fallback_name: str, warn: Warner) -> Path:
    """summary.json at `path`, retried while the disk is full (SUMMARY_RETRY_S); then
    `fallback_name` in the temp dir or home, and the summary on stderr. Returns where it went."""
    deadline = time.monotonic() + SUMMARY_RETRY_S
    while True:
        try:
            return atomicfile.atomic_write_json(path, summary)
        except OSError as e:
            if time.monotonic() >= deadline:
                err = e
                break
            warn("summary", f"cannot write {path} ({e.strerror}); retrying for {SUMMARY_RETRY_S:g}s")
            time.sleep(0.5)
    summary = {**summary, "error": summary.get("error") or f"summary.json not written: {err.strerror}"}
    for d in (Path(tempfile.gettempdir()), Path.home()):
        try:
            fb = atomicfile.atomic_write_json(d / fallback_name, summary)
            print(f"tianji: {path}: {err.strerror}; summary written to {fb}", file=sys.stderr)
            return fb
        except OSError:
            continue
    print(f"tianji: {path}: {err.strerror}; summary: {json.dumps(summary)}", file=sys.stderr)
    return path


def socket_dir(run_dir: Path) -> tuple[Path, bool]:
    """The (empty, 0700) folder for the run's sockets, and whether it is a temp folder of its own
    (then <run_dir>/sock links to it). A SIGKILLed launcher's folder and link are removed first."""
    sock = run_dir / "sock"
    own = len(str(sock)) > SOCK_PATH_MAX
    path = Path(tempfile.mkdtemp(prefix="tianji-")) if own else sock
    if sock.is_symlink():
        old = Path(os.path.realpath(sock))
        if old.parent == Path(tempfile.gettempdir()).resolve() and old.name.startswith("tianji-"):
            shutil.rmtree(old, ignore_errors=True)
        sock.unlink()
    elif sock.exists():
        shutil.rmtree(sock, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    if own:  # <run_dir>/sock still leads to the sockets (resolve it: the path is short)
        sock.symlink_to(path, target_is_directory=True)
    os.chmod(path, 0o700)  # whatever the umask: only this user may connect
    return path, own


def remove_socket_dir(run_dir: Path, path: Path, own: bool) -> None:
    """No socket file outlives the run."""
    shutil.rmtree(path, ignore_errors=True)
    if own:
        (run_dir / "sock").unlink(missing_ok=True)


def last_record(path: Path) -> Optional[dict]:
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last complete line
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None
