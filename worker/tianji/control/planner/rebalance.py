"""Live rebalancing (paper §3.3, the operator's autoscaler and paced actors): actor counts and
actor pacing from observed rates, by the planner's balance rule TR_A = TR_L / r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from tianji.control.planner.prediction import COMMUNICATION_BOUND, SAMPLE_BOUND, TRAINING_BOUND

_EPS = 1e-9


@dataclass(frozen=True)
class GroupThroughput:
    """Observed rates of one group over a window: actors' frames/s, buffer
    receive samples/s, learner consume samples/s, and its current actor count."""

    produced_fps: float
    received_sps: float
    consumed_sps: float
    actors: int
    # The learners' measured capacity (samples per busy second, learner_capacity_sps): what
    # they could take. None: only `consumed` is known.
    capacity_sps: Optional[float] = None

    def __post_init__(self) -> None:
        for n in ("produced_fps", "received_sps", "consumed_sps"):
            if not getattr(self, n) >= 0:
                raise ValueError(f"GroupThroughput.{n} must be >= 0, got {getattr(self, n)!r}")
        if self.capacity_sps is not None and not (math.isfinite(self.capacity_sps) and self.capacity_sps >= 0):
            raise ValueError(f"GroupThroughput.capacity_sps must be finite and >= 0, got {self.capacity_sps!r}")
        if self.actors < 0:
            raise ValueError(f"GroupThroughput.actors must be >= 0, got {self.actors}")


@dataclass(frozen=True)
class RebalancePolicy:
    target_ratio: float  # consumed / produced the job aims at (spec.replay_ratio)
    band: float  # relative hysteresis band, 0 <= band < 1
    min_actors: int
    max_actors: int
    max_step: int = 4  # most actors added or removed per group per decision

    def __post_init__(self) -> None:
        if not self.target_ratio > 0:
            raise ValueError(f"target_ratio must be > 0, got {self.target_ratio!r}")
        if not 0 <= self.band < 1:
            raise ValueError(f"band must be in [0, 1), got {self.band!r}")
        if self.min_actors < 1:
            raise ValueError(f"min_actors must be >= 1, got {self.min_actors}")
        if self.max_actors < self.min_actors:
            raise ValueError(f"max_actors ({self.max_actors}) < min_actors ({self.min_actors})")
        if self.max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {self.max_step}")


def actors_for(learner_sps: float, ratio: float, per_actor_fps: float, band: float = 0.0) -> int:
    """Fewest actors whose production feeds `learner_sps` at replay ratio `ratio` to within
    `band`: n·per_actor_fps ≥ (1 − band)·learner_sps/ratio, i.e. ⌈(1 − band)·need/p⌉
    (the planner's balance with band 0; rebalance uses it with measured rates and its band)."""
    need = learner_sps / ratio
    return max(1, math.ceil((1 - band) * need / per_actor_fps - _EPS))


def observed_bottleneck(o: GroupThroughput, ratio: float, band: float) -> str:
    """The §3.3 kind from measured rates: communication if the buffers receive less than
    (1 − band) of what the actors produce; sample if production is below (1 − band) of what
    the learners could take (their capacity, else their consumption) over `ratio`; else training."""
    if o.produced_fps > 0 and o.received_sps < (1 - band) * o.produced_fps:
        return COMMUNICATION_BOUND
    take = max(o.capacity_sps or 0.0, o.consumed_sps)
    return SAMPLE_BOUND if o.produced_fps < (1 - band) * take / ratio else TRAINING_BOUND


def rebalance(observed: dict[int, GroupThroughput], policy: RebalancePolicy) -> dict[int, int]:
    """Desired actor count per group from observed throughput, by the planner's model.

    The learners can take L = max(capacity, consumed) samples/s (capacity: their measured
    samples per busy second; a learner held back by the replay ratio consumes only
    ratio·produced, so `consumed` alone would hide a sample-bound group). With
    x = produced / (L / target_ratio), for a group with n actors producing p = produced/n each:

      communication-bound (observed_bottleneck)  → n: more actors would not be received;
      x < 1 − band  → n + clamp(actors_for(L, target_ratio, p, band) − n, 1, max_step)
                      (nothing produced yet: + max_step);
      x > 1 + band  → n − clamp(n − actors_for(L, target_ratio, p, band), 1, max_step);
      otherwise, or L = 0 (learner not started), → n;

    then clamped to [min_actors, max_actors]. When actors pace themselves
    (spec.staleness.paceActors) `produced` is capped at headroom·needed; pass
    target_ratio / headroom as target_ratio, or the unpaced capacity.
    """
    out: dict[int, int] = {}
    for group, o in observed.items():
        n = o.actors
        take = max(o.capacity_sps or 0.0, o.consumed_sps)
        if take > 0 and observed_bottleneck(o, policy.target_ratio, policy.band) != COMMUNICATION_BOUND:
            x = o.produced_fps / (take / policy.target_ratio)
            if x < 1 - policy.band:
                if x == 0 or n == 0:
                    step = policy.max_step
                else:
                    step = actors_for(take, policy.target_ratio, o.produced_fps / n, policy.band) - n
                n += min(max(step, 1), policy.max_step)
            elif x > 1 + policy.band:
                step = n - actors_for(take, policy.target_ratio, o.produced_fps / n, policy.band)
                n -= min(max(step, 1), policy.max_step)
        out[group] = min(max(n, policy.min_actors), policy.max_actors)
    return out


def pace_fps(learner_capacity_sps: float, ratio: float, actors: int, headroom: float) -> float:
    """Per-actor production rate that feeds the learner with some headroom:

        fps = learner_capacity_sps / ratio · headroom / actors

    Preconditions: capacity > 0, ratio > 0, actors ≥ 1, headroom > 0.
    """
    if not learner_capacity_sps > 0:
        raise ValueError(f"learner_capacity_sps must be > 0, got {learner_capacity_sps!r}")
    if not ratio > 0:
        raise ValueError(f"ratio must be > 0, got {ratio!r}")
    if actors < 1:
        raise ValueError(f"actors must be >= 1, got {actors}")
    if not headroom > 0:
        raise ValueError(f"headroom must be > 0, got {headroom!r}")
    return learner_capacity_sps / ratio * headroom / actors
