"""Episode length (issue 25): counted by the actor's rollout in env steps, the reset step of
Gymnasium's NEXT_STEP autoreset not counted, and reported with each episode's return."""
from __future__ import annotations

from helpers import EXAMPLES
from tianji.control.spec import load_job
from tianji.runtime.rollout import Rollout


def test_a_cartpole_episode_is_as_long_as_its_return():
    """CartPole pays 1 per step: every finished episode's length equals its return, also for the
    episodes that started on an autoreset step (a miscounted reset step would add 1)."""
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.env.numEnvs=4", "spec.env.fragmentLength=64"])
    r = Rollout(job.spec, seed=5)
    try:
        finished = [ep for _ in range(6) for ep in r.fragment()[1]]
    finally:
        r.close()
    assert len(finished) > 20  # a random policy drops the pole in ~20 steps: many restarts
    assert all(isinstance(n, int) and n == ret for ret, n in finished), finished
