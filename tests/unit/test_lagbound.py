"""The default policy-lag bound fits the batch (a budget in optimizer steps), and the notes on
staleness settings that imply heavy drops or heavy lag (control/spec/lagbound.py)."""
from __future__ import annotations

import glob

import pytest

from helpers import EXAMPLES, ROOT
from tianji.control.spec import load_job, parse_job
from tianji.control.spec.lagbound import fitted_max_lag, overlap_lag, staleness_notes, steps_per_version

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
    spec = _spec({"name": "ppo", "epochs": epochs, "batchSize": batch, "minibatchSize": minibatch})
    assert steps_per_version(spec.algorithm) == steps
    assert fitted_max_lag(spec.algorithm) == bound
    assert spec.max_policy_lag == bound


def test_an_explicit_bound_wins_and_strict_and_dqn_keep_theirs():
    ppo = {"name": "ppo", "epochs": 4, "batchSize": 4096, "minibatchSize": 64}
    assert _spec(ppo, {"maxPolicyLag": 3}).max_policy_lag == 3
    assert _spec(ppo, dependencies="strict").max_policy_lag == 0
    assert _spec({"name": "dqn"}).max_policy_lag is None
    assert load_job(ACROBOT).spec.max_policy_lag == 1


def test_overlap_lag_counts_queued_batches_and_unpublished_versions():
    ppo = {"name": "ppo", "batchSize": 64, "minibatchSize": 64}
    assert overlap_lag(_spec(ppo)) == 1
    assert overlap_lag(_spec(ppo, {"creditWindow": 2, "publishEvery": 3})) == 6
    assert overlap_lag(_spec({"name": "dqn"})) is None


def test_a_peers_large_versions_get_a_note_and_the_examples_none():
    (note,) = staleness_notes(load_job(ACROBOT).spec)
    assert "256 optimizer steps" in note and "dependencies: strict" in note
    assert staleness_notes(load_job(ACROBOT, ["spec.dependencies=strict"]).spec) == []
    for path in sorted(glob.glob(str(EXAMPLES / "*.yaml"))):  # what every user starts from: no noise
        assert staleness_notes(load_job(path).spec) == [], path


def test_a_bound_below_the_overlap_says_most_samples_will_be_dropped():
    ppo = {"name": "ppo", "batchSize": 64, "minibatchSize": 64}
    (note,) = staleness_notes(_spec(ppo, {"maxPolicyLag": 1, "creditWindow": 2}))
    assert "dropped as stale" in note and "maxPolicyLag 1" in note
    assert staleness_notes(_spec({"name": "dqn"}, {"maxPolicyLag": 0})) == []
