"""The default policy-lag bound fits the batch (a budget in optimizer steps), dependencies: auto's
choice, and the notes on staleness settings that imply heavy drops or heavy lag
(control/spec/lagbound.py)."""
from __future__ import annotations

import glob

import pytest

from helpers import EXAMPLES, ROOT
from tianji.control.spec import load_job, parse_job
from tianji.control.spec.lagbound import (
    auto_dependencies,
    fitted_max_lag,
    overlap_lag,
    staleness_notes,
    steps_per_version,
)

ACROBOT = ROOT / "bench" / "jobs" / "acrobot-ppo-rlzoo.yaml"


def _spec(algorithm: dict, staleness: dict | None = None, **extra):
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                      "spec": {"algorithm": algorithm, "env": {"numEnvs": 4, "fragmentLength": 16},
                               "staleness": staleness or {}, **extra}}).spec


@pytest.mark.parametrize("epochs,batch,minibatch,steps,bound", [
    (10, 256, 256, 10, 4),  # the CartPole example: a version is a small step
    (4, 1024, 256, 16, 4),  # Pong
    (10, 2048, 256, 80, 3),
    (10, 4096, 256, 160, 2),  # Pendulum
    (4, 4096, 64, 256, 1),  # rl-zoo's Acrobot
    (20, 4096, 32, 2560, 1),  # never below 1: relaxed PPO consumes at lag 1 by overlapping
])
def test_the_default_bound_is_a_budget_of_optimizer_steps(epochs, batch, minibatch, steps, bound):
    spec = _spec({"name": "ppo", "epochs": epochs, "batchSize": batch, "minibatchSize": minibatch},
                 dependencies="relaxed")
    assert steps_per_version(spec.algorithm) == steps
    assert fitted_max_lag(spec.algorithm) == bound
    assert spec.max_policy_lag == bound


def test_an_explicit_bound_wins_and_strict_and_dqn_keep_theirs():
    ppo = {"name": "ppo", "epochs": 4, "batchSize": 4096, "minibatchSize": 64}
    assert _spec(ppo, {"maxPolicyLag": 3}).max_policy_lag == 3
    assert _spec(ppo, dependencies="strict").max_policy_lag == 0
    assert _spec({"name": "dqn"}).max_policy_lag is None
    assert load_job(ACROBOT, ["spec.dependencies=relaxed"]).spec.max_policy_lag == 1
    assert load_job(ACROBOT).spec.max_policy_lag == 0  # auto runs it strict (below)


def test_overlap_lag_counts_queued_batches_and_unpublished_versions():
    ppo = {"name": "ppo", "batchSize": 64, "minibatchSize": 64}
    assert overlap_lag(_spec(ppo)) == 1
    assert overlap_lag(_spec(ppo, {"creditWindow": 2, "publishEvery": 3})) == 6
    assert overlap_lag(_spec({"name": "dqn"})) is None


HEAVY = {"name": "ppo", "epochs": 4, "batchSize": 4096, "minibatchSize": 64}  # 256 steps a version


@pytest.mark.parametrize("algorithm,extra,mode,why", [
    (HEAVY, {}, "strict", "256 optimizer steps"),
    ({**HEAVY, "minibatchSize": 128}, {}, "relaxed", "128 optimizer steps, under 256"),
    (HEAVY, {"staleness": {"maxPolicyLag": 2}}, "relaxed", "maxPolicyLag is set"),
    (HEAVY, {"topology": "auto"}, "relaxed", "not with topology: auto"),
    (HEAVY, {"topology": {"actors": 3}}, "relaxed", "cannot be split evenly"),
    (HEAVY, {"staleness": {"publishEvery": 2}}, "relaxed", "publishEvery must be 1"),
    ({"name": "dqn"}, {}, "relaxed", "dqn trains on replay"),
])
def test_auto_runs_strict_only_where_a_version_is_heavy_and_strict_fits(algorithm, extra, mode, why):
    staleness = extra.pop("staleness", None)
    spec = _spec(algorithm, staleness, **extra)
    assert spec.dependencies == "auto" and spec.dependency_mode == mode
    assert why in auto_dependencies(spec)[1]
    assert (spec.max_policy_lag == 0) == (mode == "strict")
    assert _spec(algorithm, staleness, dependencies="relaxed", **extra).dependency_mode == "relaxed"


def test_a_peers_large_versions_get_a_note_and_the_examples_none():
    (auto,) = staleness_notes(load_job(ACROBOT).spec)
    assert auto.startswith("dependencies: auto runs this job strict") and "256 optimizer steps" in auto
    (note,) = staleness_notes(load_job(ACROBOT, ["spec.dependencies=relaxed"]).spec)
    assert "256 optimizer steps" in note and "dependencies: strict" in note and "auto" not in note
    (kept,) = staleness_notes(load_job(ACROBOT, ["spec.staleness.maxPolicyLag=1"]).spec)
    assert kept.endswith("(dependencies: auto stays relaxed: staleness.maxPolicyLag is set)")
    assert staleness_notes(load_job(ACROBOT, ["spec.dependencies=strict"]).spec) == []
    for path in sorted(glob.glob(str(EXAMPLES / "*.yaml"))):  # what every user starts from: no noise
        spec = load_job(path).spec
        assert staleness_notes(spec) == [] and spec.dependency_mode == "relaxed", path


def test_a_planned_job_keeps_the_dependencies_its_plan_was_made_for():
    """topology: auto plans a relaxed job. On 2 cores the plan is one group of one actor, which
    strict could run: it stays relaxed, pinned. An explicit topology keeps `auto` (and its note)."""
    from tianji.control.planner.plan import resolve

    planned, _ = resolve(load_job(ACROBOT, ["spec.topology=auto", "spec.resources.cpus=2"]))
    t = planned.spec.topology
    assert (t.auto, t.groups, t.actors) == (False, 1, 1) and planned.spec.strict_misfit() is None
    assert planned.spec.dependencies == "relaxed"
    kept, _ = resolve(load_job(ACROBOT))
    assert kept.spec.dependencies == "auto" and kept.spec.dependency_mode == "strict"
    assert staleness_notes(kept.spec)[0].startswith("dependencies: auto runs this job strict")
