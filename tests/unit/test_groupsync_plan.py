"""spec.topology.groupSync in the spec, the planner's cost terms and the resolved job pods read."""
from __future__ import annotations

import pytest

from tianji.control.planner import costmodel
from tianji.control.planner.plan import Profile, plan_for_job, resolve
from tianji.control.spec import parse_job


def job(groups=2, learners=2, mode=None, interval=None):
    topo = {"groups": groups, "actors": 2, "buffers": 2, "learners": learners}
    if mode or interval:
        topo["groupSync"] = {k: v for k, v in (("mode", mode), ("intervalUpdates", interval)) if v is not None}
    return parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "gs"},
                      "spec": {"topology": topo, "resources": {"cpus": 64}}})


# all-reduce expensive enough to see, everything else free
PROFILE = Profile(actor_fps_per_core=1e5, learner_sps_per_core=1000.0, learner_sps_per_gpu=None, message_seconds=0.0,
                  fragment_samples=256, bytes_per_sample=64.0, param_bytes=1e6, allreduce_seconds={2: 0.01, 4: 0.03},
                  ipc_bytes_per_second=1e12)


def test_group_sync_defaults_and_validation():
    gs = job().spec.topology.group_sync
    assert (gs.mode, gs.interval_updates) == ("average", 20)
    for bad in ({"mode": "gossip"}, {"intervalUpdates": 0}, {"intervalUpdates": 1.5}, {"interval": 3}):
        with pytest.raises(ValueError):
            parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "gs"},
                       "spec": {"topology": {"groupSync": bad}}})


def test_cost_terms_by_mode():
    assert costmodel.group_sync_terms(job(mode="allreduce"), 2, 2, 1e6) == (4, 4, 0.0)
    assert costmodel.group_sync_terms(job(mode="average", interval=10), 2, 2, 1e6) == (2, 4, 2e5)
    assert costmodel.group_sync_terms(job(mode="average"), 1, 3, 1e6) == (3, 3, 0.0)  # one group: the same


def test_average_mode_takes_the_cross_group_all_reduce_off_the_critical_path():
    sync = plan_for_job(job(mode="allreduce"), PROFILE)
    avg = plan_for_job(job(mode="average"), PROFILE)
    k = costmodel.gradient_steps(job())
    assert sync.allreduce_seconds == pytest.approx(k * 0.03)  # 4 ranks: every learner of both groups
    assert avg.allreduce_seconds == pytest.approx(k * 0.01)  # 2 ranks: a group's own learners
    assert avg.consumed_sps > sync.consumed_sps
    solo = plan_for_job(job(groups=1, mode="average"), PROFILE)
    assert solo.allreduce_seconds == pytest.approx(plan_for_job(job(groups=1, mode="allreduce"),
                                                                PROFILE).allreduce_seconds)


def test_resolved_job_keeps_group_sync_for_the_pods():
    doc = job(mode="allreduce", interval=7).to_manifest()
    doc["spec"]["topology"] = {"auto": True, "groupSync": {"mode": "allreduce", "intervalUpdates": 7}}
    resolved, _ = resolve(parse_job(doc))
    gs = resolved.spec.topology.group_sync
    assert not resolved.spec.topology.auto and (gs.mode, gs.interval_updates) == ("allreduce", 7)
