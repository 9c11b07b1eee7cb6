"""Uninstall safety: jobs left behind never block CRD or namespace deletion. The chart's
pre-delete hook runs tianji_operator.release: released jobs lose the operator's finalizer."""
from __future__ import annotations

import kopf
import pytest

from kube.operator_harness import NAMESPACE, RunningOperator, children, eventually, job, job_manifest
from test_operator_reconcile import assert_rbac_covers, created
from tianji_operator.context import FINALIZER, RELEASED
from tianji_operator.kube import KubeClient
from tianji_operator.release import build_parser, release_jobs


@pytest.fixture
async def client(kube):
    c = KubeClient(lambda: kopf.ConnectionInfo(server=str(kube.url).rstrip("/"), insecure=True))
    yield c
    await c.close()


async def test_released_jobs_lose_the_finalizer_while_the_operator_runs(kube, client):
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole"))
        await created(kube)
        assert job(kube)["metadata"]["finalizers"] == [FINALIZER]
        done = await release_jobs(client, [NAMESPACE], wait=10, poll=0.05)
        assert done == {"released": [f"{NAMESPACE}/cartpole"], "stripped": [], "deleted": []}
        assert job(kube)["metadata"]["annotations"][RELEASED] == "true"
        assert not job(kube)["metadata"].get("finalizers")  # the operator let go itself
    # No operator any more: deleting the job (or its namespace, or the CRD) is not blocked.
    await kube.delete_job("cartpole")
    await eventually(lambda: job(kube) is None, what="the job gone without an operator")
    assert children(kube) == {}
    assert_rbac_covers(kube)


async def test_without_an_operator_the_hook_strips_the_finalizer_and_can_delete(kube, client):
    async with RunningOperator(kube):
        await kube.create_job(job_manifest("cartpole"))
        await created(kube)
    assert job(kube)["metadata"]["finalizers"] == [FINALIZER]  # the operator is gone, its finalizer stays
    done = await release_jobs(client, [], delete=True, wait=0.3, poll=0.05)
    assert done == {"released": [f"{NAMESPACE}/cartpole"], "stripped": [f"{NAMESPACE}/cartpole"],
                    "deleted": [f"{NAMESPACE}/cartpole"]}
    await eventually(lambda: job(kube) is None, what="the job deleted")


def test_the_hook_command_line():
    a = build_parser().parse_args(["--namespace", "rl-team", "-n", "rl-bench", "--delete-jobs", "--wait", "30"])
    assert (a.namespace, a.delete_jobs, a.wait) == (["rl-team", "rl-bench"], True, 30.0)
