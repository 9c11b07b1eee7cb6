"""Where the planner finds measurements beyond a job's profile, and the GPU figures among them.

Two kinds of files, both kept in the repository and read when present:

- docs/results/batch-curve-<job>.json: frames to target against effective batch size
  (batchcurve.py; `python -m bench.batch_curve`);
- docs/device/*.json: results of runs on GPU machines (bench/device/run.sh), and any `tianji
  profile` JSON: the learner's GPU samples/s, named by the GPU it was measured on.

TIANJI_RESULTS_DIR and TIANJI_DEVICE_DIR point elsewhere (a deployment without the repository, a
test's fixtures); a directory that does not exist holds nothing. Files are read once per change
(keyed by modification time), so a planner asked many times reads each once.

A GPU figure is any JSON object, at any depth of a file (up to MAX_DEPTH), with a number
`learner_sps_per_gpu` (or `learnerSpsPerGpu`) > 0: a `tianji profile` output, or one inside a
device run's results. Its device is the first name found in, in order, the object's
`learner_gpu` / `learnerGpu` object (`name`, `device_name`, `gpu_name`, `gpu`), the object
itself (`learner_gpu_name`, `gpu_name`, `gpu`, `device_name`, `device`), then the enclosing
objects outward (the same keys); `cuda` and `cpu` are not names. `tianji profile` writes
`learner_gpu.device_name`; bench/device/run.sh writes its profiles flat into docs/device.
Its job is the object's `job`, `env`, `algorithm` and `batch_size` where given.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[4]  # worker/tianji/control/planner/ -> the repository
MAX_DEPTH = 6
_NAME_KEYS = ("name", "device_name", "gpu_name", "gpu")
_OWN_KEYS = ("learner_gpu_name", "gpu_name", "gpu", "device_name", "device")
_NOT_NAMES = {"cuda", "cpu", "cuda:0", ""}


def results_dir() -> Path:
    return Path(os.environ.get("TIANJI_RESULTS_DIR") or REPO / "docs" / "results")


def device_dir() -> Path:
    return Path(os.environ.get("TIANJI_DEVICE_DIR") or REPO / "docs" / "device")


def cite_path(p: Path) -> str:
    """`p` relative to the repository when it lies inside it (how a plan cites it), else as given."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def cached_load(directory: Path, pattern: str, loader: Callable) -> tuple:
    """loader(path) for every file matching `pattern` in `directory`, skipping the malformed."""
    try:
        files = tuple(sorted((str(f), f.stat().st_mtime_ns) for f in Path(directory).glob(pattern) if f.is_file()))
    except OSError:
        return ()
    return _load_all(files, loader)


@functools.lru_cache(maxsize=32)
def _load_all(files: tuple, loader: Callable) -> tuple:
    out: list = []
    for path, _ in files:
        try:
            got = loader(path)
        except ValueError:
            continue
        out.extend(got if isinstance(got, (list, tuple)) else [got])
    return tuple(out)


@dataclass(frozen=True)
class GpuFigure:
    """One measured learner GPU rate: samples/s of one learner on one GPU of `device`."""

    device: str
    samples_per_s: float
    source: str  # the file it was read from
    job: Optional[str] = None
    env: Optional[str] = None
    algorithm: Optional[str] = None
    batch_size: Optional[int] = None
    date: str = ""

    def cite(self) -> str:
        return f"{self.source}, {self.date}" if self.date else self.source

    def matches(self, job) -> bool:
        """Measured for this job's env, algorithm and batch (what it leaves out, it does not contradict)."""
        s = job.spec
        return (
            (self.env is None or self.env == s.env.id)
            and (self.algorithm is None or self.algorithm == s.algorithm.name)
            and (self.batch_size is None or self.batch_size == s.algorithm.batch_size)
            and (self.env is not None or self.job == job.name)
        )


def _name(d: dict, keys) -> Optional[str]:
    for k in keys:
        v = d.get(k)
        if isinstance(v, str) and v.strip().lower() not in _NOT_NAMES:
            return v.strip()
    return None


def device_name(d: dict) -> Optional[str]:
    """The GPU a profile object names (its learner_gpu object first, then its own keys), or None."""
    gpu = d.get("learner_gpu", d.get("learnerGpu"))
    return (_name(gpu, _NAME_KEYS) if isinstance(gpu, dict) else None) or _name(d, _OWN_KEYS)


def _sps(d: dict) -> Optional[float]:
    v = d.get("learner_sps_per_gpu", d.get("learnerSpsPerGpu"))
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == v and v != float("inf"):
        return float(v)
    return None


def gpu_figures(doc, source: str, date: str = "") -> list[GpuFigure]:
    """Every GPU figure in a parsed JSON document (module docstring)."""
    out: list[GpuFigure] = []

    def walk(node, outer: Optional[str], date: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(node, list):
            for v in node:
                walk(v, outer, date, depth + 1)
            return
        if not isinstance(node, dict):
            return
        if isinstance(node.get("date"), str):
            date = node["date"]
        here = device_name(node) or outer
        sps = _sps(node)
        if sps is not None and here:
            bs = node.get("batch_size", node.get("batchSize"))
            out.append(
                GpuFigure(
                    here,
                    sps,
                    source,
                    _str(node.get("job")),
                    _str(node.get("env")),
                    _str(node.get("algorithm")),
                    bs if isinstance(bs, int) else None,
                    date,
                )
            )
        for k, v in node.items():
            if isinstance(v, (dict, list)) and k not in ("learner_gpu", "learnerGpu"):
                walk(v, here, date, depth + 1)

    walk(doc, None, date, 0)
    return out


def _str(v) -> Optional[str]:
    return v if isinstance(v, str) and v else None


def load_gpu_figures(path) -> list[GpuFigure]:
    """The GPU figures of one JSON file; ValueError naming it when it cannot be read."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    return gpu_figures(doc, cite_path(p))


def find_gpu_figure(job, model: Optional[str] = None, figures: Optional[tuple] = None) -> Optional[GpuFigure]:
    """The measured GPU figure for `job` (default: from device_dir()), on a GPU whose name contains
    `model` (case-insensitive) when given; among several, the newest, then one recorded under the
    job's own name, then by device name (a stable answer)."""
    figs = cached_load(device_dir(), "*.json", load_gpu_figures) if figures is None else tuple(figures)
    fit = [f for f in figs if f.matches(job) and (model is None or model.lower() in f.device.lower())]
    if not fit:
        return None
    return max(fit, key=lambda f: (f.date, f.job == job.name, f.device))


def devices(figures: tuple) -> list[str]:
    return sorted({f.device for f in figures})
