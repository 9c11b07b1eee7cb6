"""Counting and actor rescaling: the decision, PromQL, pods' reports, and the operator's timers
against a fake Prometheus and fake pods (deterministic clock)."""
from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest

from kube.fakes import FakePodMetrics, FakePrometheus, worker_report
from kube.operator_harness import (
    JOBS,
    NAMESPACE,
    FakeClock,
    RunningOperator,
    eventually,
    job_manifest,
    job_with_report_pods,
    run_pods,
    start_cluster,
)
from tianji.control.contracts.accounting import Accounting
from tianji.control.contracts.rolereport import ReportError
from tianji.control.planner.plan import GroupThroughput
from tianji.control.spec import JobSpec
from tianji_operator import rbac
from tianji_operator import status as st
from tianji_operator.timers import autoscaler as asc
from tianji_operator.timers.podreports import scrape_reports, terminated_reports

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


# ----------------------------------------------------------------- PromQL and reports
def test_promql_selects_the_job_role_and_window():
    q = asc.promql_queries("cp", "ns", "2m")
    assert q["produced"] == 'sum by (group) (rate(tianji_env_frames_total{job="cp",namespace="ns",role="actor"}[2m]))'
    assert 'role="buffer"' in q["received"] and "tianji_samples_received_total" in q["received"]
    assert 'role="learner"' in q["consumed"] and "tianji_samples_consumed_total" in q["consumed"]
    q = asc.promql_queries("cp", "ns", "1m", job_label="exported_job", namespace_label="")
    assert '{exported_job="cp",role="actor"}' in q["produced"]


def _pod(role, group, index, ip):
    """A running pod as the operator makes it: a learner's index is a label, an actor's its ordinal."""
    labels = {"tianji.dev/role": role, "tianji.dev/group": str(group)}
    if role != "actor":
        labels["tianji.dev/index"] = str(index)
    return {"metadata": {"name": f"cp-{role}-{group}-{index}", "labels": labels},
            "status": {"phase": "Running", "podIP": ip}}


async def test_reports_are_read_from_running_pods_and_validated():
    ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    async with FakePodMetrics(ips) as pods, aiohttp.ClientSession() as http:
        listing = [_pod("actor", 0, 0, ips[0]), _pod("learner", 0, 0, ips[1]), _pod("actor", 0, 1, ips[2]),
                   _pod("actor", 0, 2, ips[3])]
        pods.reports = {ips[0]: worker_report("cp", "actor", 0, 0, env_frames_total=1000, episodes=[10.0, 12.0]),
                        ips[1]: worker_report("cp", "learner", 0, 0, samples_consumed_total=500, version=3),
                        ips[2]: {**worker_report("cp", "actor", 0, 1), "counts": {"env_frames_total": float("nan")}},
                        # an actor pod reporting as the learner (mean 500, version 10^6): not counted
                        ips[3]: worker_report("cp", "learner", 0, 0, seq=9, version=10 ** 6, episodes=[500.0] * 100)}
        reports, errors = await scrape_reports(http, listing, pods.port, "cp")
        assert sorted(r.name for r in reports) == ["actor-0-0", "learner-0-0"]
        assert len(errors) == 2 and errors[0].startswith("cp-actor-0-1: bad report") and "env_frames_total" in errors[0]
        assert "a report as learner-0-0 from actor-0-2" in errors[1], errors
        # A report of another job is refused, not counted.
        _, errors = await scrape_reports(http, listing[:1], pods.port, "other-job")
        assert "not 'other-job'" in errors[0]
    acc = Accounting()
    for r in reports:
        acc.take(r)
    assert acc.totals()["env_frames"] == 1000 and acc.episodes_total == 2 and acc.policy_version() == 3


def test_an_actor_report_of_episodes_its_env_cannot_produce_is_refused_and_counted():
    """The operator has no Gymnasium: it bounds episodes by the classic-control table and by
    spec.env.episodeBounds (control/contracts/episodes.py), as `tianji run` does."""
    from tianji.control.contracts import episodes
    from tianji.control.contracts.rolereport import parse_report
    from tianji_operator.context import JobMemory

    def memory(env: dict) -> JobMemory:
        mem = JobMemory()
        mem.accounting({})
        mem.bounds = episodes.without_gym(JobSpec.model_validate({"env": env}).env)
        return mem

    def report(seq: int, returns: list[float], lengths: list[int] = ()):
        return parse_report(worker_report("cp", "actor", 0, 0, seq=seq, episodes=returns, lengths=lengths,
                                          env_frames_total=1000.0 * seq), "cp")

    mem = memory({"id": "CartPole-v1"})  # at most 500 steps, 0..1 a step
    mem.take(report(1, [500.0] * 100, [10] * 100))  # 500 in 10 steps
    mem.take(report(2, [600.0] * 100))  # no lengths: 600 > 500 steps x 1
    mem.take(report(3, [40.0], [600]))  # longer than the time limit
    assert mem.acc.rejected == 3 and mem.acc.episodes_total == 0 and mem.acc.totals()["env_frames"] == 0
    assert all(": return: " in e for e in mem.report_errors[-3:]), mem.report_errors
    mem.take(report(4, [200.0, 500.0], [200, 500]))  # what CartPole can do
    assert mem.acc.episodes_total == 2 and mem.acc.rejected == 3
    # A custom env: only what the spec declares bounds it; without a declaration, nothing does.
    mem = memory({"id": "my.envs:Maze", "episodeBounds": {"maxSteps": 50, "rewardPerStep": [-1, 0]}})
    mem.take(report(1, [1.0], [5]))
    assert mem.acc.rejected == 1
    mem = memory({"id": "my.envs:Maze"})
    mem.take(report(1, [1e6], [5]))
    assert mem.acc.rejected == 0 and mem.acc.episodes_total == 1
    # A module in env.imports may re-register a classic id: the table does not apply then.
    assert episodes.without_gym(JobSpec.model_validate({"env": {"id": "CartPole-v1", "imports": ["my.envs"]}}).env) \
        == episodes.EpisodeBounds()
    with pytest.raises(ValueError, match="low <= high"):
        JobSpec.model_validate({"env": {"episodeBounds": {"rewardPerStep": [1, 0]}}})


def test_rates_from_reports_need_a_window_newer_than_the_last_evaluation():
    """The autoscale timer may tick before the monitor has counted: a zero-length window, or one
    the previous decision already used, is no observation (it would read as zero production)."""
    from tianji.control.contracts.rolereport import parse_report

    acc = Accounting()
    for seq, t, frames in ((1, 0.0, 100), (2, 0.0, 100), (3, 10.0, 5100)):
        acc.take(parse_report(worker_report("cp", "actor", 0, 0, seq=seq, env_frames_total=frames), "cp"))
        acc.sample(t)
        if t == 0.0:
            assert asc.from_accounting(acc) is None  # two samples, but no time between them
    obs = asc.from_accounting(acc, after=0.0)
    assert obs is not None and obs.groups[0]["produced"] == pytest.approx(500.0)
    assert asc.from_accounting(acc, after=10.0) is None  # nothing counted since the evaluation at 10 s


async def test_an_unreachable_pod_is_an_error_not_a_zero():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:
        reports, errors = await scrape_reports(http, [_pod("actor", 0, 0, "127.0.0.9")], 1, "cp")
    assert reports == [] and errors and errors[0].startswith("cp-actor-0-0:")


def test_a_termination_message_is_a_final_report():
    rep = worker_report("cp", "actor", 0, 0, env_frames_total=77, final=True)
    pod = {**_pod("actor", 0, 0, "127.0.0.2"), "status": {"containerStatuses": [
        {"state": {"terminated": {"exitCode": 0, "message": json.dumps(rep)}}},
        {"lastState": {"terminated": {"exitCode": 137, "message": "not json"}}}]}}
    got = list(terminated_reports(pod, "cp"))
    assert got[0].final and got[0].counts["env_frames_total"] == 77
    assert isinstance(got[1], ReportError) and "termination message" in str(got[1])
    pod["metadata"]["name"] = "cp-actor-0-1"  # another actor's final report: not this pod's
    assert isinstance(next(terminated_reports(pod, "cp")), ReportError)


# ----------------------------------------------------------------- the operator's timer
@pytest.fixture
async def env():
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        prom = await stack.enter_async_context(FakePrometheus())
        clock = FakeClock()
        op = await stack.enter_async_context(RunningOperator(kube, clock=clock, prometheus_allowed=[prom.url]))
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
    # 60 s: a liveness bound (the default 10 s was missed once on a busy 2-core CI machine)
    return await eventually(done, timeout=60, what=f"an autoscale evaluation ({decision}) at {st.iso(clock.t)}")


async def _counted(kube, clock):
    await eventually(lambda: _status(kube).get("reportTime") == st.iso(clock.t), what="a count at the current time")


async def _all_counted(kube, clock, processes: int = 4):
    """A count at the current time that includes every process (a pod just seen by the watch may
    not have its IP yet: the first ticks can count fewer)."""
    await eventually(lambda: _status(kube).get("reportTime") == st.iso(clock.t) and len(
        (_status(kube).get("accounting") or {}).get("procs") or []) == processes, what=f"{processes} processes counted")


async def _running_job(kube, prom, autoscale: dict, spec: dict | None = None, clock=None):
    """Create the job, play its pods to Running; with `clock`, also wait until the operator has
    counted and evaluated at the current time (the next ones then need clock.advance())."""
    a = {"enabled": True, "prometheusUrl": prom.url, "minActors": 1, "maxActors": 12, "band": 0.15,
         "cooldownSeconds": 30, "intervalSeconds": 10} | autoscale
    await kube.create_job(job_manifest("cartpole", {"autoscale": a, "staleness": {"paceActors": False},
                                                     **(spec or {})}))
    await eventually(lambda: kube.obj(STS, NAMESPACE, "cartpole-actor-0"), what="the actor StatefulSet")
    await run_pods(kube, "cartpole")
    await eventually(lambda: _status(kube).get("phase") == "Running", what="phase Running")
    if clock is not None:
        await _counted(kube, clock)
        await _evaluated(kube, clock)


async def test_scale_up_cooldown_and_again(env):
    kube, prom, clock, op = env
    await _running_job(kube, prom, {}, clock=clock)  # no series yet: nothing to decide
    prom.values.update(produced={0: 500}, received={0: 500}, consumed={0: 2000})
    clock.advance(10)
    rec = await _evaluated(kube, clock, "up")
    await eventually(lambda: _replicas(kube) == 6, what="6 actors")
    s = _status(kube)
    assert rec["actors"] == {"0": 6} and rec["source"] == "prometheus"
    assert rec["groups"] == [{"group": 0, "producedFps": 500, "receivedFps": 500, "consumedSps": 2000}]
    assert s["autoscale"]["lastRescaleTime"] == st.iso(clock.t)
    rescaled = next(c for c in s["conditions"] if c["type"] == "Rescaled")
    assert rescaled["status"] == "True" and rescaled["reason"] == "ScaledUp" and "2 -> 6" in rescaled["message"]
    await eventually(lambda: [e for e in kube.live("v1/events") if e.get("reason") == "Rescaled"])
    assert any('job="cartpole"' in q and f'namespace="{NAMESPACE}"' in q for q in prom.queries)

    await run_pods(kube, "cartpole")  # the 4 new actors become ready
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


async def test_autoscaling_off_records_the_evaluation_and_rescales_nothing(env):
    kube, prom, clock, op = env
    prom.values.update(produced={0: 100}, received={0: 100}, consumed={0: 2000})
    await _running_job(kube, prom, {"enabled": False}, clock=clock)
    clock.advance(10)
    rec = await _evaluated(kube, clock, "disabled")
    assert rec["groups"][0]["producedFps"] == 100 and rec["source"] == "prometheus"
    assert _replicas(kube) == 2 and "lastRescaleTime" not in _status(kube)["autoscale"]


async def test_prometheus_errors_change_nothing(env):
    kube, prom, clock, op = env
    prom.fail = True
    await _running_job(kube, prom, {})
    clock.advance(10)
    await eventually(lambda: op.metrics.value("tianji_operator_errors_total", where="metrics") >= 1)
    assert _replicas(kube) == 2 and "autoscale" not in _status(kube)
    assert _status(kube)["phase"] == "Running"


IPS = {"cartpole-learner-0-0": "127.0.0.5", "cartpole-buffer-0-0": "127.0.0.6",
       "cartpole-actor-0-0": "127.0.0.7", "cartpole-actor-0-1": "127.0.0.8"}


def _serve(pods, seq: int, frames: float, received: float, consumed: float, episodes=(), version: int = 1):
    """Every pod's report: frames split over the two actors, episodes finished by actor 0."""
    pods.reports[IPS["cartpole-actor-0-0"]] = worker_report("cartpole", "actor", 0, 0, seq=seq, episodes=episodes,
                                                            env_frames_total=frames / 2)
    pods.reports[IPS["cartpole-actor-0-1"]] = worker_report("cartpole", "actor", 0, 1, seq=seq,
                                                            env_frames_total=frames / 2)
    pods.reports[IPS["cartpole-buffer-0-0"]] = worker_report("cartpole", "buffer", 0, 0, seq=seq,
                                                             samples_received_total=received)
    pods.reports[IPS["cartpole-learner-0-0"]] = worker_report("cartpole", "learner", 0, 0, seq=seq, version=version,
                                                              samples_consumed_total=consumed)


async def test_reaching_the_mean_return_target_ends_the_job_with_the_accountings_numbers(env):
    kube, prom, clock, op = env
    async with FakePodMetrics(list(IPS.values())) as pods:
        _serve(pods, 1, 1000, 1000, 1000, episodes=[100.0] * 50)
        await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475}})
        await _all_counted(kube, clock)
        assert _status(kube)["episodes"] == 50 and _status(kube)["meanReturn"] == 100.0
        # 100 more episodes: the last 100 finished all returned 480.
        _serve(pods, 2, 3000, 3000, 3000, episodes=[100.0] * 50 + [480.0] * 100, version=7)
        clock.advance(10)
        await eventually(lambda: _status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    s = _status(kube)
    assert s["envFrames"] == 3000 and s["episodes"] == 150 and s["meanReturn"] == 480.0 and s["policyVersion"] == 7
    done = next(c for c in s["conditions"] if c["type"] == "Succeeded")
    assert done["status"] == "True" and done["reason"] == "StopConditionReached"
    assert "mean return 480" in done["message"]
    met = next(c for c in s["conditions"] if c["type"] == "TargetReached")
    assert (met["status"], met["reason"], s["endReason"]) == ("True", "TargetReached", "TargetReached")
    await eventually(lambda: _replicas(kube) == 0, what="actors scaled to 0 (cleanPodPolicy Running)")


async def test_a_frame_budget_spent_below_the_target_says_so(env):
    """Succeeded (the spec's budget ended it) but TargetReached False, and `kubectl get tjj`'s
    Ended by column reads FrameBudget: a budget end is never taken for the target."""
    kube, prom, clock, op = env
    async with FakePodMetrics(list(IPS.values())) as pods:
        _serve(pods, 1, 1000, 1000, 1000, episodes=[100.0] * 120, version=3)
        await job_with_report_pods(kube, pods, IPS, {"stop": {"meanReturn": 475, "envFrames": 4000}})
        await _all_counted(kube, clock)
        _serve(pods, 2, 5000, 5000, 5000, episodes=[100.0] * 150, version=9)
        clock.advance(10)
        await eventually(lambda: _status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    s = _status(kube)
    met = next(c for c in s["conditions"] if c["type"] == "TargetReached")
    assert (met["status"], met["reason"], s["endReason"]) == ("False", "FrameBudget", "FrameBudget")
    assert "5000 env frames >= stop.envFrames 4000" in met["message"]
    assert "mean return 100, below stop.meanReturn 475" in met["message"]


async def test_autoscaling_from_reports_without_prometheus(env):
    kube, prom, clock, op = env
    async with FakePodMetrics(list(IPS.values())) as pods:
        a = {"enabled": True, "minActors": 1, "maxActors": 12, "cooldownSeconds": 30, "intervalSeconds": 10}
        _serve(pods, 1, 1, 1, 1)
        await job_with_report_pods(kube, pods, IPS, {"autoscale": a, "staleness": {"paceActors": False}})
        await _all_counted(kube, clock)
        _serve(pods, 2, 5001, 5001, 20001)  # over the next 10 s: 500 frames/s produced, 2000 samples/s consumed
        clock.advance(10)
        rec = await _evaluated(kube, clock, "up")
        await eventually(lambda: _replicas(kube) == 6)
    assert rec["source"] == "reports" and rec["groups"] == [
        {"group": 0, "producedFps": 500, "receivedFps": 500, "consumedSps": 2000}]
    assert _status(kube)["envFrames"] == 5001


async def test_a_finished_job_is_never_rescaled(env):
    kube, prom, clock, op = env
    await _running_job(kube, prom, {"intervalSeconds": 30}, {"stop": {"seconds": 5}}, clock=clock)
    clock.advance(10)  # past stop.seconds: the monitor ends the job
    await eventually(lambda: _status(kube).get("phase") == "Succeeded", what="phase Succeeded")
    await eventually(lambda: _replicas(kube) == 0, what="actors scaled to 0")
    prom.values.update(produced={0: 100}, received={0: 100}, consumed={0: 5000})  # would scale up
    before = await _settled(kube)  # the end's last writes (final counts), however slow the machine
    for _ in range(3):
        clock.advance(30)
        await asyncio.sleep(0.5)  # several monitor and autoscale ticks (0.1 s, 0.05 s)
    # Nothing rescaled, and nothing written: an ended job with no new final report is left alone.
    assert _replicas(kube) == 0 and "lastRescaleTime" not in (_status(kube).get("autoscale") or {})
    after = kube.obj(JOBS, NAMESPACE, "cartpole")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], \
        st.diff_paths(before, after, "job")


async def _settled(kube, quiet: float = 1.0, timeout: float = 20.0) -> dict:
    """The job once no write has changed it for `quiet` seconds (ten monitor ticks)."""
    loop = asyncio.get_running_loop()
    obj = kube.obj(JOBS, NAMESPACE, "cartpole")
    since, deadline = loop.time(), loop.time() + timeout
    while loop.time() < deadline:
        await asyncio.sleep(0.1)
        now = kube.obj(JOBS, NAMESPACE, "cartpole")
        if now["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            obj, since = now, loop.time()
        elif loop.time() - since >= quiet:
            return obj
    raise AssertionError(f"the job kept changing for {timeout:g} s")


async def test_an_operator_restart_continues_the_count():
    """The accounting lives in status.accounting: a new operator process continues it, and a pod
    that restarted while no operator ran is counted as a new incarnation, not instead of the old."""
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        clock = FakeClock()
        pods = await stack.enter_async_context(FakePodMetrics(list(IPS.values())))
        async with RunningOperator(kube, clock=clock):
            _serve(pods, 1, 1000, 1000, 1000, episodes=[5.0] * 10)
            await job_with_report_pods(kube, pods, IPS, {})
            await _all_counted(kube, clock)
            assert (_status(kube)["envFrames"], _status(kube)["episodes"]) == (1000, 10)
        # No operator: actor 0 restarts (a new incarnation counts from zero) and makes 40 frames.
        pods.reports[IPS["cartpole-actor-0-0"]] = worker_report("cartpole", "actor", 0, 0, seq=1, incarnation="inc1",
                                                                env_frames_total=40, episodes=[7.0])
        pods.reports[IPS["cartpole-actor-0-0"]]["started"] += 100
        clock.advance(10)
        async with RunningOperator(kube, clock=clock):
            await _all_counted(kube, clock)
            s = _status(kube)
        assert (s["envFrames"], s["episodes"]) == (1040, 11)  # 500 + 500 before, + 40 from the new incarnation
        assert s["meanReturn"] == pytest.approx((10 * 5.0 + 7.0) / 11)



async def test_no_actors_are_added_while_new_ones_are_pending(env):
    kube, prom, clock, op = env
    await _running_job(kube, prom, {"cooldownSeconds": 0}, clock=clock)
    prom.values.update(produced={0: 500}, received={0: 500}, consumed={0: 2000})
    clock.advance(10)
    await _evaluated(kube, clock, "up")
    await eventually(lambda: _replicas(kube) == 6, what="6 actors")
    for _ in range(3):  # 4 of the 6 never become ready (e.g. no node fits them): no more are added
        clock.advance(10)
        rec = await _evaluated(kube, clock, "pending")
        assert _replicas(kube) == 6 and "group 0: 4 of 6 not ready" in rec["message"]
    await run_pods(kube, "cartpole")
    clock.advance(10)
    await _evaluated(kube, clock, "up")
    await eventually(lambda: _replicas(kube) == 10, what="10 actors")


def test_scale_up_and_down_have_their_own_cooldowns():
    spec = _spec(scaleUpCooldownSeconds=10, scaleDownCooldownSeconds=300)
    assert asc.decide(spec, _obs(500, 2000, 2), {0: 2}, last_rescale=80.0, now=100.0).kind == "up"
    d = asc.decide(_spec(scaleUpCooldownSeconds=10, scaleDownCooldownSeconds=300, minActors=3),
                   _obs(8000, 2000, 4), {0: 4}, last_rescale=80.0, now=100.0)
    assert d.kind == "cooldown" and "scale-down cooldown 300 s" in d.message
    assert asc.decide(_spec(cooldownSeconds=5), _obs(500, 2000, 2), {0: 2}, 80.0, 100.0).kind == "up"  # default


def test_prometheus_urls_must_lie_under_the_allow_list():
    allowed = ["http://prometheus.monitoring:9090", "https://thanos.example.com/query/"]
    ok = ["http://prometheus.monitoring:9090", "http://prometheus.monitoring:9090/",
          "https://thanos.example.com/query/tenant-a"]
    bad = ["http://prometheus.monitoring:9091", "http://169.254.169.254/latest/meta-data",
           "http://user:pw@prometheus.monitoring:9090", "https://thanos.example.com/queryx",
           "file:///etc/passwd", "http://prometheus.monitoring.evil.com:9090", "not a url", ""]
    assert [u for u in ok if not asc.prometheus_allowed(u, allowed)] == []
    assert [u for u in bad if asc.prometheus_allowed(u, allowed)] == []
    assert not asc.prometheus_allowed("http://prometheus.monitoring:9090", [])


async def test_a_prometheus_url_outside_the_allow_list_is_never_requested():
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        prom = await stack.enter_async_context(FakePrometheus())
        clock = FakeClock()
        await stack.enter_async_context(RunningOperator(kube, clock=clock))  # empty allow-list
        await _running_job(kube, prom, {}, clock=None)
        ev = await eventually(lambda: [e for e in kube.live("v1/events") if e.get("reason") == "PrometheusNotAllowed"],
                              what="a PrometheusNotAllowed event")
        assert prom.url in ev[0]["message"] and ev[0]["type"] == "Warning"
        for _ in range(3):
            clock.advance(10)
            await _counted(kube, clock)
        assert prom.queries == []


async def test_external_mode_adopts_replicas_set_by_another_scaler(env):
    kube, prom, clock, op = env
    await _running_job(kube, prom, {"mode": "external", "minActors": 1, "maxActors": 4}, clock=clock)
    code, _ = await kube.api("PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/cartpole-actor-0/scale",
                             {"spec": {"replicas": 9}})  # KEDA/HPA on the StatefulSet, beyond maxActors
    assert code == 200
    prom.values.update(produced={0: 500}, received={0: 500}, consumed={0: 2000})
    clock.advance(10)
    rec = await _evaluated(kube, clock, "external")
    assert _replicas(kube) == 9 and "actors" not in rec
    # A restart (resume handler) keeps what the external scaler set.
    async with RunningOperator(kube, clock=clock, prometheus_allowed=[prom.url]) as second:
        await eventually(lambda: second.metrics.value("tianji_operator_reconciles_total", handler="resume",
                                                      result="ok") >= 0 and _replicas(kube) == 9)
        await eventually(lambda: second.metrics.value("tianji_operator_reconciles_total", handler="resume",
                                                      result="ok") == 1, what="the resume handler")
    assert _replicas(kube) == 9


async def test_the_scale_subresource_drives_actors_per_group(env):
    """HPA/KEDA on the TianJiJob: /scale sets spec.topology.actors; status carries what they read."""
    kube, prom, clock, op = env
    await kube.create_job(job_manifest("cartpole", {"autoscale": {"mode": "external"},
                                                     "topology": {"groups": 2, "actors": 2}}))
    await eventually(lambda: kube.obj(STS, NAMESPACE, "cartpole-actor-1")
                     and kube.obj("v1/pods", NAMESPACE, "cartpole-buffer-1-0"), what="both groups")
    await run_pods(kube, "cartpole")
    await eventually(lambda: _status(kube).get("actorReplicas") == 2, what="status.actorReplicas")
    assert _status(kube)["actorSelector"] == "tianji.dev/job=cartpole,tianji.dev/role=actor"
    code, out = await kube.api("GET", f"/apis/tianji.dev/v1alpha1/namespaces/{NAMESPACE}/tianjijobs/cartpole/scale")
    assert code == 200 and (out["apiVersion"], out["kind"]) == ("autoscaling/v1", "Scale"), out
    assert out["spec"] == {"replicas": 2} and out["status"] == {
        "replicas": 2, "selector": "tianji.dev/job=cartpole,tianji.dev/role=actor"}, out
    code, out = await kube.api("PATCH", f"/apis/tianji.dev/v1alpha1/namespaces/{NAMESPACE}/tianjijobs/cartpole/scale",
                               {"spec": {"replicas": 5}})
    assert code == 200 and out["kind"] == "Scale" and out["spec"] == {"replicas": 5}, out
    assert kube.obj(JOBS, NAMESPACE, "cartpole")["spec"]["topology"]["actors"] == 5
    await eventually(lambda: _replicas(kube, 0) == 5 and _replicas(kube, 1) == 5, what="5 actors in each group")
    await eventually(lambda: _status(kube).get("actorReplicas") == 5, what="status.actorReplicas 5")


def test_the_crd_declares_the_scale_subresource():
    from tianji.control.spec.crd import crd_dict

    (version,) = crd_dict()["spec"]["versions"]
    scale = version["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.topology.actors", "statusReplicasPath": ".status.actorReplicas",
                     "labelSelectorPath": ".status.actorSelector"}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["actorReplicas"]["type"] == "integer" and status["actorSelector"]["type"] == "string"


async def test_prometheus_carries_the_learners_capacity_into_the_decision():
    """A DQN learner held at replayRatio x production: Prometheus' capacity gauge shows the
    missing production that consumption alone hides (the planner's balance, issue 13)."""
    import aiohttp

    async with FakePrometheus() as prom, aiohttp.ClientSession() as session:
        prom.values.update(produced={0: 1000.0}, received={0: 1000.0}, consumed={0: 8000.0}, capacity={0: 32000.0})
        obs = await asc.query_prometheus(session, prom.url, asc.promql_queries("cp", "ns", "1m"))
    assert any("tianji_learner_capacity_sps" in q for q in prom.queries)
    assert obs.groups[0]["capacity"] == 32000.0 and obs.record()["groups"][0]["capacitySps"] == 32000.0
    spec = JobSpec.model_validate({"autoscale": {"enabled": True, "band": 0.1}, "staleness": {"paceActors": False,
                                                                                             "replayRatio": 8}})
    d = asc.decide(spec, obs.throughput({0: 1}), {0: 1}, None, now=0.0)
    assert d.kind == "up" and d.desired == {0: 4} and "needed 4000.0" in d.message
    blind = asc.Observation(groups={0: {k: v for k, v in obs.groups[0].items() if k != "capacity"}})
    assert asc.decide(spec, blind.throughput({0: 1}), {0: 1}, None, now=0.0).kind == "unchanged"
