"""Pods the operator builds really train.

The real Kopf operator runs against the API emulator, and every Pod it creates
(directly, or through a StatefulSet) is started as a local process from its pod
spec by the harness in tests/kube/ (kubelet.py, statefulset.py, prometheus.py,
cluster.py): command/args/env with the downward API, the job ConfigMap mounted
at /etc/tianji, emptyDirs, a per-incarnation /dev/termination-log, one loopback
IP and cluster DNS names per pod, readiness probes, restart policies and
graceful deletion.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import kmock
import pytest
import yaml

from kube import prometheus as prom
from kube.cluster import PodCluster
from kube.kubelet import unavailable_reason
from kube.operator_harness import NAMESPACE, eventually
from tianji.control.accounting import Accounting
from tianji.control.report import parse_report
from tianji.control.launch import torch_threads
from tianji.control.spec import parse_job
from tianji_operator import autoscaler as asc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cartpole-ppo.yaml"
JOB = "cartpole-ppo"

NO_KUBELET = unavailable_reason()
pytestmark = pytest.mark.skipif(NO_KUBELET is not None, reason=str(NO_KUBELET))


def example_job(spec_patch: Optional[dict] = None) -> dict:
    """examples/cartpole-ppo.yaml as applied: only metadata adapted (plus `spec_patch`, merged)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": JOB, "namespace": NAMESPACE}

    def merge(into: dict, patch: dict) -> None:
        for k, v in patch.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = v

    merge(doc["spec"], spec_patch or {})
    return doc


def condition(st: dict, ctype: str) -> Optional[dict]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), None)


# ----------------------------------------------------------------- accounting
def final_reports(c: PodCluster, job: str = JOB) -> tuple[list, list]:
    """(final reports, incarnations without one) of every worker process of the job: the JSON each
    wrote to its termination log at exit (the per-incarnation file the kubelet bind-mounted)."""
    incs = c.kubelet.pod_incarnations(labels={"tianji.dev/job": job})
    reports = [(i, i.final_report()) for i in incs]
    return [r for _, r in reports if r is not None], [i for i, r in reports if r is None]


def workers_view(reports: list[dict]) -> dict:
    """What summary.json would say of the processes' own final reports: the shared accounting,
    fed with nothing but what the workers counted."""
    acc = Accounting()
    for r in reports:
        acc.take(parse_report(r, JOB))
    return acc.view(1.0)


def assert_succeeded(st: dict) -> None:
    """phase Succeeded; Progressing False/JobSucceeded; the Succeeded condition True
    (`kubectl wait --for=condition=Succeeded`)."""
    assert st.get("phase") == "Succeeded", st
    prog = condition(st, "Progressing")
    assert prog and (prog["status"], prog["reason"]) == ("False", "JobSucceeded"), prog
    assert st.get("completionTime"), st
    ok = condition(st, "Succeeded")
    assert ok and (ok["status"], ok["reason"]) == ("True", "StopConditionReached"), st.get("conditions")


async def assert_counted_as_the_workers_did(c: PodCluster) -> dict:
    """Once every pod is gone, the job's status shows what its worker processes counted, to the
    frame and to the episode: envFrames, episodes and meanReturn equal the accounting of the
    processes' own final reports (every incarnation, a deleted pod's included)."""
    reports, missing = final_reports(c)
    assert reports and not missing, [f"{i.pod} #{i.restart_count} exit {i.exit_code}" for i in missing]
    want = workers_view(reports)

    def agrees() -> bool:
        st = c.status(JOB)
        return (st.get("envFrames"), st.get("episodes"), st.get("meanReturn")) == (
            want["env_frames"], want["episodes"], want["mean_return"])

    try:
        await eventually(agrees, timeout=30, interval=0.2, what="status to count the final reports")
    except AssertionError:
        st = c.status(JOB)
        raise AssertionError(f"status {st.get('envFrames')} frames, {st.get('episodes')} episodes, mean "
                             f"{st.get('meanReturn')}; workers {want['env_frames']}, {want['episodes']}, "
                             f"{want['mean_return']}") from None
    return c.status(JOB)


async def wait_pods_gone(c: PodCluster, timeout: float = 60.0) -> None:
    await eventually(lambda: not c.pods(JOB) and not c.kubelet.running(), timeout=timeout, interval=0.2,
                     what="every pod of the job gone and its process exited")


# ----------------------------------------------------------------- 1. the example trains to its target
@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_the_example_trains_to_its_target_in_pods(tmp_path):
    manifest = example_job()
    job = parse_job(manifest)
    async with PodCluster(tmp_path) as c:
        await c.kube.create_job(manifest)
        await eventually(lambda: c.status(JOB).get("phase") in ("Running", "Succeeded", "Failed"), timeout=120,
                         interval=0.2, what="the job to run")
        # Every pod resolves every other by its Service DNS name (publishNotReadyAddresses).
        def resolved() -> bool:
            pods = c.pods(JOB)
            return len(pods) == 4 and all(
                c.kubelet.dns.resolve(f"{p['spec']['hostname']}.{JOB}.{NAMESPACE}.svc") == p["status"]["podIP"]
                for p in pods)

        await eventually(resolved, timeout=30, what=f"DNS names of the 4 pods: {c.kubelet.dns.content}")
        await eventually(lambda: c.status(JOB).get("phase") in ("Succeeded", "Failed"), timeout=300, interval=0.5,
                         what="the job to finish")
        st = c.status(JOB)
        assert_succeeded(st)
        assert st["meanReturn"] >= 475, st
        # What ran is what the operator built: one process per pod, from its spec.
        incs = c.kubelet.pod_incarnations(labels={"tianji.dev/job": JOB})
        assert {i.pod for i in incs} == {f"{JOB}-learner-0-0", f"{JOB}-buffer-0-0", f"{JOB}-actor-0-0",
                                         f"{JOB}-actor-0-1"}
        for i in incs:
            role = i.labels["tianji.dev/role"]
            assert i.argv[i.argv.index("--role") + 1] == role and "/etc/tianji/job.yaml" in i.argv
            assert i.env["OMP_NUM_THREADS"] == str(torch_threads(job, role))
            assert i.env["HOSTNAME"] == i.pod and i.env["TIANJI_NAMESPACE"] == NAMESPACE
            assert i.env["TIANJI_POD_IP"].startswith("127.")
        # cleanPodPolicy Running: learner and buffer pods deleted, actors scaled to 0, all gracefully.
        await wait_pods_gone(c)
        assert all(i.exit_code == 0 and "SIGKILL" not in i.signals for i in incs), \
            [(i.pod, i.exit_code, i.signals) for i in incs]
        # The learner checkpointed into its state volume (its own claim of the default StorageClass,
        # mounted at /var/lib/tianji), at the latest as it stopped (the run may end before
        # checkpoint.intervalSeconds).
        (state,) = c.kubelet.claim_dirs(NAMESPACE, f"{JOB}-learner-0-0-state")
        assert list(state.rglob("ckpt-*.pt"))
        final = await assert_counted_as_the_workers_did(c)
        # (episodes that ended while the pods stopped count too: the final mean may dip a little)
        assert final["meanReturn"] >= 450 and final["envFrames"] >= st["envFrames"]
    assert not c.leftovers, c.leftovers


def history(c: PodCluster, key: str, name: str, namespace: str = NAMESPACE) -> list[dict]:
    """Every version the API stored of one object name (all its uids), oldest first."""
    k = (kmock.resource(key), namespace, name)
    return [v.raw for v in c.kube.objects[k].history if v is not None] if k in c.kube.objects else []


# ----------------------------------------------------------------- 2. an actor pod is deleted mid-run
@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_deleted_actor_pod_is_recreated_and_the_job_still_succeeds(tmp_path):
    victim = f"{JOB}-actor-0-1"
    async with PodCluster(tmp_path) as c:
        await c.kube.create_job(example_job())
        await eventually(lambda: c.status(JOB).get("envFrames"), timeout=180, interval=0.5,
                         what="the first frames in the job's status")
        old = c.kube.obj("v1/pods", NAMESPACE, victim)
        (old_inc,) = [i for i in c.kubelet.pod_incarnations(victim) if i.uid == old["metadata"]["uid"]]
        assert old_inc.running

        code, body = await c.kube.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}")
        assert code == 200 and body["metadata"]["deletionTimestamp"], (code, body)
        assert body["metadata"]["deletionGracePeriodSeconds"] == 30  # the pod's terminationGracePeriodSeconds

        # Graceful: SIGTERM, the worker exits by itself, the kubelet records it, then the object goes.
        await eventually(lambda: old_inc.exit_code is not None, timeout=40, what="the deleted actor's exit")
        assert (old_inc.exit_code, old_inc.signals) == (0, ["SIGTERM"])
        new = await eventually(lambda: (p := c.kube.obj("v1/pods", NAMESPACE, victim)) and p["metadata"]["uid"]
                               != old["metadata"]["uid"] and p, timeout=30, what="the actor pod re-created")
        last_old = [v for v in history(c, "v1/pods", victim) if v["metadata"]["uid"] == old["metadata"]["uid"]][-1]
        term = last_old["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (last_old["status"]["phase"], term["exitCode"]) == ("Succeeded", 0), last_old["status"]
        assert last_old["metadata"]["deletionTimestamp"]

        # The StatefulSet controller made it again from the template, and its process started.
        assert c.statefulsets.created.count(victim) == 2
        ref = new["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], new["spec"]["hostname"], new["spec"]["subdomain"]) == (
            "StatefulSet", f"{JOB}-actor-0", victim, JOB)
        new_inc = await eventually(lambda: [i for i in c.kubelet.pod_incarnations(victim)
                                            if i.uid == new["metadata"]["uid"] and i.running], timeout=30,
                                   what="the new actor process")
        assert new_inc[0].env["HOSTNAME"] == victim and new_inc[0].pid != old_inc.pid
        assert new_inc[0].env["TIANJI_POD_IP"] != old_inc.env["TIANJI_POD_IP"]
        await eventually(lambda: (c.kube.obj("apps/v1/statefulsets", NAMESPACE, f"{JOB}-actor-0")["status"]
                                  .get("readyReplicas") == 2), timeout=60, what="both actors ready again")

        await eventually(lambda: c.status(JOB).get("phase") in ("Succeeded", "Failed"), timeout=300, interval=0.5,
                         what="the job to finish")
        st = c.status(JOB)
        assert_succeeded(st)
        assert st["meanReturn"] >= 475, st
        await wait_pods_gone(c)
        await assert_counted_as_the_workers_did(c)  # the deleted actor's frames and episodes included
        assert len([i for i in c.kubelet.pod_incarnations(victim)]) == 2
    assert not c.leftovers, c.leftovers


# ----------------------------------------------------------------- 3. the autoscaler through Prometheus
@pytest.mark.timeout(300)
async def test_the_autoscaler_rescales_actors_from_prometheus_rates(tmp_path):
    if prom.binary() is None:
        pytest.skip(f"no `{prom.BINARY}` binary on PATH (make test installs Debian's prometheus package)")
    async with PodCluster(tmp_path, prometheus=True, operator={"promql_window": "10s"}) as c:
        # Unpaced actors and replayRatio 4: the learner needs consumed/4 frames/s while the actors
        # produce at least what it consumes, so the measured x = produced/needed is >= 4 > 1 + band
        # as soon as the learner consumes anything: one actor fewer (2 -> 1, the minimum).
        spec = {"autoscale": {"enabled": True, "prometheusUrl": c.prometheus.url, "minActors": 1, "maxActors": 2,
                              "band": 0.15, "cooldownSeconds": 0, "intervalSeconds": 2},
                "staleness": {"paceActors": False, "replayRatio": 4},
                # Train on past the example's stop rules: a job that reaches 475 or 400k frames first
                # (unpaced actors get there in under a minute) ends, and its StatefulSet with it,
                # before the autoscaler has decided.
                "stop": {"meanReturn": None, "envFrames": None, "seconds": 600}}
        await c.kube.create_job(example_job(spec))
        sts_name = f"{JOB}-actor-0"
        await eventually(lambda: c.kube.obj("apps/v1/statefulsets", NAMESPACE, sts_name)["spec"]["replicas"] == 1,
                         timeout=180, interval=0.5, what="the autoscaler to scale the actors down")
        st = c.status(JOB)
        decision = st["autoscale"]["lastDecision"]
        assert decision["decision"] == "down" and decision["actors"] == {"0": 1}, decision
        assert "group 0: 2 -> 1 actors (produced " in decision["message"], decision
        (g0,) = decision["groups"]
        # what the learner needs is max(its advertised capacity, what it consumed) / replayRatio: the
        # decision may come from the capacity advert before the first batch is consumed
        assert decision["source"] == "prometheus" and g0["producedFps"] > 0, decision
        assert g0["consumedSps"] > 0 or g0.get("capacitySps", 0) > 0, decision
        # The decision's Rescaled condition stays: the monitor's later status writes are computed from
        # a fresh read of the job, never from an older copy.
        seen = c.status(JOB).get("reportTime")
        await eventually(lambda: c.status(JOB).get("reportTime") not in (None, seen), timeout=30, interval=0.2,
                         what="a later status write of the monitor")
        rescaled = condition(c.status(JOB), "Rescaled")
        assert rescaled and (rescaled["status"], rescaled["reason"]) == ("True", "ScaledDown"), c.status(JOB)
        # The operator's numbers came from this Prometheus: it was asked the operator's queries ...
        asked = set(c.prometheus.queries())
        wanted = asc.promql_queries(JOB, NAMESPACE, "10s")
        assert set(wanted.values()) <= asked, sorted(set(wanted.values()) - asked)
        # ... and it scraped the worker processes themselves (their own labels kept: honor_labels).
        up = await c.prometheus.query(f'up{{namespace="{NAMESPACE}"}}')
        scraped = {r["metric"]["pod"] for r in up if r["value"][1] == "1"}
        assert {f"{JOB}-learner-0-0", f"{JOB}-buffer-0-0", f"{JOB}-actor-0-0"} <= scraped, up
        frames = await c.prometheus.query(f'tianji_env_frames_total{{job="{JOB}",role="actor"}}')
        assert frames and all(float(r["value"][1]) > 0 for r in frames), frames
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in c.pods(JOB)}
        for r in frames:
            assert r["metric"]["instance"].split(":")[0] == ips.get(r["metric"]["pod"], r["metric"]["instance"])
            assert r["metric"]["pod"] == f"{JOB}-actor-0-{r['metric']['index']}"

        # The StatefulSet controller removed the highest ordinal, gracefully.
        gone = c.kubelet.pod_incarnations(f"{JOB}-actor-0-1")
        await eventually(lambda: not c.kube.obj("v1/pods", NAMESPACE, f"{JOB}-actor-0-1")
                         and all(i.exit_code is not None for i in gone), timeout=40, what="actor 1 removed")
        assert all(i.signals == ["SIGTERM"] for i in gone), [(i.exit_code, i.signals) for i in gone]
        assert c.kube.obj("v1/pods", NAMESPACE, f"{JOB}-actor-0-0")

        # Deleting the job: garbage collection deletes every child, pods gracefully.
        await c.kube.delete_job(JOB)
        await wait_pods_gone(c)
        assert all(i.exit_code is not None and "SIGKILL" not in i.signals
                   for i in c.kubelet.pod_incarnations(labels={"tianji.dev/job": JOB}))
    assert not c.leftovers, c.leftovers
