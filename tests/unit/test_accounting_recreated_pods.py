"""Frames, samples and steps counted once across pod re-creations of every role, replayed as the
operator receives them: each pod's /report (cumulative counts of its process), the final report
the old container left (termination message) arriving before, after or twice around its
successor's reports, and the operator's state saved and restored between any two of them.

A re-created pod's process is a new incarnation whose counters start at 0; the job total is what
every incarnation counted, never one incarnation's total twice, and the status never grows
faster than the processes counted."""
from __future__ import annotations

import itertools

import pytest

from tianji.control.contracts.accounting import TOTALS, Accounting
from tianji.control.contracts.rolereport import build_report, parse_report
from tianji.observability.metrics import RoleMetrics

T0 = 1_800_000_000.0
COUNTER = {role: counter for role, counter in TOTALS.values()}


def report(role: str, incarnation: str, started: float, seq: int, count: float, final: bool = False):
    m = RoleMetrics("j", role, 0, 0)
    m.inc(COUNTER[role], count)
    return parse_report(build_report(job="j", role=role, group=0, index=0, incarnation=incarnation, pid=1,
                                     started=started, seq=seq, time=started + seq, final=final,
                                     snapshot=m.snapshot(), episodes_total=0, recent=[],
                                     extra={"version": 0, "checkpoint": "ckpt-1.pt"} if role == "learner" else {}),
                        "j")


def total(acc: Accounting, role: str) -> float:
    return acc.role_totals(role).get(COUNTER[role], 0.0)


def replay(steps: list, restore_after: set[int]) -> list[float]:
    acc, seen = Accounting(), []
    for i, (rep, role) in enumerate(steps):
        acc.take(rep)
        seen.append(total(acc, role))
        if i in restore_after:  # an operator restart: the state from the status
            acc = Accounting(acc.state())
            assert total(acc, role) == seen[-1]
    return seen


@pytest.mark.parametrize("role", ["actor", "buffer", "learner"])
@pytest.mark.parametrize("order", ["final-first", "final-late", "final-twice"])
@pytest.mark.parametrize("restart_at", [None, 1, 2, 3])
def test_a_recreated_pod_is_counted_once(role, order, restart_at):
    """Old incarnation: 1000 then 1500 scraped, 1600 in its final report. New one: 200, 700."""
    old = [report(role, "old", T0, 1, 1000), report(role, "old", T0, 2, 1500)]
    final = report(role, "old", T0, 3, 1600, final=True)
    new = [report(role, "new", T0 + 30, 1, 200), report(role, "new", T0 + 30, 2, 700)]
    seq = {"final-first": old + [final] + new,
           "final-late": old + [new[0], final, new[1]],
           "final-twice": old + [final, new[0], final, new[1], final]}[order]
    seen = replay([(r, role) for r in seq], {restart_at} if restart_at is not None else set())
    assert seen[-1] == 1600 + 700
    assert all(b >= a for a, b in itertools.pairwise(seen)), f"went backwards: {seen}"


def test_a_pod_recreated_again_and_again_counts_each_incarnation_once():
    acc, expect = Accounting(), 0.0
    for k in range(5):
        inc, start = f"a{k}", T0 + 10 * k
        for seq, count in enumerate((300, 800), start=1):
            acc.take(report("actor", inc, start, seq, count))
        acc.take(report("actor", inc, start, 3, 900, final=True))
        expect += 900
        acc = Accounting(acc.state())
    # every final report once more (each pod's terminated state seen by another tick)
    for k in range(5):
        acc.take(report("actor", f"a{k}", T0 + 10 * k, 3, 900, final=True))
    assert total(acc, "actor") == expect == 4500
