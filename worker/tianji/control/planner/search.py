"""The sizing search: every topology the planner considers for M cores and G GPUs on K nodes,
each with its prediction (prediction.py) on its placement's links (placement.py).

It enumerates a small grid of process sizes, group counts and buffer counts; for each it
takes the fewest actors whose production, after their share of the parameter intake, covers
what the learners consume, TR_A ≥ TR_L / r (or as many as fit and pack onto the nodes), one
learner per group: a plan keeps every learner it pays for (a GPU above all) fed.
objective.py then chooses among them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from tianji.control.planner.batchcurve import CurveUse
from tianji.control.planner.costmodel import thread_curve
from tianji.control.planner.placement import links_for, max_packable
from tianji.control.planner.prediction import Shape, learner_rate, predict
from tianji.control.planner.profile import Profile
from tianji.control.planner.rebalance import actors_for
from tianji.control.spec import TianJiJob

# Process-size grid the planner searches (cores). Actors step envs in one
# thread, so they stay at <= 1 core; a learner gains little from intra-op
# threads beyond a few cores; a buffer is one event loop (<= 1 core useful).
ACTOR_CORES = (0.5, 1.0)
BUFFER_CORES = (0.25, 0.5, 1.0)
LEARNER_CORES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
GPU_LEARNER_CORES = 1.0  # host cores of a GPU learner (feeding and launching kernels)
BUFFER_COUNTS = (1, 2, 3, 4, 6, 8)
MAX_GROUPS, MAX_ACTORS = 1024, 4096  # spec.Topology's upper bounds
_EPS = 1e-9


@dataclass(frozen=True)
class Budget:
    """M usable cores over K nodes of the given sizes; G GPUs spread over them."""

    cpus: float
    gpus: int
    node_cpus: tuple
    node_gpus: tuple


@dataclass(frozen=True)
class Candidate:
    shape: Shape
    pred: dict

    @property
    def cores(self) -> float:
        return self.shape.cores

    @property
    def gpus(self) -> int:
        return self.shape.gpus

    @property
    def effective(self) -> float:
        return self.pred["effective_sps"]


def group_candidates(gmax: int) -> list[int]:
    """1..32, then geometric steps (x1.15) up to gmax: keeps the search small for large M."""
    out, g = [], 1
    while g <= gmax:
        out.append(g)
        g = g + 1 if g < 32 else max(g + 1, int(g * 1.15))
    if gmax >= 1 and out[-1] != gmax:
        out.append(gmax)
    return out


def predict_shape(
    job: TianJiJob, p: Profile, sh: Shape, budget: Optional[Budget], curve: Optional[CurveUse] = None
) -> dict:
    """predict() on the links of this shape's placement (budget None: node sizes unknown)."""
    cpus, gpus = (list(budget.node_cpus), list(budget.node_gpus)) if budget else (None, None)
    return predict(job, p, sh, links_for(job, p, cpus, gpus, *sh), curve=curve)


FEED_ROUNDS = 4  # actors added after a prediction shows the intake share left production short


def fed(job: TianJiJob, p: Profile, sh: Shape, budget: Budget, na_fit: int, curve: Optional[CurveUse]) -> Candidate:
    """The candidate of `sh` with actors added, up to `na_fit` and what packs onto the nodes, until
    the predicted production capacity TR_A (after the actors' parameter intake) covers the
    learners' TR_L / r."""
    r = job.spec.replay_ratio
    pred = predict_shape(job, p, sh, budget, curve)
    for _ in range(FEED_ROUNDS):
        short = pred["tr_l"] / r - pred["tr_a"]
        if short <= 1e-6 * pred["tr_l"] or sh.na >= na_fit:
            break
        per_actor = pred["tr_a"] / (sh.g * sh.na)
        want = min(na_fit, sh.na + max(1, math.ceil(short / (sh.g * per_actor))))
        na = max_packable(want, sh.nb, sh.g, sh.ca, sh.cb, sh.cl, sh.gl, list(budget.node_cpus), list(budget.node_gpus))
        if na is None or na <= sh.na:
            break
        sh = sh._replace(na=na)
        pred = predict_shape(job, p, sh, budget, curve)
    return Candidate(sh, pred)


def _sizes(gl: int, cn: float, t_max: int):
    """(c_l, c_a, c_b) process sizes that fit a node of cn cores. CPU learners stop at the thread
    curve's last measured point t_max: beyond it s_L is held flat (costmodel.learner_sps), so a
    bigger learner costs more for the same rate and can never be chosen."""
    for cl in (GPU_LEARNER_CORES,) if gl else LEARNER_CORES:
        if cl > cn + _EPS or (not gl and cl > max(1, t_max) + _EPS):
            continue
        for ca in ACTOR_CORES:
            for cb in BUFFER_CORES:
                if max(ca, cb) <= cn + _EPS:
                    yield cl, ca, cb


def candidates(
    job: TianJiJob, p: Profile, budget: Budget, gpu_modes: list[int], curve: Optional[CurveUse] = None
) -> list[Candidate]:
    """Every topology considered (module docstring), with its prediction."""
    r = job.spec.replay_ratio
    m, nc, ng = budget.cpus, list(budget.node_cpus), list(budget.node_gpus)
    t_max = thread_curve(p.learner_thread_scaling)[-1][0]
    out = []
    for gl in gpu_modes:
        for cl, ca, cb in _sizes(gl, max(nc), t_max):
            per_learner = learner_rate(p, cl, gl)[0]
            na_need = actors_for(per_learner, r, ca * p.actor_fps_per_core)
            gmax = min(MAX_GROUPS, int((m + _EPS) // (cl + ca + cb)))
            if gl:
                gmax = min(gmax, budget.gpus // gl)
            for g in group_candidates(gmax):
                for nb in BUFFER_COUNTS:
                    na_fit = min(MAX_ACTORS, int((m - g * (cl + nb * cb) + _EPS) // (g * ca)))
                    if na_fit < nb:
                        break
                    na = max_packable(max(nb, min(na_fit, na_need)), nb, g, ca, cb, cl, gl, nc, ng)
                    if na is None:
                        continue
                    out.append(fed(job, p, Shape(g, na, nb, 1, ca, cb, cl, gl), budget, na_fit, curve))
    return _gpus_fed(out, r)


def _gpus_fed(cands: list[Candidate], r: float) -> list[Candidate]:
    """Leave out GPU plans whose actors cannot feed their learners where some GPU plan can: a GPU
    left idle for want of actors is paid for and unused (more groups can still score higher on
    consumed samples alone, with fewer actors each)."""

    def starved(c: Candidate) -> bool:
        return c.shape.gl > 0 and c.pred["tr_a"] * r < c.pred["tr_l"] * (1 - 1e-6)

    if any(c.shape.gl > 0 and not starved(c) for c in cands):
        return [c for c in cands if not starved(c)]
    return cands
