"""The live rebalance (operator autoscaler and the planner's model) fed rates recorded from real runs.

Fixtures: two metrics.jsonl records (the steady window's first and last) of a real
`tianji run examples/cartpole-dqn.yaml`, recorded with

    tianji run examples/cartpole-dqn.yaml --max-seconds 40 --quiet --run-dir R \\
        --set spec.staleness.replayRatio=R --set spec.staleness.paceActors=P --set spec.topology.actors=N

(the overrides are in each fixture's "set"). Per-role counters and the learner's
advertised capacity (samples per busy second) are what the operator reads from reports.
"""
from __future__ import annotations

import json
from pathlib import Path

from tianji.control.planner.plan import SAMPLE_BOUND, TRAINING_BOUND, GroupThroughput, observed_bottleneck
from tianji.control.spec import load_job
from tianji_operator.timers import autoscaler as asc

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


COUNTER = {"actor": ("frames", "env_frames_total"), "buffer": ("received", "samples_received_total"),
           "learner": ("consumed", "samples_consumed_total")}


def _report(name: str, p: dict, seq: int, t: float):
    """What the process `name` reported with the recorded counters (build_report, parse_report)."""
    from tianji.control.contracts.rolereport import build_report, parse_report
    from tianji.observability.metrics import RoleMetrics

    role, group, index = name.split("-")
    m = RoleMetrics("cartpole-dqn", role, int(group), int(index))
    key, counter = COUNTER[role]
    m.inc(counter, p[key])
    extra = {"version": int(p["version"] or 0), "capacity_sps": p["capacity_sps"]} if role == "learner" else {}
    d = build_report(job="cartpole-dqn", role=role, group=int(group), index=int(index), incarnation="i", pid=1,
                     started=1.0, seq=seq, time=t, final=False, snapshot=m.snapshot(), episodes_total=0,
                     recent=[], extra=extra)
    return parse_report(d, "cartpole-dqn")


def _recorded(name: str, with_capacity: bool = True):
    """The fixture's two records through the operator's report path: Accounting → from_accounting."""
    from tianji.control.contracts.accounting import Accounting

    fx = json.loads((HERE / "fixtures" / name).read_text())
    acc = Accounting()
    assert asc.from_accounting(acc) is None  # no window yet
    for seq, row in enumerate(fx["rows"], 1):
        for pname, p in row["processes"].items():
            acc.take(_report(pname, p if with_capacity else {**p, "capacity_sps": None}, seq, row["t"]))
        acc.sample(row["t"])
    obs = asc.from_accounting(acc)
    actors = {0: sum(1 for n in fx["rows"][1]["processes"] if n.startswith("actor-0-"))}
    spec = load_job(ROOT / "examples" / "cartpole-dqn.yaml",
                    fx["set"] + ["spec.autoscale.enabled=true", "spec.autoscale.maxActors=12"]).spec
    return spec, obs.throughput(actors)


def _distance(o: GroupThroughput, actors: int, r: float) -> float:
    """|production with `actors` (at the measured per-actor rate) − what the learner can take / r|."""
    need = max(o.capacity_sps or 0.0, o.consumed_sps) / r
    return abs(o.produced_fps / o.actors * actors - need)


def test_a_sample_bound_run_gets_more_actors_toward_balance():
    spec, observed = _recorded("rates-dqn-sample-bound.json")
    o = observed[0]
    r = asc.target_ratio(spec)
    assert observed_bottleneck(o, r, spec.autoscale.band) == SAMPLE_BOUND
    current = {0: o.actors}
    d = asc.decide(spec, observed, current, None, now=0.0)
    assert d.kind == "up" and d.desired[0] > o.actors
    assert _distance(o, d.desired[0], r) < _distance(o, o.actors, r)
    assert o.capacity_sps > o.consumed_sps  # the learner could take more than it gets
    # Balanced: the new count's production is within the band of what the learner can take.
    assert abs(o.produced_fps / o.actors * d.desired[0] / (o.capacity_sps / r) - 1) <= spec.autoscale.band


def test_an_overproducing_run_loses_actors_toward_balance():
    spec, observed = _recorded("rates-dqn-overproducing.json")
    o = observed[0]
    r = asc.target_ratio(spec)
    assert observed_bottleneck(o, r, spec.autoscale.band) == TRAINING_BOUND
    d = asc.decide(spec, observed, {0: o.actors}, None, now=0.0)
    assert d.kind == "down" and d.desired[0] < o.actors
    assert _distance(o, d.desired[0], r) < _distance(o, o.actors, r)


