"""What the planner maximises, and the budget rule a user states (spec.plan.minMarginalGain).

Effective progress E = consumed samples/s · efficiency (costmodel.py: efficiency = 1 /
(ρ · lag cost), ρ the measured batch curve's frames-to-target ratio); the predicted time to
target is proportional to 1/E. Left alone, E keeps rising with every synchronised learner added
while ρ grows slower than the learners, so "the most E the budget buys" can be a plan that
spends 40× the cores for 2× the progress. A plan's resources are R = cores/M + GPUs/G (the
share of each given resource it uses; GPUs only when G > 0), and with x = minMarginalGain the
budget rule is

    a plan using k = R_Q/R_P times the resources of a smaller plan P is worth it only if
    E_Q ≥ k^x · E_P        (x = 0.5: doubling the resources must buy ≥ 41 % more progress)

The planner takes the plan with the highest score E / R^x, which satisfies the rule against
every smaller plan and leaves no bigger plan that does. Consequences, stated:
- it never proposes a plan whose predicted E is below that of a smaller plan it considered
  (that plan's score would be higher);
- x = 0: the most effective progress the budget buys; x = 1: the most per resource.

Staleness first: plans whose expected policy lag exceeds spec.maxPolicyLag are dropped when
any plan meets it (the buffer would discard their samples). The rule decides to the last
digit: a bigger plan that buys what x asks is taken, however close the call (the user's goal is
time to a trained model on the resources given), and only exact ties go to the fewest
resources, then learners, then processes. A runner-up whose score is within NEAR_BEST of the
plan's is said to be so: the model's figures cannot tell the two apart.
`choose` also names the runners-up (the nearest smaller and bigger plans on the E-versus-R
frontier, the most-progress plan, the best plan dropped for lag) and why each lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from tianji.control.planner.search import Candidate

NEAR_BEST = 0.02  # scores this close are a call the model cannot resolve (said, not acted on)
_EPS = 1e-9


def resources(c: Candidate, cpus: float, gpus: int) -> float:
    """R: the share of the given cores, plus of the given GPUs, that the plan uses."""
    return c.cores / cpus + (c.gpus / gpus if gpus else 0.0)


def score(c: Candidate, cpus: float, gpus: int, x: float) -> float:
    return c.effective / resources(c, cpus, gpus) ** x


@dataclass(frozen=True)
class Choice:
    chosen: Candidate
    eligible: tuple  # the candidates the budget rule chose among (after the lag filter)
    runners_up: tuple  # dicts: topology, resources, predictions, `lost` (why)


def _lag_ok(cands: list[Candidate], max_lag) -> list[Candidate]:
    if max_lag is None:
        return cands
    return [c for c in cands if c.pred["expected_policy_lag"] <= max_lag] or cands


def frontier(cands, cpus: float, gpus: int) -> list[Candidate]:
    """Plans no other plan beats with fewer or equal resources (E rising with R)."""
    out, best = [], 0.0
    for c in sorted(cands, key=lambda c: (resources(c, cpus, gpus), -c.effective)):
        if c.effective > best * (1 + _EPS):
            out.append(c)
            best = c.effective
    return out


def choose(cands: list[Candidate], cpus: float, gpus: int, x: float, max_lag=None) -> Choice:
    """The plan the budget rule picks from `cands` (non-empty), and its runners-up."""
    eligible = _lag_ok(cands, max_lag)
    best = max(score(c, cpus, gpus, x) for c in eligible)
    pool = [c for c in eligible if score(c, cpus, gpus, x) >= (1 - _EPS) * best]

    def smallest(c: Candidate) -> tuple:  # resources, then learners, then processes
        s = c.shape
        return round(resources(c, cpus, gpus), 9), s.g * s.nl, s.g * (s.na + s.nb + s.nl), -c.effective

    chosen = min(pool, key=smallest)
    return Choice(chosen, tuple(eligible), tuple(_runners_up(chosen, eligible, cands, cpus, gpus, x, max_lag)))


def _describe(c: Candidate, chosen: Candidate, lost: str) -> dict:
    s = c.shape
    return {
        "topology": {"groups": s.g, "actors": s.na, "buffers": s.nb, "learners": s.nl},
        "actor_cpu": s.ca,
        "buffer_cpu": s.cb,
        "learner_cpu": s.cl,
        "learner_gpu": s.gl,
        "cpus_used": c.cores,
        "gpus_used": c.gpus,
        "consumed_sps": c.pred["consumed_sps"],
        "efficiency": c.pred["efficiency"],
        "effective_sps": c.effective,
        "expected_policy_lag": c.pred["expected_policy_lag"],
        "bottleneck": c.pred["bottleneck"],
        "time_to_target_vs_plan": chosen.effective / c.effective if c.effective > 0 else None,
        "lost": lost,
    }


def close_call(alt: Candidate, c: Candidate, cpus: float, gpus: int, x: float) -> str:
    """A note when `alt` lost to `c` by less than NEAR_BEST of the score: within the model's noise."""
    if score(alt, cpus, gpus, x) >= score(c, cpus, gpus, x) * (1 - NEAR_BEST):
        return f" (within {NEAR_BEST:.0%} of it: a call the model cannot resolve; the rule keeps the smaller plan)"
    return ""


def _why(c: Candidate, chosen: Candidate, cpus: float, gpus: int, x: float) -> str:
    """Why `c` lost to `chosen` under the budget rule, in the rule's own terms."""
    rc, rp = resources(c, cpus, gpus), resources(chosen, cpus, gpus)
    if score(c, cpus, gpus, x) >= score(chosen, cpus, gpus, x) * (1 - _EPS):
        return "scores as the plan does; the planner keeps the one with fewer resources"
    if rc > rp:
        k, gain = rc / rp, c.effective / chosen.effective - 1
        close = close_call(c, chosen, cpus, gpus, x)
        return f"{gain:+.0%} progress for {k:.2g}x resources; minMarginalGain {x:g} asks {k**x - 1:+.0%}{close}"
    k, gain = rp / rc, chosen.effective / c.effective - 1
    return f"the plan buys {gain:+.0%} progress for {k:.2g}x resources; minMarginalGain {x:g} asks {k**x - 1:+.0%}"


def _runners_up(chosen, eligible, cands, cpus, gpus, x, max_lag) -> list[dict]:
    front = [c for c in frontier(eligible, cpus, gpus) if c is not chosen]
    rp = resources(chosen, cpus, gpus)
    smaller = [c for c in front if resources(c, cpus, gpus) <= rp][-2:]
    bigger = [c for c in front if resources(c, cpus, gpus) > rp]
    picked = smaller + bigger[:2] + ([bigger[-1]] if len(bigger) > 2 else [])
    out = [_describe(c, chosen, _why(c, chosen, cpus, gpus, x)) for c in picked]
    kept = {id(c) for c in eligible}
    dropped = [c for c in cands if id(c) not in kept and c.effective > chosen.effective]
    if dropped:
        d = max(dropped, key=lambda c: c.effective)
        out.append(
            _describe(
                d,
                chosen,
                f"expected policy lag {d.pred['expected_policy_lag']:.1f} > maxPolicyLag "
                f"{max_lag}: its samples would be dropped",
            )
        )
    return out
