"""`python -m tianji_operator` as a process (kubeconfig login, liveness, metrics), and the
operator's small pure helpers."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import aiohttp
import yaml

from helpers import free_port
from kube.operator_harness import NAMESPACE, eventually, job_manifest, start_cluster
from tianji_operator import context, rbac
from tianji_operator import status as st
from tianji_operator.config import DEFAULT_SCRAPERS, OperatorConfig
from tianji_operator.kube import path_of


async def _get(url: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, s.get(url) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 0, ""


async def test_the_operator_process_reconciles_and_serves_probes(tmp_path):
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": str(kube.url).rstrip("/")}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}]}))
        live, prom = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path),
               "TIANJI_MONITOR_INTERVAL": "0.2", "TIANJI_AUTOSCALE_TICK": "0.2"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tianji_operator", "--namespace", NAMESPACE,
            "--liveness-port", str(live), "--metrics-port", str(prom),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            await kube.create_job(job_manifest("cartpole"))
            await eventually(lambda: kube.obj("apps/v1/statefulsets", NAMESPACE, "cartpole-actor-0"), timeout=60,
                             what="the operator process to create the children")
            code, _ = await eventually(lambda: _healthz(live), timeout=20, what="liveness")
            assert code == 200
            text = await eventually(lambda: _reconciled(prom), timeout=20, what="operator metrics")
            assert 'tianji_operator_reconciles_total{handler="create",result="ok"} 1.0' in text
            headers = {r.headers.get("Authorization") for r in kube.requests
                       if r.headers.get("User-Agent", "").startswith(("kopf/", "tianji-operator"))}
            assert headers == {"Bearer test-token"}
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, out.decode()[-3000:]


async def _healthz(port: int):
    code, text = await _get(f"http://127.0.0.1:{port}/healthz")
    return (code, text) if code == 200 else None


async def _reconciled(port: int):
    code, text = await _get(f"http://127.0.0.1:{port}/metrics")
    return text if code == 200 and 'handler="create"' in text else None


# ----------------------------------------------------------------- helpers
def test_config_from_the_environment():
    c = OperatorConfig.from_env({"TIANJI_MONITOR_INTERVAL": "2.5", "TIANJI_PROMQL_WINDOW": "30s",
                                 "TIANJI_METRICS_SCRAPERS": '[{"podSelector": {}}]',
                                 "TIANJI_WORKER_COMMAND": '["python", "-m", "tianji.cli", "worker"]'})
    assert c.monitor_interval == 2.5 and c.promql_window == "30s"
    assert c.metrics_scrapers == [{"podSelector": {}}] and c.worker_command[-1] == "worker"
    assert OperatorConfig.from_env({}).metrics_scrapers == DEFAULT_SCRAPERS


def test_conditions_keep_their_transition_time_until_they_flip():
    a = st.condition("Ready", False, "PodsNotReady", "x", now=100.0)
    conds = st.set_conditions([], a)
    conds = st.set_conditions(conds, st.condition("Ready", False, "PodsNotReady", "y", now=200.0))
    assert conds[0]["lastTransitionTime"] == st.iso(100.0) and conds[0]["message"] == "y"
    conds = st.set_conditions(conds, st.condition("Ready", True, "AllPodsReady", "", now=300.0),
                              st.condition("Planned", True, "Planned", "", now=300.0))
    assert [c["type"] for c in conds] == ["Planned", "Ready"]
    assert conds[1]["lastTransitionTime"] == st.iso(300.0)


def test_which_fields_may_change_on_a_created_job():
    assert context.is_mutable("spec.topology.actors") and context.is_mutable("spec.autoscale.maxActors")
    assert context.is_mutable("spec.runPolicy.cleanPodPolicy") and context.is_mutable("spec.runPolicy.suspend")
    for path in ("spec.topology.groups", "spec.env.numEnvs", "spec.image", "spec.autoscaleX", "spec.resources.cpus"):
        assert not context.is_mutable(path)
    assert st.diff_paths({"a": {"b": 1, "c": [1]}}, {"a": {"b": 2, "c": [1], "d": 3}}) == [
        ("spec.a.b", 1, 2), ("spec.a.d", None, 3)]


def test_api_paths():
    assert path_of("Pod", "ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert path_of("StatefulSet", "ns") == "/apis/apps/v1/namespaces/ns/statefulsets"
    assert path_of("TianJiJob", "ns", "j", "status") == "/apis/tianji.dev/v1alpha1/namespaces/ns/tianjijobs/j/status"


def test_rbac_rules_render_as_a_cluster_role():
    import kubernetes_validate

    role = rbac.cluster_role()
    kubernetes_validate.validate(role, "1.33.0", strict=True)
    assert rbac.allows("patch", "tianji.dev", "tianjijobs/status")
    assert not rbac.allows("delete", "apps", "statefulsets")
    assert not rbac.allows("update", "", "pods")
