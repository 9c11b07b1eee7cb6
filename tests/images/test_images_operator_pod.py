"""The operator image runs as the chart runs it (uid 10001, read-only root, no capabilities, an
emptyDir at /tmp): against the API emulator (a kubeconfig in place of the ServiceAccount token)
it serves /healthz, reconciles a TianJiJob into its children, and stops cleanly on SIGTERM."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid

import aiohttp
import yaml

from helpers import free_port
from kube.operator_harness import NAMESPACE, eventually, job_manifest, start_cluster
from kube.podnet import ClusterDNS
from localcluster.ocibundle import crun, pod_container, proc_status
from tianji_operator.children.builders import WORKER_UID


def operator_pod(live: int, prom: int) -> dict:
    return {
        "metadata": {"name": "tianji-operator-0", "namespace": "tianji-system", "labels": {}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID,
                                "fsGroup": WORKER_UID},
            "containers": [{
                "name": "operator", "command": ["python", "-m", "tianji_operator"],
                "args": ["--namespace", NAMESPACE, "--liveness-port", str(live), "--metrics-port", str(prom)],
                "env": [{"name": "KUBECONFIG", "value": "/etc/kube/config"}, {"name": "HOME", "value": "/tmp"},
                        {"name": "TIANJI_MONITOR_INTERVAL", "value": "0.2"}],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                 {"name": "kubeconfig", "mountPath": "/etc/kube", "readOnly": True}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}},
                        {"name": "kubeconfig", "secret": {"secretName": "kubeconfig"}}]}}


async def _get(url: str):
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, s.get(url) as r:
            return (r.status, await r.text()) if r.status == 200 else None
    return None


async def _has(url: str, text: str):
    got = await _get(url)
    return got if got and text in got[1] else None


async def test_operator_container_serves_health_and_reconciles(operator_image, operator_rootfs, tmp_path):
    cfg = operator_image.config
    assert cfg["User"] == f"{WORKER_UID}:{WORKER_UID}" and cfg["Entrypoint"] == ["python", "-m", "tianji_operator"]
    async with contextlib.AsyncExitStack() as stack:
        kube = await start_cluster(stack)
        kubeconfig = yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": str(kube.url).rstrip("/")}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}]})
        secret = {"kind": "Secret", "metadata": {"name": "kubeconfig"},
                  "data": {"config": base64.b64encode(kubeconfig.encode()).decode()}}
        live, prom = free_port(), free_port()
        hosts = ClusterDNS(tmp_path / "hosts").path
        c = pod_container(operator_pod(live, prom), cfg, operator_rootfs, "127.0.0.1",
                          {("Secret", "kubeconfig"): secret}, hosts, tmp_path / "pod",
                          f"tianji-img-{uuid.uuid4().hex[:6]}-operator").start()
        try:
            code, _ = await eventually(lambda: _get(f"http://127.0.0.1:{live}/healthz"), timeout=60,
                                       what="the operator container's /healthz")
            st = proc_status(c.pid())
            assert st["Uid"].split()[0] == str(WORKER_UID) and int(st["CapEff"], 16) == 0, st
            await kube.create_job(job_manifest("cartpole"))
            await eventually(lambda: kube.obj("apps/v1/statefulsets", NAMESPACE, "cartpole-actor-0"), timeout=60,
                             what="the operator container to create the job's children")
            ok = 'tianji_operator_reconciles_total{handler="create",result="ok"} 1.0'
            await eventually(lambda: _has(f"http://127.0.0.1:{prom}/metrics", ok), timeout=20,
                             what="the create reconcile in the operator's metrics")
            crun("kill", c.cid, "TERM")
            assert await asyncio.to_thread(c.proc.wait, 30) == 0, c.log_tail()
        finally:
            c.stop()
