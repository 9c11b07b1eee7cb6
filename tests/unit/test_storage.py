"""Buffer storage and return math on hand-made fragments."""
import numpy as np
import pytest
import torch

from tianji.algos.ppo import gae
from tianji.runtime.storage import Replay, RolloutQueue, nstep_transitions


def fragment(T=4, N=1, version=0, done_at=None, terminated=True):
    obs = np.arange(T * N, dtype=np.float32).reshape(T, N, 1)
    dones = np.zeros((T, N), bool)
    valid = np.ones((T, N), bool)
    if done_at is not None:
        dones[done_at, 0] = True
        if done_at + 1 < T:
            valid[done_at + 1, 0] = False  # NEXT_STEP autoreset: the step after a done is a reset step
    return {"obs": obs, "actions": np.zeros((T, N), np.int64), "rewards": np.ones((T, N), np.float32),
            "dones": dones, "terminated": dones & terminated, "valid": valid,
            "last_obs": np.full((N, 1), 100.0, np.float32), "version": version}


def test_one_step_transitions_bootstrap_and_terminal():
    tr = nstep_transitions(fragment(done_at=1), n=1, gamma=0.9)
    # steps 0, 1, 3 are transitions; step 2 is the reset step
    assert len(tr["actions"]) == 3
    np.testing.assert_allclose(tr["discounts"], [0.9, 0.0, 0.9])
    np.testing.assert_allclose(tr["next_obs"][:, 0], [1.0, 2.0, 100.0])


def test_truncation_bootstraps_from_final_observation():
    tr = nstep_transitions(fragment(done_at=1, terminated=False), n=1, gamma=0.9)
    assert tr["discounts"][1] == pytest.approx(0.9)  # truncated: not terminal
    assert tr["next_obs"][1, 0] == 2.0  # the final observation, not the reset one


def test_n_step_returns_stop_at_episode_and_fragment_end():
    tr = nstep_transitions(fragment(T=5), n=3, gamma=0.5)
    np.testing.assert_allclose(tr["returns"], [1.75, 1.75, 1.75, 1.5, 1.0])
    np.testing.assert_allclose(tr["discounts"], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_allclose(tr["next_obs"][:, 0], [3, 4, 100, 100, 100])
    tr = nstep_transitions(fragment(T=5, done_at=1), n=3, gamma=0.5)
    np.testing.assert_allclose(tr["returns"][:2], [1.5, 1.0])
    np.testing.assert_allclose(tr["discounts"][:2], [0.0, 0.0])


def test_rollout_queue_serves_freshest_and_drops_stale():
    q = RolloutQueue(max_fragments=3)
    for v in range(3):
        q.put(fragment(version=v))
    assert q.put(fragment(version=3)) == 4  # bound: the oldest (4 samples) goes
    assert q.drop_stale(learner_version=5, max_lag=3) == 4  # version 1 is 4 behind
    b = q.pop_batch(2)
    np.testing.assert_array_equal(b["versions"], [3, 2])
    assert b["obs"].shape == (4, 2, 1) and b["last_obs"].shape == (2, 1)
    assert q.pop_batch(1) is None


def test_replay_ring_overwrites_oldest():
    r = Replay(capacity=5, seed=0)
    r.put(nstep_transitions(fragment(T=4), 1, 0.9))
    r.put(nstep_transitions(fragment(T=4, version=1), 1, 0.9))
    assert len(r) == 5
    assert sorted(r.data["versions"].tolist()) == [0, 1, 1, 1, 1]
    assert r.sample(64)["obs"].shape == (64, 1)


def test_gae_cuts_at_done_and_bootstraps_last_value():
    T, N = 3, 1
    r = torch.ones(T, N)
    v = torch.zeros(T, N)
    last = torch.full((N,), 10.0)
    d = torch.tensor([[0.0], [1.0], [0.0]])
    adv = gae(r, v, last, d, d, gamma=0.5, lam=1.0)
    # t=2: 1 + 0.5*10 = 6; t=1 terminal: 1; t=0: 1 + 0.5*1 = 1.5 (value 0 at t=1)
    np.testing.assert_allclose(adv[:, 0].numpy(), [1.5, 1.0, 6.0])


def test_rollout_queue_is_capped_in_bytes_too():
    from tianji.runtime.storage import RolloutQueue, fragment_nbytes

    def frag(n):
        return {"obs": np.zeros((4, n, 4), np.float32), "valid": np.ones((4, n), bool),
                "last_obs": np.zeros((n, 4), np.float32), "version": 0}

    one = fragment_nbytes(frag(2))
    q = RolloutQueue(1000, max_bytes=3 * one)
    dropped = sum(q.put(frag(2)) for _ in range(10))
    assert len(q) == 3 and q.nbytes == 3 * one and dropped == 7 * 8
    q.pop_batch(2)
    assert q.nbytes == one
