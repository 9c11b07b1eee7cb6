"""What the benchmarks share: where a result comes from, how it is printed, what this machine
is, and one `tianji run` of a job read back from its run directory.

- `stamp(name, argv)`: the command (`python -m bench.NAME ...`), date and machine every result
  carries; `python -m bench.render_docs` puts them beside each figure it renders.
- `emit(result, out)`: the result as JSON on stdout and, with `out`, in that file.
- `machine()`, `host()`, `cpu_name()`, `gpu_name()`, `loadavg()`: this machine's cores, CPU,
  GPU (if torch sees one) and load.
- `run_job(job, sets, run_dir, ...)`: one `tianji run` of a job file with `--set` overrides;
  `Run.summary()` and `Run.records()` read summary.json and metrics.jsonl back, and
  `rates_between(a, b)` the produced / received / consumed rates between two records.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"  # the results docs/benchmarks.md renders


# --- this machine ------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def gpu_name() -> str | None:
    """The first GPU torch sees, or None. torch is asked only where a GPU driver is loaded
    (NVIDIA's or AMD's) or torch is already imported: a CPU-only benchmark whose process
    never needs torch does not pay its import for the stamp."""
    drivers = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")
    if "torch" not in sys.modules and not any(Path(p).exists() for p in drivers):
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages: how busy the machine was around a measurement."""
    return list(os.getloadavg())


def host(**extra) -> dict:
    """Cores and load average now, plus whatever else a benchmark records of its host."""
    return {"cpus": os.cpu_count(), "loadavg": loadavg(), **extra}


def machine() -> str:
    """One line for the stamp: cores, CPU model and, where torch sees one, the GPU."""
    gpu = gpu_name()
    return f"{os.cpu_count()} cores, {cpu_name()}" + (f", GPU {gpu}" if gpu else "")


# --- where a result comes from, and printing it --------------------------------------------

def command(name: str, argv: Iterable[str]) -> str:
    """The command line that runs bench/NAME.py with `argv`, as a user types it."""
    return shlex.join(["python", "-m", f"bench.{name}", *argv])  # quoted: it pastes back as it ran


def stamp(name: str, argv: list[str] | None = None) -> dict:
    """`name`: the module under bench/ (`converge`); `argv`: its arguments as given (default:
    this process's)."""
    return {"command": command(name, sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine()}


def emit(result: dict, out: str | Path | None = None, indent: int | None = 1) -> None:
    """Print the result as JSON and, with `out`, write the same text there (docs/results/)."""
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


# --- one `tianji run` ----------------------------------------------------------------------

@dataclass
class Run:
    """A finished `tianji run`: its run directory, exit status and what it wrote on stderr."""

    run_dir: Path
    returncode: int | None
    stderr: str

    def summary(self) -> dict:
        """summary.json (OSError where the run wrote none, ValueError where it is not JSON)."""
        return json.loads((self.run_dir / "summary.json").read_text())

    def records(self) -> list[dict]:
        return read_records(self.run_dir)


def read_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records (one a second); a line that is not JSON is left out."""
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def tianji_command(job: str | Path, run_dir: str | Path, sets: Iterable[str] = (),
                   args: Iterable[str] = ()) -> list[str]:
    """`tianji run JOB --run-dir RUN_DIR --quiet [ARGS] --set S ...` in this interpreter."""
    cmd = [sys.executable, "-m", "tianji.cli", "run", str(job), "--run-dir", str(run_dir), "--quiet", *args]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def launch_offset(run: Path, t_launch: float) -> float:
    """Seconds from launching `tianji run` (at `t_launch`) to its launcher's clock, which starts
    after the launcher's own imports: job.yaml is written just before, so its mtime puts the run's
    times on a launch-to-target clock (a single-process baseline's)."""
    return max(0.0, (run / "job.yaml").stat().st_mtime - t_launch)


def run_job(job: str | Path, sets: Iterable[str], run_dir: str | Path, *, args: Iterable[str] = (),
            timeout: float | None = None, cwd: str | Path = ROOT, env: dict | None = None,
            watch: Callable[[int, float], None] | None = None) -> Run:
    """Run the job to its end (or `timeout` seconds: subprocess.TimeoutExpired) and return it.

    `env`: variables added to this process's environment. `watch(pid, seconds)`: called about
    once a second with the launcher's pid while it runs (bench/scaling.py samples the CPU of
    its workers); a watched run still going at `timeout` is stopped (SIGTERM) instead, so that
    what it recorded can be read."""
    cmd = tianji_command(job, run_dir, sets, args)
    full_env = {**os.environ, **(env or {})}
    if watch is None:
        p = subprocess.run(cmd, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, errors="replace", timeout=timeout)
        return Run(Path(run_dir), p.returncode, p.stderr)
    with tempfile.TemporaryFile("w+", errors="replace") as err:  # a file: nobody reads a pipe meanwhile
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=err)
        t0 = time.time()
        while proc.poll() is None and (timeout is None or time.time() - t0 < timeout):
            watch(proc.pid, time.time() - t0)
            time.sleep(1.0)
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)
        err.seek(0)
        return Run(Path(run_dir), proc.returncode, err.read())


def role_totals(record: dict) -> dict:
    """A metrics record's running totals: env frames produced, samples the buffers received and
    samples the learners consumed."""
    procs = record.get("processes", {})
    return {"produced": record.get("env_frames", 0.0),
            "received": sum(p["received"] for n, p in procs.items() if n.startswith("buffer")),
            "consumed": sum(p["consumed"] for n, p in procs.items() if n.startswith("learner"))}


def rates_between(a: dict, b: dict) -> dict:
    """Produced frames/s and received / consumed samples/s from record `a` to the later `b`."""
    ta, tb, dt = role_totals(a), role_totals(b), b["t"] - a["t"]
    return {"produced_fps": (tb["produced"] - ta["produced"]) / dt,
            "received_fps": (tb["received"] - ta["received"]) / dt,
            "consumed_sps": (tb["consumed"] - ta["consumed"]) / dt}
