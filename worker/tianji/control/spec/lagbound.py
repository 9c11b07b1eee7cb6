"""The policy-lag bound that fits a PPO batch, and what a spec's staleness settings imply.

maxPolicyLag counts versions, but what one version of lag costs is how far a version moves the
policy: an update of `epochs x batchSize / minibatchSize` optimizer steps. The CartPole example
takes 10 steps per version and paid 0-7 % more frames at lag ~0.9; rl-baselines3-zoo's Acrobot
settings take 256 and paid 70-93 % more frames at lag ~1.4, and maxPolicyLag 1 there took fewer
frames to the target than 4 despite dropping more (docs/ablation.md). So the default bound is a
budget in optimizer steps, LAG_BUDGET_STEPS, rounded to versions: 4 up to 73 steps per version,
3 up to 102, 2 up to 170, then 1 (relaxed PPO consumes every batch at least one version late:
`overlap_lag`). Every example sets its own bound; the default is for a spec that does not.

`staleness_notes` says, before anything starts, when the settings imply heavy drops or heavy lag
(`tianji run` prints them). Plain arithmetic on the spec: no torch, importable by the control plane.
"""

from __future__ import annotations

import math
from typing import Optional

LAG_BUDGET_STEPS = 256  # optimizer steps of policy lag the default bound allows (rounded to versions)
DEFAULT_MAX_LAG = 4  # the bound where a version is a small step
HEAVY_STEPS = 256  # optimizer steps per version at which one version of lag was measured costly (Acrobot)


def steps_per_version(algorithm) -> int:
    """Optimizer steps in one PPO update: epochs x minibatches per batch."""
    return algorithm.epochs * math.ceil(algorithm.batch_size / algorithm.minibatch_size)


def fitted_max_lag(algorithm) -> int:
    """The default maxPolicyLag of a PPO job: LAG_BUDGET_STEPS in versions, within [1, DEFAULT_MAX_LAG]."""
    return max(1, min(DEFAULT_MAX_LAG, round(LAG_BUDGET_STEPS / steps_per_version(algorithm))))


def overlap_lag(spec) -> Optional[int]:
    """The policy lag a relaxed on-policy learner consumes at by overlapping alone: a batch produced
    while the learner trains is consumed after that update, and each batch queued behind it
    (creditWindow) and each version not published (publishEvery) adds one. None for replay (DQN)."""
    if spec.algorithm.name != "ppo":
        return None
    return spec.credit_window * spec.staleness.publish_every


def staleness_notes(spec) -> list[str]:
    """What the staleness settings imply for a relaxed PPO job, when it is costly; [] otherwise."""
    if spec.algorithm.name != "ppo" or spec.dependencies != "relaxed":
        return []
    notes = []
    steps, lag, floor = steps_per_version(spec.algorithm), spec.max_policy_lag, overlap_lag(spec)
    if lag is not None and lag < floor:
        notes.append(
            f"staleness.maxPolicyLag {lag} is below the {floor} version(s) of lag that overlapping "
            f"makes (creditWindow {spec.credit_window} x publishEvery {spec.staleness.publish_every}): "
            "most samples will be dropped as stale; raise it, or use dependencies: strict"
        )
    elif steps >= HEAVY_STEPS:
        notes.append(
            f"a policy version is {steps} optimizer steps (epochs x batchSize / minibatchSize) and relaxed "
            f"PPO consumes every sample at least {floor} version(s) late: with rl-zoo's Acrobot settings "
            "(256 steps) that took 1.5-2x the frames of dependencies: strict (docs/ablation.md); fewer "
            "steps per version, or strict, need fewer frames"
        )
    return notes
