"""How a job ended: at its target, or on a budget below it — `status.endReason` (a printer column)
and the TargetReached condition, written with the end.

    endReason  TargetReached | FrameBudget | TimeBudget (Succeeded: which stop rule held)
               PodFailed | BackoffLimitExceeded | DeadlineExceeded | ... (Failed: its reason)
    TargetReached condition
               True   the mean of the last 100 episodes met stop.meanReturn; the message names the
                      policy version and checkpoint that did it, and the last periodic evaluation
                      (spec.evaluation) when there is one: the check on the saved policy itself
               False  a budget (stop.envFrames, stop.seconds) was spent first: reason FrameBudget
                      or TimeBudget, the message the mean return against the target (or that the
                      job has no stop.meanReturn)

A budget end is still Succeeded (the job did what its spec asked); TargetReached=False is what
says the target was not met, so `kubectl get tjj` and `kubectl wait
--for=condition=TargetReached` tell the two apart.
"""

from __future__ import annotations

from typing import Optional

from tianji.control.contracts.accounting import Accounting, StopRule
from tianji.control.contracts.rolereport import WINDOW

END_REASONS = {"target": "TargetReached", "frames": "FrameBudget", "seconds": "TimeBudget"}


def _evaluation(acc: Accounting) -> str:
    last = acc.eval_last
    if not last:
        return ""
    return (
        f"; last evaluation: mean return {last['return_mean']:.4g} over {last['episodes']} episode(s) "
        f"of policy version {last['policy_version']}"
    )


def target_outcome(why: str, rule: StopRule, acc: Accounting, elapsed: float) -> tuple[str, bool, str]:
    """(endReason, target met, message) for a job the stop rule ends with `why`
    ("target" | "frames" | "seconds")."""
    if why not in END_REASONS:
        raise ValueError(f"unknown stop reason {why!r}")
    reason = END_REASONS[why]
    if why == "target":
        return reason, True, rule.message(why, acc, elapsed) + _evaluation(acc)
    target: Optional[float] = rule.stop.mean_return
    mean = acc.mean_return()
    if target is None:
        where = "the job has no stop.meanReturn"
    elif mean is None:
        where = f"no finished episode yet against stop.meanReturn {target:g}"
    elif len(acc.window) < WINDOW:
        where = (
            f"mean return {mean:.4g} over {len(acc.window)} of the {WINDOW} episodes stop.meanReturn {target:g} needs"
        )
    elif mean < target:
        where = f"mean return {mean:.4g}, below stop.meanReturn {target:g}"
    else:  # the mean is there but no learner has trained (version 0): no result
        where = f"mean return {mean:.4g} with an untrained policy (version {acc.policy_version()})"
    return reason, False, f"{rule.message(why, acc, elapsed)} first: {where}{_evaluation(acc)}"
