"""Shared helpers for tests that drive `tianji run` as a user would."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def tianji_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tianji.cli", *args]


def run_tianji(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(tianji_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def start_tianji(*args: str) -> subprocess.Popen:
    return subprocess.Popen(tianji_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


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


def interrupt(proc: subprocess.Popen, timeout: float = 60) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=timeout)
    return out
