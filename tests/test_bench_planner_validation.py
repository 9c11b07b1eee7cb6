"""bench/planner_validation.py without running anything: its random topologies are valid jobs the
model predicts, and its summary is the median / max / kind accuracy of the recorded points."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from tianji.control.onhost import predict_on_host
from tianji.control.plan import default_profile
from tianji.control.spec import load_job

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("planner_validation", ROOT / "bench" / "planner_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_drawn_topologies_are_valid_jobs_with_their_own_sync_mode(bench):
    rng = random.Random(3)
    drawn = [bench.draw(rng, ["ppo", "dqn"]) for _ in range(40)]
    assert {t["algo"] for t in drawn} == {"ppo", "dqn"} and {t["sync"] for t in drawn} == {"average", "allreduce"}
    for t in drawn:
        job = load_job(str(ROOT / bench.EXAMPLES[t["algo"]]), bench.base(30) + bench.point_sets(t))
        topo = job.spec.topology
        assert (topo.groups, topo.actors, job.spec.env.num_envs) == (t["groups"], t["actors"], t["num_envs"])
        assert topo.group_sync.mode == t["sync"] and job.spec.resources.learner.threads == t["threads"]
        assert t["groups"] > 1 or t["sync"] == "average"
        pred = predict_on_host(job, default_profile(job), 2.0, learner_threads=t["threads"])
        assert pred["consumed_sps"] > 0 and pred["group_sync"] == t["sync"]


def test_summary_counts_errors_and_kinds(bench):
    rows = [{"predicted": {"bottleneck": "sample-bound"}, "measured": {"bottleneck": "sample-bound"},
             "rel_error": {"produced_fps": 0.1, "consumed_sps": -0.3}},
            {"predicted": {"bottleneck": "communication-bound"}, "measured": {"bottleneck": "sample-bound"},
             "rel_error": {"produced_fps": 0.2, "consumed_sps": 0.5}},
            {"predicted": {"bottleneck": "sample-bound"}, "error": "no steady window"}]
    s = bench.summarise(rows)
    assert s == {"points_run": 2, "points_failed": 1, "median_abs_error": 0.25, "max_abs_error": 0.5,
                 "kind_accuracy": "1/2"}
