"""bench/planner_validation.py without running anything: its random topologies are valid jobs the
model predicts, and its summary is the median / max / kind accuracy of the recorded points."""
from __future__ import annotations

import functools
import random

from bench import planner_validation as pv
from bench.harness import ROOT
from tianji.control.planner.plan import default_profile
from tianji.control.planner.sharedhost import predict_on_host
from tianji.control.spec import load_job


def test_drawn_topologies_are_valid_jobs_with_their_own_sync_mode():
    rng = random.Random(3)
    drawn = [pv.draw(rng, ["ppo", "dqn"]) for _ in range(40)]
    assert {t["algo"] for t in drawn} == {"ppo", "dqn"} and {t["sync"] for t in drawn} == {"average", "allreduce"}
    for t in drawn:
        job = load_job(str(ROOT / pv.EXAMPLES[t["algo"]]), pv.base(30) + pv.point_sets(t))
        topo = job.spec.topology
        assert (topo.groups, topo.actors, job.spec.env.num_envs) == (t["groups"], t["actors"], t["num_envs"])
        assert topo.group_sync.mode == t["sync"] and job.spec.resources.learner.threads == t["threads"]
        assert t["groups"] > 1 or t["sync"] == "average"
        pred = predict_on_host(job, default_profile(job), 2.0, learner_threads=t["threads"])
        assert pred["consumed_sps"] > 0 and pred["group_sync"] == t["sync"]


def test_summary_counts_errors_and_kinds():
    rows = [{"predicted": {"bottleneck": "sample-bound"}, "measured": {"bottleneck": "sample-bound"},
             "rel_error": {"produced_fps": 0.1, "consumed_sps": -0.3}},
            {"predicted": {"bottleneck": "communication-bound"}, "measured": {"bottleneck": "sample-bound"},
             "rel_error": {"produced_fps": 0.2, "consumed_sps": 0.5}},
            {"predicted": {"bottleneck": "sample-bound"}, "error": "no steady window"}]
    s = pv.summarise(rows)
    assert s == {"points_run": 2, "points_failed": 1, "median_abs_error": 0.25, "max_abs_error": 0.5,
                 "kind_accuracy": "1/2"}


def test_the_quiet_gate_refuses_a_busy_machine_and_waits_out_its_own_load(monkeypatch, capsys):
    cores = __import__("os").cpu_count() or 1
    loads = iter([9.0 * cores, 0.2 * cores])  # the previous point's load, then decayed
    monkeypatch.setattr(pv.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(pv.time, "sleep", lambda s: None)
    assert pv.quiet(0.5, 90.0, "a point") == round(0.2 * cores, 2)
    monkeypatch.setattr(pv.os, "getloadavg", lambda: (9.0 * cores, 0.0, 0.0))
    try:
        pv.quiet(0.5, 0.0, "point 3")
        raise AssertionError("a busy machine passed the gate")
    except pv.NotQuiet as e:
        assert f"> {0.5 * cores:g} (--max-load 0.5 per core" in str(e) and "point 3" in str(e)
    # main refuses before it profiles or runs anything: exit 2, a message, no report.
    assert pv.main(["--n", "1", "--settle-s", "0"]) == 2
    captured = capsys.readouterr()
    assert "refused: 1-minute load average" in captured.err and captured.out == ""


def test_the_warm_up_runs_the_first_point_untimed_and_reports_it_apart(monkeypatch):
    calls = []
    monkeypatch.setattr(pv.scaling, "run_point",
                        lambda path, sets, seconds: calls.append((path, sets, seconds)) or
                        {"produced_fps": 10.04, "consumed_sps": 9.96, "received_fps": 1.0})
    t = {"algo": "dqn", "groups": 2, "actors": 3, "num_envs": 8, "threads": 1, "sync": "average"}
    out = pv.warm_up(t, 25.0)
    (path, sets, seconds), = calls
    assert path.endswith("examples/cartpole-dqn.yaml") and seconds == pv.WARMUP_S
    assert sets == pv.base(25.0) + pv.point_sets(t)  # the first point's own job, so its code paths are warm
    assert out == {"topology": t, "seconds": pv.WARMUP_S, "produced_fps": 10.0, "consumed_sps": 10.0}
    monkeypatch.setattr(pv.scaling, "run_point", lambda path, sets, seconds: {"error": "no steady window"})
    assert pv.warm_up(t, 25.0) == {"topology": t, "seconds": pv.WARMUP_S, "error": "no steady window"}


def test_each_point_is_predicted_from_a_profile_taken_after_its_gate(monkeypatch):
    """The host's speed drifts between minutes: a point's profile comes after its quiet gate,
    fresh per point by default, and once per algorithm and envs with `--profile once`."""
    events, measured = [], iter(range(100))
    monkeypatch.setattr("tianji.runtime.profiling.profiler.measure_profile",
                        lambda job, seconds: events.append("profile") or
                        default_profile(job).to_json() | {"learner_sps_per_core": 1000.0 + next(measured)})
    monkeypatch.setattr(pv.scaling, "probe_background", lambda: 0.0)
    monkeypatch.setattr(pv.scaling, "run_point", lambda path, sets, seconds: events.append("run") or
                        {"produced_fps": 100.0, "consumed_sps": 100.0, "received_fps": 100.0, "seconds": 10.0,
                         "shares": {"learner": 0.9}})
    monkeypatch.setattr(pv.scaling, "measured_kind", lambda meas, r: "sample-bound")
    gate = lambda what: events.append("gate") or 0.1  # noqa: E731
    t = {"algo": "ppo", "groups": 1, "actors": 2, "num_envs": 4, "threads": 1, "sync": "average"}
    for fresh, want in ((True, [1000.0, 1001.0]), (False, [1002.0, 1002.0])):
        cache, events[:] = {}, []
        rows = [pv.run_one(t, functools.partial(pv.profile_for, cache, t, 25.0, fresh), 25.0, gate) for _ in range(2)]
        assert [r["profile"]["learner_sps_per_core"] for r in rows] == want
        assert events == (["gate", "profile", "run"] * 2 if fresh else ["gate", "profile", "run", "gate", "run"])
        assert rows[0]["measured"]["shares"] == {"learner": 0.9}
    # --rescore re-predicts from each point's own profile: this model gives back its own predictions.
    recorded = {"points": rows, "seconds_per_point": 25.0, "host": {"cpus": pv.os.cpu_count()}, "command": "c"}
    again = pv.rescore(recorded)
    assert [r["predicted"] for r in again["points"]] == [r["predicted"] for r in rows]
    assert again["points_run"] == 2 and again["recorded_median_abs_error"] is None
