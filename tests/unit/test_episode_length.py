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


def test_the_last_console_line_leads_with_the_mean_that_met_the_target():
    """After `ended (target)`, a mean below the target (the episodes that finished while the run
    stopped count too) would read as a miss: the line says which mean met the target."""
    from tianji.local.summary import ended_line

    s = {"env_frames": 90_000, "mean_return": 474.6, "mean_return_at_target": 475.2, "mean_episode_length": 474.6}
    line = ended_line("cartpole-ppo", "target", 31.0, s, "runs/x/summary.json")
    assert line == ("tianji: cartpole-ppo ended (target) after 31.0s: 90000 frames, mean return 475.2 at the target "
                    "(474.6 with the episodes that ended while it stopped), episode length 474.6; "
                    "summary: runs/x/summary.json")
    s.update(mean_return_at_target=None, mean_episode_length=None)
    assert ", mean return 474.6; summary:" in ended_line("cartpole-ppo", "frames", 31.0, s, "p")
