"""Throughput measurement and actor rescaling: the decision, PromQL, /metrics scraping, and the
operator's timer against a fake Prometheus and fake pods (deterministic clock)."""
from __future__ import annotations

import contextlib

import aiohttp
import pytest
from prometheus_client import generate_latest

from kube.fakes import FakePodMetrics, FakePrometheus
from kube.operator_harness import (JOBS, NAMESPACE, FakeClock, RunningOperator, eventually,
                           job_manifest, run_pods, start_cluster)
from tianji.observability.metrics import RoleMetrics
from tianji.control.plan import GroupThroughput
from tianji.control.spec import JobSpec
from tianji_operator import autoscaler as asc
from tianji_operator import rbac
from tianji_operator import status as st

STS = "apps/v1/statefulsets"


def _spec(**autoscale) -> JobSpec:
    a = {"enabled": True, "minActors": 1, "maxActors": 12, "band": 0.15, "cooldownSeconds": 30} | autoscale
    return JobSpec.model_validate({"autoscale": a, "staleness": {"paceActors": False}})


def _obs(produced, consumed, actors, received=None):
    return {0: GroupThroughput(produced_fps=produced, received_sps=produced if received is None else received,
                               consumed_sps=consumed, actors=actors)}


# ----------------------------------------------------------------- the decision
def test_production_below_consumption_scales_up():
    d = asc.decide(_spec(), _obs(500, 2000, 2), {0: 2}, None, now=100.0)
    assert d.kind == "up" and d.desired == {0: 6}  # x = 0.25: n/x - n = 6, at most max_step = 4
    assert "group 0: 2 -> 6 actors" in d.message and "500.0 frames/s < needed 2000.0" in d.message


def test_within_the_band_nothing_changes():
    for produced in (1800, 2000, 2250):
        d = asc.decide(_spec(), _obs(produced, 2000, 4), {0: 4}, None, now=100.0)
        assert d.kind == "unchanged" and d.desired == {0: 4}


def test_overproduction_scales_down_but_not_below_min():
    d = asc.decide(_spec(minActors=3), _obs(8000, 2000, 4), {0: 4}, None, now=100.0)
    assert d.kind == "down" and d.desired == {0: 3}


def test_bounds_are_respected_and_enforced():
    d = asc.decide(_spec(maxActors=5), _obs(100, 2000, 4), {0: 4}, None, now=100.0)
    assert d.desired == {0: 5}
    d = asc.decide(_spec(maxActors=5), _obs(2000, 2000, 9), {0: 9}, last_rescale=99.0, now=100.0)
    assert d.kind == "bounds" and d.desired == {0: 5}  # outside the bounds: clamped, cooldown or not


def test_cooldown_holds_a_change_back():
    d = asc.decide(_spec(), _obs(500, 2000, 2), {0: 2}, last_rescale=80.0, now=100.0)
    assert d.kind == "cooldown" and d.desired == {0: 2} and "10 s left" in d.message
    d = asc.decide(_spec(), _obs(500, 2000, 2), {0: 2}, last_rescale=70.0, now=100.0)
    assert d.kind == "up"


def test_a_communication_bound_group_gets_no_more_actors():
    d = asc.decide(_spec(), _obs(500, 2000, 2, received=100), {0: 2}, None, now=100.0)
    assert d.kind == "unchanged"


def test_paced_actors_aim_at_headroom_times_need():
    spec = JobSpec.model_validate({"autoscale": {"enabled": True}, "staleness": {"paceHeadroom": 1.3}})
    assert asc.target_ratio(spec) == pytest.approx(1 / 1.3)
    d = asc.decide(spec, _obs(1300, 1000, 4), {0: 4}, None, now=0.0)  # paced at headroom: balanced
    assert d.kind == "unchanged"


# ----------------------------------------------------------------- PromQL and /metrics
def test_promql_selects_the_job_role_and_window():
    q = asc.promql_queries("cp", "ns", "2m")
    assert q["produced"] == 'sum by (group) (rate(tianji_env_frames_total{job="cp",namespace="ns",role="actor"}[2m]))'
    assert 'role="buffer"' in q["received"] and "tianji_samples_received_total" in q["received"]
    assert 'role="learner"' in q["consumed"] and "tianji_samples_consumed_total" in q["consumed"]
    q = asc.promql_queries("cp", "ns", "1m", job_label="exported_job", namespace_label="")
    assert '{exported_job="cp",role="actor"}' in q["frames_total"]


def test_the_workers_metrics_parse():
    """The names the operator scrapes are the ones tianji.observability.metrics exports."""
    m = RoleMetrics("cp", "actor", 0, 1)
    m.inc("env_frames_total", 640)
    m.inc("episodes_total", 3)
    m.set("episode_return_mean", 120.5)
    values = asc.parse_metrics(generate_latest(m.registry).decode())
    assert values["tianji_env_frames_total"] == 640 and values["tianji_episodes_total"] == 3
    assert values["tianji_episode_return_mean"] == 120.5
    learner = RoleMetrics("cp", "learner", 0, 0)
    learner.inc("samples_consumed_total", 1000)
    learner.set("policy_version", 7)
    learner.observe_lag([1, 2, 3])
    values = asc.parse_metrics(generate_latest(learner.registry).decode())
    assert values["tianji_samples_consumed_total"] == 1000 and values["tianji_policy_version"] == 7
    assert values["tianji_policy_lag_count"] == 1 and values["tianji_policy_lag_sum"] == 2


def _exposition(role: str, group: int, index: int, **counters) -> str:
    m = RoleMetrics("cp", role, group, index)
    for name, v in counters.items():
        if name in ("policy_version", "episode_return_mean"):
            m.set(name, v)
        else:
            m.inc(name, v)
    return generate_latest(m.registry).decode()


def _pod(name, role, group, ip, uid=None):
    return {"metadata": {"name": name, "uid": uid or name,
                         "labels": {"tianji.dev/role": role, "tianji.dev/group": str(group)}},
            "status": {"phase": "Running", "podIP": ip}}


async def test_scraping_differences_counters_into_rates():
    ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    async with FakePodMetrics(ips) as pods, aiohttp.ClientSession() as http:
        listing = [_pod("a0", "actor", 0, ips[0]), _pod("b0", "buffer", 0, ips[1]), _pod("l0", "learner", 0, ips[2])]
        state = asc.ScrapeState()
        pods.text = {ips[0]: _exposition("actor", 0, 0, env_frames_total=1000),
                     ips[1]: _exposition("buffer", 0, 0, samples_received_total=900),
                     ips[2]: _exposition("learner", 0, 0, samples_consumed_total=500, policy_version=3)}
        first = await asc.scrape_pods(http, listing, pods.port, state, 100.0, "tianji.dev/role", "tianji.dev/group")
        assert first is None  # a rate needs two samples
        pods.text = {ips[0]: _exposition("actor", 0, 0, env_frames_total=3000, episodes_total=2,
                                         episode_return_mean=42.0),
                     ips[1]: _exposition("buffer", 0, 0, samples_received_total=2900),
                     ips[2]: _exposition("learner", 0, 0, samples_consumed_total=4500, policy_version=9)}
        obs = await asc.scrape_pods(http, listing, pods.port, state, 110.0, "tianji.dev/role", "tianji.dev/group")
    assert obs.groups == {0: {"produced": 200.0, "received": 200.0, "consumed": 400.0}}
    assert obs.frames_total == 3000 and obs.policy_version == 9 and obs.mean_return == 42.0
    assert obs.source == "scrape" and pods.hits == {ip: 2 for ip in ips}


async def test_scraping_unreachable_pods_is_an_error():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:
        with pytest.raises(asc.MetricsError):
            await asc.scrape_pods(http, [_pod("a0", "actor", 0, "127.0.0.9")], 1, asc.ScrapeState(), 1.0,
                                  "tianji.dev/role", "tianji.dev/group")


# ----------------------------------------------------------------- the operator's timer
@pytest.fixture
async def env():
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        prom = await stack.enter_async_context(FakePrometheus())
        clock = FakeClock()
        op = await stack.enter_async_context(RunningOperator(kube, clock=clock))
        yield kube, prom, clock, op
    calls = kube.api_calls("kopf/") | kube.api_calls("tianji-operator")
    assert all(rbac.allows(*c) for c in calls), sorted(c for c in calls if not rbac.allows(*c))


def _status(kube, name="cartpole"):
    return (kube.obj(JOBS, NAMESPACE, name) or {}).get("status") or {}


def _replicas(kube, group=0, name="cartpole"):
    return kube.obj(STS, NAMESPACE, f"{name}-actor-{group}")["spec"]["replicas"]


async def _evaluated(kube, clock, decision=None):
    """Wait for an evaluation at the current (fake) time; return its record."""
    def done():
        ev = (_status(kube).get("autoscale") or {}).get("lastEvaluation") or {}
        return ev.get("time") == st.iso(clock.t) and (decision is None or ev["decision"] == decision) and ev
    return await eventually(done, what=f"an autoscale evaluation ({decision}) at {st.iso(clock.t)}")


async def _running_job(kube, prom, autoscale: dict, spec: dict | None = None, clock=None):
    """Create the job, play its pods to Running; with `clock`, also wait until the operator has
    sampled the metrics at the current time (the next sample then needs clock.advance())."""
    a = {"enabled": True, "prometheusUrl": prom.url, "minActors": 1, "maxActors": 12, "band": 0.15,
         "cooldownSeconds": 30, "intervalSeconds": 10} | autoscale
    await kube.create_job(job_manifest("cartpole", {"autoscale": a, "staleness": {"paceActors": False},
                                                     **(spec or {})}))
    await eventually(lambda: kube.obj(STS, NAMESPACE, "cartpole-actor-0"), what="the actor StatefulSet")
    await run_pods(kube, "cartpole")
    await eventually(lambda: _status(kube).get("phase") == "Running", what="phase Running")
    if clock is not None:
        await eventually(lambda: (_status(kube).get("throughput") or {}).get("time") == st.iso(clock.t),
                         what="a first sample")


async def test_scale_up_cooldown_and_again(env):
    kube, prom, clock, op = env
    await _running_job(kube, prom, {}, clock=clock)  # no series yet: nothing to decide
    prom.values.update(produced={0: 500}, received={0: 500}, consumed={0: 2000}, frames_total=1e6,
                       policy_version=12, mean_return=55.5, policy_lag=1.5)
    clock.advance(10)
    rec = await _evaluated(kube, clock, "up")
    await eventually(lambda: _replicas(kube) == 6, what="6 actors")
    s = _status(kube)
    assert rec["actors"] == {"0": 6}
    assert s["autoscale"]["lastRescaleTime"] == st.iso(clock.t)
    assert s["throughput"]["framesPerSecond"] == 500 and s["throughput"]["samplesConsumedPerSecond"] == 2000
    assert s["throughput"]["framesTotal"] == 1000000 and s["throughput"]["source"] == "prometheus"
    assert s["policyVersion"] == 12 and s["meanReturn"] == 55.5 and s["policyLag"] == 1.5
    rescaled = next(c for c in s["conditions"] if c["type"] == "Rescaled")
    assert rescaled["status"] == "True" and rescaled["reason"] == "ScaledUp" and "2 -> 6" in rescaled["message"]
    await eventually(lambda: [e for e in kube.live("v1/events") if e.get("reason") == "Rescaled"])
    assert any('job="cartpole"' in q and f'namespace="{NAMESPACE}"' in q for q in prom.queries)

    clock.advance(10)  # still short of production, but inside the 30 s cooldown
    rec = await _evaluated(kube, clock, "cooldown")
    assert _replicas(kube) == 6 and "cooldown" in rec["message"]

    clock.advance(25)  # past the cooldown
    await _evaluated(kube, clock, "up")
    await eventually(lambda: _replicas(kube) == 10, what="10 actors")
    assert op.metrics.value("tianji_operator_rescale_decisions_total", decision="up") == 2
    assert op.metrics.value("tianji_operator_rescale_decisions_total", decision="cooldown") >= 1


async def test_in_band_unchanged_then_overproduction_scales_down_to_min(env):
    kube, prom, clock, op = env
    prom.values.update(produced={0: 2100}, received={0: 2100}, consumed={0: 2000})
    await _running_job(kube, prom, {"minActors": 2}, {"topology": {"actors": 4}}, clock=clock)
    clock.advance(10)
    await _evaluated(kube, clock, "unchanged")
    assert _replicas(kube) == 4
    prom.values.update(produced={0: 9000}, received={0: 9000})
    clock.advance(10)
    await _evaluated(kube, clock, "down")
    await eventually(lambda: _replicas(kube) == 2, what="2 actors (minActors)")
    assert next(c for c in _status(kube)["conditions"] if c["type"] == "Rescaled")["reason"] == "ScaledDown"


async def test_bounds_hold_against_edits_and_manual_scaling(env):
    kube, prom, clock, op = env
    prom.values.update(produced={0: 2000}, received={0: 2000}, consumed={0: 2000})
    await _running_job(kube, prom, {"maxActors": 12}, {"topology": {"actors": 10}}, clock=clock)
    assert _replicas(kube) == 10
    await kube.patch_job("cartpole", {"spec": {"autoscale": {"maxActors": 8}}})  # mutable: applied at once
    await eventually(lambda: _replicas(kube) == 8, what="clamped to maxActors")
    code, _ = await kube.api("PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/cartpole-actor-0",
                             {"spec": {"replicas": 20}})  # someone scales by hand
    assert code == 200
    clock.advance(10)
    await _evaluated(kube, clock, "bounds")
    await eventually(lambda: _replicas(kube) == 8, what="clamped again")


async def test_autoscaling_off_still_reports_throughput(env):
    kube, prom, clock, op = env
    prom.values.update(produced={0: 100}, received={0: 100}, consumed={0: 2000}, frames_total=5000)
    await _running_job(kube, prom, {"enabled": False}, clock=clock)
    clock.advance(10)
    await eventually(lambda: (_status(kube).get("throughput") or {}).get("time") == st.iso(clock.t))
    assert _status(kube)["throughput"]["framesPerSecond"] == 100
    assert _replicas(kube) == 2 and "autoscale" not in _status(kube)


async def test_prometheus_errors_change_nothing(env):
    kube, prom, clock, op = env
    prom.fail = True
    await _running_job(kube, prom, {})
    clock.advance(10)
    await eventually(lambda: op.metrics.value("tianji_operator_errors_total", where="metrics") >= 1)
    assert _replicas(kube) == 2 and "throughput" not in _status(kube)
    assert _status(kube)["phase"] == "Running"


async def test_reaching_the_mean_return_target_ends_the_job(env):
    kube, prom, clock, op = env
    prom.values.update(produced={0: 2000}, received={0: 2000}, consumed={0: 2000}, mean_return=480.0)
    await _running_job(kube, prom, {"enabled": False}, {"stop": {"meanReturn": 475}})
    clock.advance(10)
    await eventually(lambda: _status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    progressing = next(c for c in _status(kube)["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "JobSucceeded" and "mean return 480" in progressing["message"]
    await eventually(lambda: _replicas(kube) == 0, what="actors scaled to 0 (cleanPodPolicy Running)")


async def test_scraping_pods_without_prometheus(env):
    kube, prom, clock, op = env
    ips = {"cartpole-learner-0-0": "127.0.0.5", "cartpole-buffer-0-0": "127.0.0.6",
           "cartpole-actor-0-0": "127.0.0.7", "cartpole-actor-0-1": "127.0.0.8"}
    async with FakePodMetrics(list(ips.values())) as pods:  # every pod's :metrics, on one port
        a = {"enabled": True, "minActors": 1, "maxActors": 12, "cooldownSeconds": 30, "intervalSeconds": 10}
        await kube.create_job(job_manifest("cartpole", {"autoscale": a, "staleness": {"paceActors": False},
                                                         "network": {"metricsPort": pods.port}}))
        await eventually(lambda: kube.obj(STS, NAMESPACE, "cartpole-actor-0"))
        for i in range(2):  # play the StatefulSet controller: its two actor pods
            await kube.put_object("v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"cartpole-actor-0-{i}", "namespace": NAMESPACE,
                "labels": {"tianji.dev/job": "cartpole", "tianji.dev/role": "actor", "tianji.dev/group": "0"}}})

        def serve(frames: float, received: float, consumed: float) -> None:
            pods.text[ips["cartpole-actor-0-0"]] = _exposition("actor", 0, 0, env_frames_total=frames / 2)
            pods.text[ips["cartpole-actor-0-1"]] = _exposition("actor", 0, 1, env_frames_total=frames / 2)
            pods.text[ips["cartpole-buffer-0-0"]] = _exposition("buffer", 0, 0, samples_received_total=received)
            pods.text[ips["cartpole-learner-0-0"]] = _exposition("learner", 0, 0, samples_consumed_total=consumed)

        serve(1, 1, 1)
        await run_pods(kube, "cartpole", ips=ips)
        await eventually(lambda: _status(kube).get("phase") == "Running")
        await eventually(lambda: all(n >= 1 for n in pods.hits.values()), what="a first scrape of every pod")
        serve(5001, 5001, 20001)  # over the next 10 s: 500 frames/s produced, 2000 samples/s consumed
        clock.advance(10)
        await _evaluated(kube, clock, "up")
        await eventually(lambda: _replicas(kube) == 6)
        thr = _status(kube)["throughput"]
        assert thr["source"] == "scrape" and thr["framesPerSecond"] == 500
        assert thr["samplesConsumedPerSecond"] == 2000 and thr["framesTotal"] == 5001
