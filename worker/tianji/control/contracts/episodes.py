"""What one episode of a job's env can be, so that a report of an episode it cannot produce is
refused (an actor runs user env code: its reports are claims). Torch- and Gymnasium-free: the
operator and the local launcher apply the same bounds.

Where the bounds come from, first that applies:
1. `spec.env.episodeBounds` (maxSteps, rewardPerStep [low, high]), declared by the user;
2. `tianji run` only: what the env declares to Gymnasium (runtime/validate.episode_bounds);
3. BUILTIN: Gymnasium's classic-control envs as their docs and code define them, only with no
   env.imports (a module could register another env under the same id), no wrappers and no
   kwargs but max_episode_steps.
None of them: the episode is not bounded (Atari, custom envs without a declaration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

# id: (time limit in steps, per-step reward low, high); Gymnasium 1.x, default kwargs.
BUILTIN: dict[str, tuple[int, float, float]] = {
    "CartPole-v0": (200, 0.0, 1.0),
    "CartPole-v1": (500, 0.0, 1.0),
    "Acrobot-v1": (500, -1.0, 0.0),
    "MountainCar-v0": (200, -1.0, 0.0),
    "Pendulum-v1": (200, -16.2736044, 0.0),
}


@dataclass(frozen=True)
class EpisodeBounds:
    """What one episode of the env can be: at most `max_steps` steps (its time limit), each reward
    within [reward_low, reward_high] (its declared per-step range). None: not declared."""

    max_steps: Optional[int] = None
    reward_low: Optional[float] = None
    reward_high: Optional[float] = None

    def problem(self, ret: float, length: Optional[int]) -> Optional[str]:
        """Why an episode (return, length in steps) cannot come from this env; None if it can."""
        if not math.isfinite(ret):
            return f"return {ret} is not finite"
        if length is None:  # a report without lengths: only the return's own bounds apply
            length = self.max_steps
            if length is None:
                return None
        elif length < 1 or self.max_steps is not None and length > self.max_steps:
            return f"episode length {length} outside 1..{self.max_steps}"
        tol = 1e-6 * max(1.0, abs(ret))
        if self.reward_high is not None and ret > length * self.reward_high + tol:
            return f"return {ret:g} > {length} steps x {self.reward_high:g} per step"
        if self.reward_low is not None and ret < length * self.reward_low - tol:
            return f"return {ret:g} < {length} steps x {self.reward_low:g} per step"
        return None

    def refusal(self, recent: Any) -> Optional[str]:
        """Why a report's recent episodes ((finish time, return[, length]) each) cannot all come
        from this env; None if they can."""
        for ep in recent:
            if (why := self.problem(ep[1], ep[2] if len(ep) > 2 else None)) is not None:
                return why
        return None

    def merged(self, over: EpisodeBounds) -> EpisodeBounds:
        """These bounds with every field `over` declares taking its place."""
        return EpisodeBounds(
            over.max_steps if over.max_steps is not None else self.max_steps,
            over.reward_low if over.reward_low is not None else self.reward_low,
            over.reward_high if over.reward_high is not None else self.reward_high,
        )


def declared(cfg: Any) -> EpisodeBounds:
    """`spec.env.episodeBounds`, as bounds (none declared: unbounded)."""
    d = getattr(cfg, "episode_bounds", None)
    if d is None:
        return EpisodeBounds()
    low, high = d.reward_per_step if d.reward_per_step is not None else (None, None)
    return EpisodeBounds(d.max_steps, low, high)


def builtin(cfg: Any) -> EpisodeBounds:
    """A classic-control env's documented bounds (3. in the module docstring), else unbounded."""
    row = BUILTIN.get(cfg.id)
    if row is None or cfg.imports or cfg.wrappers or set(cfg.kwargs) - {"max_episode_steps"}:
        return EpisodeBounds()
    steps = cfg.kwargs.get("max_episode_steps", row[0])
    ok = isinstance(steps, int) and not isinstance(steps, bool) and steps > 0
    return EpisodeBounds(steps if ok else None, row[1], row[2])


def without_gym(cfg: Any) -> EpisodeBounds:
    """The bounds the operator applies: the built-in table, then what the spec declares."""
    return builtin(cfg).merged(declared(cfg))
