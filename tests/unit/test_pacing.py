"""Actor pacing feedback (runtime/pacing.py) and the wire checks on what carries it (runtime/validate.py)."""
from __future__ import annotations

import pytest

from tianji.control.spec import parse_job
from tianji.runtime.pacing import MAX_HEADROOM, MIN_HEADROOM, HeadroomController, startup_frames
from tianji.runtime.validate import check_feedback, check_frames, check_headroom
from tianji.runtime.wire import WireError


def simulate(capacity: float, periods: int, h0: float = 1.2) -> tuple[float, float]:
    """A learner that takes `capacity` samples a period; production beyond it is dropped.
    Returns (drop fraction, learner idle fraction) over the last half of the run."""
    c = HeadroomController(h0)
    drops = received = idle = 0.0
    for t in range(periods):
        produced = capacity * c.headroom
        dropped = max(0.0, produced - capacity)
        u = max(0.0, 1 - produced / capacity)
        if t >= periods // 2:
            drops, received, idle = drops + dropped, received + produced, idle + u
        c.update(int(produced), int(dropped), u)
    return drops / received, idle / (periods - periods // 2)


def test_waste_is_cut_below_the_target_without_starving_the_learner():
    d, idle = simulate(1000.0, 200, h0=2.0)
    assert d < 0.05
    assert idle < 0.2


def test_a_starved_learner_speeds_actors_up_and_waste_slows_them_down():
    c = HeadroomController(1.2)
    assert c.update(1000, 0, idle_fraction=0.5) > 1.2
    h = c.headroom
    assert c.update(1000, 300, idle_fraction=0.0) < h
    for _ in range(100):
        c.update(1000, 1000, 0.0)
    assert c.headroom == MIN_HEADROOM
    for _ in range(100):
        c.update(1000, 0, 1.0)
    assert c.headroom == MAX_HEADROOM


def test_startup_budget_is_what_the_learner_can_use_when_it_starts():
    ppo = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                     "spec": {"algorithm": {"name": "ppo", "batchSize": 256},
                              "env": {"numEnvs": 4, "fragmentLength": 32},
                              "staleness": {"maxPolicyLag": 3, "creditWindow": 1}}}).spec
    assert startup_frames(ppo, 2) == (3 + 1 + 1) * 256 // 2
    dqn = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "x"},
                     "spec": {"algorithm": {"name": "dqn", "learningStarts": 1000, "batchSize": 64,
                                            "stepsPerBatch": 16}, "env": {"numEnvs": 4, "fragmentLength": 16},
                              "staleness": {"replayRatio": 8}}}).spec
    assert startup_frames(dqn, 2) == int((1000 + (1024 + 64 * 8) / 8) // 2)


@pytest.mark.parametrize("meta", [
    {"buffer": 0, "received": -1}, {"buffer": 0, "dropped": 2.5}, {"buffer": 0, "fragments": True},
    {"buffer": 0, "received": 1 << 41}, {"buffer": 0, "evil": 1}, {"buffer": 0, "dropped": float("nan")},
])
def test_hostile_batch_feedback_is_rejected(meta):
    with pytest.raises(WireError):
        check_feedback(meta)


def test_honest_batch_feedback_passes():
    check_feedback({"buffer": 0, "received": 1024, "dropped": 2048, "fragments": 8})  # old fragments aged out
    check_feedback({"buffer": 1})


@pytest.mark.parametrize("h", [float("nan"), float("inf"), -1.0, 0.0, 11.0, True, "2"])
def test_hostile_headroom_is_rejected(h):
    with pytest.raises(WireError):
        check_headroom(h)


@pytest.mark.parametrize("f", [-1, 1.5, 1 << 60, True, "9", float("inf")])
def test_hostile_global_frames_are_rejected(f):
    with pytest.raises(WireError):
        check_frames(f)


def test_honest_pacing_values_pass():
    assert check_headroom(1.2) == 1.2 and check_headroom(None) is None
    assert check_frames(123_456) == 123_456 and check_frames(None) is None


def test_the_credit_window_defaults_to_one_batch_for_ppo_and_two_for_dqn():
    """A second PPO batch queued behind the one in training is consumed a version later: with a peer's
    4096-sample batches that doubled the mean lag (docs/ablation.md). DQN's batches are replay draws."""
    def spec(algo, **staleness):
        return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "w"},
                          "spec": {"algorithm": {"name": algo}, "staleness": staleness}}).spec

    assert spec("ppo").credit_window == 1 and spec("dqn").credit_window == 2
    assert spec("ppo", creditWindow=3).credit_window == 3 and spec("dqn", creditWindow=1).credit_window == 1
    # what the actors may produce before the learner's first update follows it
    assert startup_frames(spec("ppo", creditWindow=3), 1) - startup_frames(spec("ppo"), 1) == 2 * 256
