"""The policy-lag bound that fits a PPO batch, and what a spec's staleness settings imply.

maxPolicyLag counts versions, but what one version of lag costs is how far a version moves the
policy: an update of `epochs x batchSize / minibatchSize` optimizer steps. The CartPole example
takes 10 steps per version and paid 0-7 % more frames at lag ~0.9; rl-baselines3-zoo's Acrobot
settings take 256 and paid 70-93 % more frames at lag ~1.4, and maxPolicyLag 1 there took fewer
frames to the target than 4 despite dropping more (docs/ablation.md). So the default bound is a
budget in optimizer steps, LAG_BUDGET_STEPS, rounded to versions: 4 up to 73 steps per version,
3 up to 102, 2 up to 170, then 1 (relaxed PPO consumes every batch at least one version late:
`overlap_lag`). Every example sets its own bound; the default is for a spec that does not.

Where a version is that heavy, overlapping loses frames and gains no time: on the same Acrobot
settings with fragments of 32 steps strict took 0.51 of relaxed's frames and 0.68-0.69 of its time
to the target, at two loads (docs/ablation.md); with rl-zoo's rollout of 256, 0.74 of the frames in
1.07 of the time (0.87-1.12; 3 seed pairs, bench/zoo_settings.py, docs/benchmarks.md). So
`dependencies: auto`, the default, runs such a job strict where strict can run it
(`auto_dependencies`).

`staleness_notes` says, before anything starts, when the settings imply heavy drops or heavy lag,
and what auto chose (`tianji run` prints them). Plain arithmetic on the spec: no torch, importable
by the control plane.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

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


def auto_dependencies(spec) -> tuple[Literal["relaxed", "strict"], str]:
    """What `dependencies: auto` runs a spec as, "relaxed" or "strict", and why: strict for a PPO job
    whose versions are HEAVY_STEPS optimizer steps or more, unless its staleness bound is set by hand
    (a relaxed job's setting) or strict cannot run its topology (`JobSpec.strict_misfit`)."""
    if spec.algorithm.name != "ppo":
        return "relaxed", f"{spec.algorithm.name} trains on replay"
    steps = steps_per_version(spec.algorithm)
    if steps < HEAVY_STEPS:
        return "relaxed", f"a policy version is {steps} optimizer steps, under {HEAVY_STEPS}"
    if spec.staleness.max_policy_lag is not None:
        return "relaxed", "staleness.maxPolicyLag is set"
    if why := spec.strict_misfit():
        return "relaxed", why
    return "strict", (
        f"a policy version is {steps} optimizer steps (epochs x batchSize / minibatchSize), "
        f"at least {HEAVY_STEPS}: there strict needed 0.5-0.75 of relaxed's frames, in about its time"
    )


def staleness_notes(spec) -> list[str]:
    """What the staleness settings imply for a PPO job, when it is costly, and what auto chose where it
    chose strict; [] otherwise."""
    if spec.algorithm.name != "ppo":
        return []
    if spec.dependency_mode == "strict":
        if spec.dependencies != "auto":
            return []
        return [
            f"dependencies: auto runs this job strict: {auto_dependencies(spec)[1]} (docs/ablation.md); "
            "set dependencies: relaxed to overlap anyway"
        ]
    notes = []
    steps, lag, floor = steps_per_version(spec.algorithm), spec.max_policy_lag, overlap_lag(spec)
    if lag is not None and lag < floor:
        notes.append(
            f"staleness.maxPolicyLag {lag} is below the {floor} version(s) of lag that overlapping "
            f"makes (creditWindow {spec.credit_window} x publishEvery {spec.staleness.publish_every}): "
            "most samples will be dropped as stale; raise it, or use dependencies: strict"
        )
    elif steps >= HEAVY_STEPS:
        why = ""
        if spec.dependencies == "auto":
            why = f" (dependencies: auto stays relaxed: {auto_dependencies(spec)[1]})"
        notes.append(
            f"a policy version is {steps} optimizer steps (epochs x batchSize / minibatchSize) and relaxed "
            f"PPO consumes every sample at least {floor} version(s) late: with rl-zoo's Acrobot settings "
            "(256 steps) that took 1.5-2x the frames of dependencies: strict (docs/ablation.md); fewer "
            f"steps per version, or strict, need fewer frames{why}"
        )
    return notes
