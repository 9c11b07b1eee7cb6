"""`tianji profile`: short measurements on CartPole that the planner can load."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tianji.control.planner.plan import Profile, plan
from tianji.control.spec import load_job
from tianji.runtime.profiling.profiler import candidate_batch_sizes, measure_profile

ROOT = Path(__file__).resolve().parents[2]


def _check(d: dict, job) -> Profile:
    p = Profile.from_json(d)
    assert p.actor_fps_per_core > 0 and p.learner_sps_per_core > 0
    assert p.message_seconds > 0 and p.bytes_per_sample > 0
    assert p.fragment_samples == job.spec.env.num_envs * job.spec.env.fragment_length
    assert d["actor"]["env_only_fps_per_core"] > 0
    assert str(job.spec.algorithm.batch_size) in d["learner"]["candidates"]
    assert json.loads(json.dumps(d)) == d  # plain JSON
    # What the cost model needs (issue 13): thread curve from 1 thread, the real parameter
    # message, all-reduce at 2+ ranks, loopback bandwidth.
    assert p.learner_thread_scaling[1] == 1.0 and all(v > 0 for v in p.learner_thread_scaling.values())
    params = sum(x.numel() for x in _model(job).parameters())
    assert 4 * params < p.param_bytes < 4 * params + 4096  # float32 arrays + a header
    assert 2 in p.allreduce_seconds and all(0 < s < 5 for s in p.allreduce_seconds.values())
    assert p.ipc_bytes_per_second > 1e7
    plan(job, cpus=4, profile=p)  # and the planner takes it
    return p


def _model(job):
    from tianji.algos.models import build_model
    from tianji.envs import probe_env

    return build_model(job.spec.algorithm.name, job.spec.model, probe_env(job.spec.env), 0)


def test_profile_cli_cartpole_ppo(tmp_path):
    from tianji.cli import main

    out = tmp_path / "profile.json"
    rc = main(["profile", str(ROOT / "examples" / "cartpole-ppo.yaml"), "--seconds", "0.5", "--out", str(out),
               "--set", "spec.algorithm.epochs=2"])
    assert rc == 0
    d = json.loads(out.read_text())
    job = load_job(ROOT / "examples" / "cartpole-ppo.yaml", ["spec.algorithm.epochs=2"])
    _check(d, job)
    assert d["learner_sps_per_gpu"] is None or d["learner_sps_per_gpu"] > 0
    assert set(d["learner"]["candidates"]) == {"128", "256", "512"}


def test_profile_cartpole_dqn():
    job = load_job(ROOT / "examples" / "cartpole-dqn.yaml")
    d = measure_profile(job, 0.5)
    p = _check(d, job)
    # a CartPole fragment: 4 float32 obs + action/reward/flags per step, plus a small header
    assert 20 < p.bytes_per_sample < 200


def test_candidates_respect_spec():
    job = load_job(ROOT / "examples" / "cartpole-ppo.yaml", ["spec.algorithm.batchSize=128",
                                                             "spec.algorithm.minibatchSize=128"])
    assert candidate_batch_sizes(job) == [128, 256]  # 64 is not a whole number of 128-sample fragments


def test_bad_seconds():
    job = load_job(ROOT / "examples" / "cartpole-ppo.yaml")
    with pytest.raises(ValueError):
        measure_profile(job, 0)
