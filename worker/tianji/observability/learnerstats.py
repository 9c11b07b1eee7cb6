"""The job's learner statistics and lag distribution, from the reports the launcher already holds.

Torch-free (the launcher and the operator import it). Statistics are the mean over the current
learner processes of each one's latest value (gauges `learner_<name>`, control.report.LEARNER_STATS);
the lag histogram counts every consumed sample of the run by policy-lag bucket
(control.report.LAG_BOUNDS; key "inf": beyond the last bound).
"""
from __future__ import annotations

from typing import Optional

from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.rolereport import LAG_BOUNDS, LEARNER_STATS

HIST_KEYS = [*(str(b) for b in LAG_BOUNDS), "inf"]


def learner_stats(acc: Accounting) -> dict[str, float]:
    """{stat: mean over current learners that computed it} (PPO or DQN names, see LEARNER_STATS)."""
    got: dict[str, list[float]] = {}
    for (role, _, _), p in acc.procs.items():
        if role != "learner":
            continue
        for k in LEARNER_STATS:
            v = p.gauges.get("learner_" + k)
            if v is not None:
                got.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in got.items()}


def lag_histogram(acc: Accounting) -> Optional[dict[str, int]]:
    """{bucket upper bound: consumed samples}, the whole run (retired incarnations included)."""
    hist = acc.lag_hist()
    return None if hist is None else {k: int(n) for k, n in zip(HIST_KEYS, hist)}
