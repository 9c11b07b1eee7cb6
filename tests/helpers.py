"""Shared helpers for tests that drive `tianji run` as a user would."""
from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
IMAGES = ROOT / "images"


def operator_image_requirements() -> list[str]:
    """What the operator image installs besides tianji (images/operator-requirements.txt)."""
    lines = (IMAGES / "operator-requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def tianji_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tianji.cli", *args]


def run_tianji(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(tianji_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def last_record(run_dir: Path) -> dict | None:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return None
    lines = p.read_text().strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def worker_pids(run_dir: Path) -> list[int]:
    """PIDs of live processes whose command line names this run dir (our workers)."""
    out = []
    needle = str(run_dir).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if needle in cmd and b"worker" in cmd and ") Z " not in stat:
            out.append(int(d.name))
    return out


def pid_of(run_dir, role: str, index: int) -> int:
    """The pid of a run's live worker `role` (group 0) with this index."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if str(run_dir).encode() in b" ".join(cmd) and b"worker" in cmd and b"--role" in cmd \
                    and cmd[cmd.index(b"--role") + 1] == role.encode() \
                    and cmd[cmd.index(b"--index") + 1] == str(index).encode():
                return int(d)
    raise AssertionError(f"no {role}-{index}")


def exported_keys(run_dir: Path) -> Path:
    """Where a run started by `TianjiRun.start` has the launcher write every process's secret
    keyring (TIANJI_TEST_EXPORT_KEYS): beside the run dir, never in it. A real run writes none."""
    return Path(f"{run_dir}.keys")


def as_job_client(sock, run_dir: Path, identity: str = "actor-0-0", peer: str = "buffer-0-0"):
    """Give a test's socket the CurveZMQ keyring of one of the job's processes (exported_keys),
    talking to PEER (its key pinned): what it then sends is judged as that process's messages,
    by the receiver's identity checks and validation, not refused by ZAP."""
    from tianji.runtime.security import Curve, read_keyring

    path = exported_keys(run_dir) / f"{identity}.json"
    wait_for(path.exists, 60, f"{identity}'s keys")
    Curve(None, read_keyring(path)).client(sock, peer)
    return sock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TianjiRun:
    """A `tianji run` started by the `running_tianji` fixture (tests/conftest.py), which stops it."""

    proc: subprocess.Popen
    run_dir: Path
    log: Path  # the launcher's stdout and stderr

    @classmethod
    def start(cls, *args: str, run_dir: Path, log: Path, export_keys: bool = True) -> TianjiRun:
        """`export_keys`: tests play insiders with the processes' keys (exported_keys); a test of
        what an insider can find passes False, and the run writes no secret anywhere."""
        env = {k: v for k, v in os.environ.items() if k != "TIANJI_TEST_EXPORT_KEYS"}
        if export_keys:
            env["TIANJI_TEST_EXPORT_KEYS"] = str(exported_keys(run_dir))
        with open(log, "wb") as out:  # a file, not a pipe: nobody has to drain it
            # Its own process group, so that teardown can kill it whole.
            proc = subprocess.Popen(tianji_cmd("run", *args, "--run-dir", str(run_dir), "--quiet"), stdout=out,
                                    stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=env)
        return cls(proc, Path(run_dir), Path(log))

    def frames(self) -> float:
        rec = last_record(self.run_dir)
        return rec["env_frames"] if rec else 0

    def wait_for_frames(self, more_than: float, timeout: float = 120) -> None:
        wait_for(lambda: self.frames() > more_than, timeout, f"more than {more_than:g} env frames")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C, as a user would; returns the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def summary(self) -> dict:
        return read_summary(self.run_dir)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, grace: float = 30) -> list[int]:
        """Kill and reap the launcher's process group; then kill any worker that outlived it
        (workers have their own sessions and die with the launcher) and return their pids."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=grace)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not worker_pids(self.run_dir), grace, "the workers to exit")
        left = worker_pids(self.run_dir)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


def ipc(run_dir: Path, name: str) -> str:
    """The ipc address of a run's socket `name`. `<run dir>/sock` is a link to a short folder
    when the run dir's path is too long for a unix socket: connect through the resolved path."""
    return f"ipc://{os.path.realpath(Path(run_dir) / 'sock')}/{name}"


def run_ranks(target, n_ranks: int, args: tuple, n_msgs: int, timeout: float = 600) -> list:
    """Spawn `target(rank, init, *args, queue)` for each rank (torch.distributed over tcp on a free
    port), collect `n_msgs` messages from the queue, and assert every rank exited cleanly."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=target, args=(r, init, *args, q)) for r in range(n_ranks)]
    for p in procs:
        p.start()
    msgs: list = []
    deadline = time.monotonic() + timeout  # liveness bound, not a timing
    try:
        while len(msgs) < n_msgs:
            try:
                msgs.append(q.get(timeout=1.0))
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                assert not dead, f"rank(s) failed before sending their messages (rank, exit code): {dead}"
                assert time.monotonic() < deadline, f"{len(msgs)} of {n_msgs} messages in {timeout:g} s"
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return msgs


def merge_spec(into: dict, patch: dict) -> dict:
    """`patch` merged into `into` in place, nested dicts key by key (a None value sets None)."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge_spec(into[k], v)
        else:
            into[k] = v
    return into


class DeadProc:
    """A worker process (Popen stand-in) that has exited with code 1."""

    pid = 4242

    def poll(self):
        return 1
