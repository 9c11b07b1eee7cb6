"""Staleness control end to end: the lag bound holds where samples are consumed, and exploration
survives restarts (the learner's global frame count travels with its parameters)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import EXAMPLES, read_summary, run_tianji

PPO = str(EXAMPLES / "cartpole-ppo.yaml")
DQN = str(EXAMPLES / "cartpole-dqn.yaml")


@pytest.mark.slow
def test_consumed_lag_never_exceeds_max_policy_lag(tmp_path):
    """maxPolicyLag 0 with four batches in flight: the buffer checks against the version of the
    learner's last credit, so every batch queued behind the first would be consumed one or more
    versions late; the learner's own check, against the version it is about to update, drops them."""
    run = tmp_path / "run"
    r = run_tianji("run", PPO, "--run-dir", str(run), "--quiet",
                   "--set", "spec.staleness.maxPolicyLag=0", "--set", "spec.staleness.creditWindow=4",
                   "--set", "spec.stop.seconds=40", "--set", "spec.stop.meanReturn=100000", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_summary(run)
    assert s["policy_version"] >= 3, s
    assert s["policy_lag"]["max"] == 0, s["policy_lag"]
    assert s["dropped_samples"].get("stale", 0) > 0, s["dropped_samples"]
    assert 0 < s["dropped_fraction"] <= 1


def _actor_epsilons(run_dir: Path) -> list[float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [p["epsilon"] for p in recs[-1]["processes"].values() if "epsilon" in p]


@pytest.mark.slow
def test_resumed_dqn_run_keeps_its_exploration_schedule(tmp_path):
    """Resumed at ~12k of 20k exploration frames, actors go on from the learner's count: their
    own count (restarted at 0) x 2 actors would still be below 12k after the resumed run's 4k frames."""
    run = tmp_path / "run"
    common = ["--quiet", "--set", "spec.algorithm.explorationFrames=20000", "--set", "spec.stop.meanReturn=100000",
              "--set", "spec.checkpoint.intervalSeconds=2", "--set", "spec.stop.seconds=200"]
    r = run_tianji("run", DQN, "--run-dir", str(run), *common, "--set", "spec.stop.envFrames=12000", timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    first = read_summary(run)
    r = run_tianji("run", "--resume", str(run), *common, "--set", "spec.stop.envFrames=16000", timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    eps = _actor_epsilons(run)
    assert len(eps) == 2, eps
    # epsilon = 1 - 0.96 * frames / 20000: after the learner's count (>= ~11k reached a buffer before
    # the last checkpoint), below 0.5; from the actors' own restarted counts it would be >= 0.61.
    assert max(eps) < 0.5, (eps, first["env_frames"])
    s = read_summary(run)
    assert s["replay_ratio"] is not None and abs(s["replay_ratio"] - 8) <= 1.0, s["replay_ratio"]
