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

import asyncio
import os
from pathlib import Path
from typing import Optional

import kmock
import pytest
import yaml

from kube import prometheus as prom
from kube.cluster import PodCluster
from kube.operator_harness import NAMESPACE, eventually
from tianji_operator import autoscaler as asc
from tianji_operator import status as op_status

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cartpole-ppo.yaml"
JOB = "cartpole-ppo"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
                                reason="the local kubelet needs root and unshare(1) for per-pod mount namespaces")


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


# ----------------------------------------------------------------- accounting (one place to retarget)
def status_frames(st: dict) -> Optional[int]:
    """The job's env frames as the operator reports them in its status."""
    v = (st.get("throughput") or {}).get("framesTotal")
    return None if v is None else int(v)


def final_reports(c: PodCluster, job: str = JOB) -> tuple[list, list]:
    """(final reports, incarnations without one) of every worker process of the job: the JSON each
    wrote to its termination log at exit (the per-incarnation file the kubelet bind-mounted)."""
    incs = c.kubelet.pod_incarnations(labels={"tianji.dev/job": job})
    reports = [(i, i.final_report()) for i in incs]
    return [r for _, r in reports if r is not None], [i for i, r in reports if r is None]


def worker_frames(reports: list[dict]) -> int:
    return int(sum(float((r.get("counts") or {}).get("env_frames_total", 0)) for r in reports))


def assert_succeeded(st: dict) -> None:
    """phase Succeeded, Progressing False/JobSucceeded, and, once the operator has a `Succeeded`
    condition type (tianji_operator.status.CONDITION_TYPES), that condition True."""
    assert st.get("phase") == "Succeeded", st
    prog = condition(st, "Progressing")
    assert prog and (prog["status"], prog["reason"]) == ("False", "JobSucceeded"), prog
    assert st.get("completionTime"), st
    if "Succeeded" in op_status.CONDITION_TYPES:  # SUCCEEDED_CONDITION: enforced as soon as the type exists
        ok = condition(st, "Succeeded")
        assert ok and ok["status"] == "True", st.get("conditions")


def assert_frames_accounted(c: PodCluster, st: dict) -> None:
    """status frames == the sum of env_frames_total over every worker process's final report.
    Pending (xfail) while the workers write no final report to their termination log."""
    reports, missing = final_reports(c)
    if not reports:
        pytest.xfail(f"none of the {len(missing)} worker processes wrote a final report to its termination "
                     f"log yet (pending: the worker's report at exit); status frames = {status_frames(st)}")
    assert not missing, [f"{i.pod} #{i.restart_count} exit {i.exit_code}" for i in missing]
    assert status_frames(st) == worker_frames(reports), (status_frames(st), worker_frames(reports))


async def wait_pods_gone(c: PodCluster, timeout: float = 60.0) -> None:
    await eventually(lambda: not c.pods(JOB) and not c.kubelet.running(), timeout=timeout, interval=0.2,
                     what="every pod of the job gone and its process exited")


# ----------------------------------------------------------------- 1. the example trains to its target
@pytest.mark.timeout(420)
async def test_the_example_trains_to_its_target_in_pods(tmp_path):
    async with PodCluster(tmp_path) as c:
        await c.kube.create_job(example_job())
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
            assert i.env["OMP_NUM_THREADS"] == {"actor": "1", "buffer": "1", "learner": "1"}[role]
            assert i.env["HOSTNAME"] == i.pod and i.env["TIANJI_NAMESPACE"] == NAMESPACE
            assert i.env["TIANJI_POD_IP"].startswith("127.")
        # cleanPodPolicy Running: learner and buffer pods deleted, actors scaled to 0, all gracefully.
        await wait_pods_gone(c)
        assert all(i.exit_code == 0 and "SIGKILL" not in i.signals for i in incs), \
            [(i.pod, i.exit_code, i.signals) for i in incs]
    assert not c.leftovers, c.leftovers
    assert_frames_accounted(c, st)
