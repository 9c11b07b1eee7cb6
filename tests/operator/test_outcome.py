"""How a job's end is described (operator timers/outcome.py): the TargetReached condition and
status.endReason, from the stop rule's reason and the accounting at the end."""
from __future__ import annotations

import pytest

from kube.fakes import worker_report
from tianji.control.contracts.accounting import Accounting, StopRule
from tianji.control.contracts.rolereport import parse_report
from tianji.control.spec.run import StopConfig
from tianji_operator.timers.outcome import target_outcome


def accounting(returns: list[float], frames: float, version: int, evaluation: dict | None = None) -> Accounting:
    acc = Accounting()
    acc.take(parse_report(worker_report("j", "actor", 0, 0, episodes=returns, env_frames_total=frames), "j"))
    acc.take(parse_report(worker_report("j", "learner", 0, 0, version=version), "j"))
    if evaluation:
        acc.eval_last = evaluation
    return acc


def test_target_names_the_policy_and_the_confirming_evaluation():
    ev = {"return_mean": 500.0, "return_std": 0.0, "episodes": 20, "policy_version": 41, "env_frames": 9, "t": 1.0}
    acc = accounting([480.0] * 100, 9000, 41, ev)
    rule = StopRule(StopConfig(mean_return=475, env_frames=400_000))
    end, met, how = target_outcome(rule.check(acc, 30.0), rule, acc, 30.0)
    assert (end, met) == ("TargetReached", True)
    assert "mean return 480 >= stop.meanReturn 475" in how and "policy version 41" in how
    assert "last evaluation: mean return 500 over 20 episode(s) of policy version 41" in how


@pytest.mark.parametrize("returns,version,says", [
    ([193.0] * 100, 65, "mean return 193, below stop.meanReturn 475"),
    ([480.0] * 40, 65, "mean return 480 over 40 of the 100 episodes stop.meanReturn 475 needs"),
    ([480.0] * 100, 0, "with an untrained policy (version 0)"),
    ([], 5, "no finished episode yet against stop.meanReturn 475"),
])
def test_frame_budget_says_how_far_from_the_target(returns, version, says):
    acc = accounting(returns, 400_000, version)
    rule = StopRule(StopConfig(mean_return=475, env_frames=400_000))
    why = rule.check(acc, 132.0)
    assert why == "frames"
    end, met, how = target_outcome(why, rule, acc, 132.0)
    assert (end, met) == ("FrameBudget", False)
    assert how.startswith("400000 env frames >= stop.envFrames 400000 first: ") and says in how


def test_time_budget_without_a_target():
    acc = accounting([10.0] * 5, 100, 1)
    rule = StopRule(StopConfig(seconds=60))
    end, met, how = target_outcome(rule.check(acc, 61.0), rule, acc, 61.0)
    assert (end, met) == ("TimeBudget", False) and "the job has no stop.meanReturn" in how


def test_an_unknown_stop_reason_is_refused():
    with pytest.raises(ValueError, match="unknown stop reason"):
        target_outcome("bored", StopRule(StopConfig(seconds=1)), Accounting(), 1.0)
