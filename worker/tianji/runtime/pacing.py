"""Actor pacing feedback: how much faster than the learner's capacity actors should produce.

The learner advertises its capacity C (samples per busy second) and a
headroom h with each parameter publish; an actor produces at most
C / replayRatio * h / actors frames/s (control/planner/plan.pace_fps). A fixed h
either wastes (production the learner cannot take ages out and is dropped as
stale, or is refused by the replay limiter) or starves the learner. So h is
driven by what the learner observes over each control period:

    drop fraction d = samples dropped / samples received by its buffers
                      (stale, overflow, replay-ratio refusals, and its own stale drops)
    idle fraction u = share of the period the learner had no batch to train on

    d > 0.8 target            h <- h * max(1 - 2d, 1 / 2)     (waste: slow down, harder the more)
    else u > starved          h <- h * (1 + u / 2)            (the learner waits: speed up, harder the more)
    then h is clamped to [MIN_HEADROOM, MAX_HEADROOM]

Aiming under the target keeps the steady-state drop fraction under it
while the idle rule keeps the learner fed. Pure and socket-free (tested directly).
"""
from __future__ import annotations

MIN_HEADROOM = 0.5
MAX_HEADROOM = 4.0
DROP_TARGET = 0.05  # the stale-drop fraction to stay under at steady state
STARVED = 0.15  # idle share of a period above which the learner counts as starved


class HeadroomController:
    def __init__(self, headroom: float, target: float = DROP_TARGET, starved: float = STARVED):
        if not 0 < target < 1:
            raise ValueError(f"target must be in (0, 1), got {target!r}")
        self.headroom = min(MAX_HEADROOM, max(MIN_HEADROOM, float(headroom)))
        self.target, self.starved = target, starved

    def update(self, received: int, dropped: int, idle_fraction: float) -> float:
        """One control period's observations in, the new headroom out."""
        d = dropped / received if received > 0 else 0.0
        if d > 0.8 * self.target:
            self.headroom *= max(1.0 - 2 * d, 0.5)
        elif idle_fraction > self.starved:
            self.headroom *= 1.0 + min(idle_fraction, 1.0) / 2
        self.headroom = min(MAX_HEADROOM, max(MIN_HEADROOM, self.headroom))
        return self.headroom


def startup_frames(spec, peers: int) -> int:
    """Frames an actor may produce before its learner has advertised a capacity (is training).

    Production before the first update is only worth what the learner can still use once it
    starts: PPO, the batches of the first maxPolicyLag + 1 versions plus those in flight
    (creditWindow); DQN, the replay warm-up plus what the limiter lets in before the first
    sample (replayErrorBuffer / replayRatio). Shared among the `peers` actors of that learner;
    anything beyond would be dropped (stale, overflow, ratio) while the learner starts up.
    """
    a = spec.algorithm
    if a.name == "ppo":
        total = (spec.max_policy_lag if spec.max_policy_lag is not None else 4) + 1 + spec.credit_window
        samples = total * a.batch_size
    else:
        lim = spec.replay_limiter()
        samples = lim.min_size_to_sample + lim.error_buffer / lim.samples_per_insert
    return max(spec.env.num_envs * spec.env.fragment_length, int(samples // max(peers, 1)))
