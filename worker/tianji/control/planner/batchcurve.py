"""The measured penalty for more learner groups: env frames to a job's target against its effective
batch size (`python -m bench.batch_curve` writes docs/results/batch-curve-<job>.json).

W synchronised learners of batch B take gradient steps over W·B samples, at the same learning
rate, so a plan of W learners needs F(W·B) frames to the target where one learner needs F(B); the
planner charges it the ratio

    ρ(W) = F(W·B) / F(B)          (time to target ∝ ρ(W) / consumed, costmodel.py)

F is read from the curve measured for the job's env and algorithm when there is one (`measured`):
linear between the measured batches (medians over seeds), flat below the smallest, and above the
largest the McCandlish et al. (2018) form E(B) = E_min·(1 + B/B_noise), a straight line in B
fitted to the measured medians by least squares, scaled to the last measured point; that
extrapolated growth is held within [1, B/B_last] (never below the last measured point, never
faster than a fixed number of updates). For a job with no curve of its own (`extrapolated`: Pong,
whose runs take hours) ρ is the geometric mean over the measured curves of the same algorithm
(any algorithm, when none) of F_c(W·B_c)/F_c(B_c) at their own batch B_c: the job's batch is
taken to sit where theirs do relative to the noise scale. With no curve found at all
(`assumed`) ρ(W) = (1 + W)/2, the McCandlish form with B_noise = B.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tianji.control.planner import measured

MEASURED, EXTRAPOLATED, ASSUMED = "measured", "extrapolated", "assumed"


@dataclass(frozen=True)
class BatchCurve:
    """One measured curve: (batch, median env frames to target) points, sorted by batch."""

    job: str
    env: str
    algorithm: str
    base_batch: int
    points: tuple  # ((batch, frames), ...)
    path: str  # where it was read from (relative to the repository where it lies inside it)
    date: str
    censored: tuple = ()  # batches where some run ended short of the target (their frames: a lower bound)
    target: Optional[float] = None  # the mean return the frames were counted to

    def frames(self, batch: float) -> float:
        """F(batch) (module docstring)."""
        pts = self.points
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, f0), (b1, f1) in zip(pts, pts[1:]):
            if batch <= b1:
                return f0 + (f1 - f0) * (batch - b0) / (b1 - b0)
        b_last, f_last = pts[-1]
        return f_last * min(max(self._fit(batch) / self._fit(b_last), 1.0), batch / b_last)

    def _fit(self, batch: float) -> float:
        """The least-squares line E_min + s·B through the measured medians (s ≥ 0)."""
        n = len(self.points)
        if n < 2:
            return 1.0
        mb = sum(b for b, _ in self.points) / n
        mf = sum(f for _, f in self.points) / n
        var = sum((b - mb) ** 2 for b, _ in self.points)
        s = max(0.0, sum((b - mb) * (f - mf) for b, f in self.points) / var) if var > 0 else 0.0
        e_min = mf - s * mb
        return max(e_min + s * batch, 1e-9)

    def ratio(self, batch: float, multiple: float) -> float:
        """F(multiple·batch) / F(batch)."""
        return self.frames(multiple * batch) / self.frames(batch)

    @property
    def largest(self) -> int:
        return int(self.points[-1][0])

    def cite(self) -> str:
        """Its file and date, and the batches where a seed missed the target (lower bounds)."""
        low = f"; a lower bound at batch {', '.join(map(str, self.censored))}" if self.censored else ""
        return (f"{self.path}, {self.date}" if self.date else self.path) + low


@dataclass(frozen=True)
class CurveUse:
    """The batch penalty one job is charged with, and where it comes from."""

    kind: str  # MEASURED | EXTRAPOLATED | ASSUMED
    batch: int  # the job's batch B
    curves: tuple = ()  # the BatchCurves used

    def ratio(self, ranks: int) -> float:
        """ρ(W) (module docstring); 1 for W ≤ 1."""
        if ranks <= 1:
            return 1.0
        if self.kind == ASSUMED or not self.curves:
            return (1 + ranks) / 2
        if self.kind == MEASURED:
            return self.curves[0].ratio(self.batch, ranks)
        logs = [math.log(c.ratio(c.base_batch, ranks)) for c in self.curves]
        return math.exp(sum(logs) / len(logs))

    def beyond(self, ranks: int) -> bool:
        """Whether W·B lies past the largest measured batch (the fitted form, not a measurement)."""
        if self.kind == ASSUMED or not self.curves or ranks <= 1:
            return False
        if self.kind == MEASURED:
            return ranks * self.batch > self.curves[0].largest
        return any(ranks * c.base_batch > c.largest for c in self.curves)

    def source(self) -> str:
        """Where the penalty comes from, in the plan's words."""
        if self.kind == ASSUMED or not self.curves:
            return "batch growth assumed (1 + W)/2 (no batch curve found in docs/results)"
        if self.kind == MEASURED:
            return f"batch curve {self.curves[0].cite()}"
        names = "/".join(_short(c) for c in self.curves)
        return f"batch curve extrapolated from {names} ({'; '.join(c.cite() for c in self.curves)})"

    def absolute_frames(self, job) -> Optional[float]:
        """F(B) of the job itself: only a measured curve whose target is the job's own."""
        target = job.spec.stop.mean_return
        if self.kind != MEASURED or target is None or self.curves[0].target != float(target):
            return None
        return self.curves[0].frames(self.batch)


def _short(c: BatchCurve) -> str:
    env = c.env.split("/")[-1].split("-v")[0]
    return env


def parse(doc: dict, path: str) -> BatchCurve:
    """A curve from bench/batch_curve.py's JSON; ValueError naming `path` when malformed, with
    fewer than two batch sizes, or with lower bounds only (runs that all stopped short of the
    target say nothing about how the frames grow)."""
    try:
        pts, censored = [], []
        for p in doc["points"]:
            b, f = int(p["batch"]), float(p["frames_to_target_median"])
            if not (b >= 1 and math.isfinite(f) and f > 0):
                raise ValueError(f"point {p!r}: batch >= 1 and frames > 0 needed")
            pts.append((b, f))
            if int(p.get("reached", p.get("runs", 1))) < int(p.get("runs", 1)):
                censored.append(b)
        if len(pts) < 2:
            raise ValueError(f"{len(pts)} point(s): a curve needs two batch sizes")
        if len(censored) == len(pts):
            raise ValueError("every point is a lower bound (no batch size reached the target in every run)")
        pts.sort()
        return BatchCurve(
            job=str(doc["job"]),
            env=str(doc["env"]),
            algorithm=str(doc["algorithm"]),
            base_batch=int(doc["base_batch"]),
            points=tuple(pts),
            path=path,
            date=str(doc.get("date", "")),
            censored=tuple(censored),
            target=None if doc.get("target_return") is None else float(doc["target_return"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a batch curve ({type(e).__name__}: {e})") from None


def load(path) -> BatchCurve:
    p = Path(path)
    try:
        return parse(json.loads(p.read_text()), measured.cite_path(p))
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None


def all_curves() -> tuple:
    """Every readable batch curve in the results directory (measured.results_dir); a malformed
    file is skipped (bench output in progress), never fatal to planning."""
    return measured.cached_load(measured.results_dir(), "batch-curve-*.json", load)


def for_job(job, curves: Optional[tuple] = None) -> CurveUse:
    """The curve use for `job` (module docstring); `curves` default: all_curves()."""
    cs = all_curves() if curves is None else tuple(curves)
    s = job.spec
    batch = s.algorithm.batch_size
    own = [c for c in cs if c.env == s.env.id and c.algorithm == s.algorithm.name]
    if own:
        return CurveUse(MEASURED, batch, (min(own, key=lambda c: abs(math.log(c.base_batch / batch))),))
    same = [c for c in cs if c.algorithm == s.algorithm.name] or list(cs)
    if same:
        return CurveUse(EXTRAPOLATED, batch, tuple(sorted(same, key=lambda c: c.env)))
    return CurveUse(ASSUMED, batch)
