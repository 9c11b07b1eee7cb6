"""The operator's per-job gauges (tianji_job_*, what the dashboard's actor and restart panels
read instead of kube-state-metrics) say what the job's status says, and go with the job."""
from __future__ import annotations

from kube.operator_harness import NAMESPACE, FakeClock, RunningOperator, eventually, job_manifest, run_pods, status
from test_operator_disruptions import LEARNER, crash
from test_operator_reconcile import created


def gauges(op, name: str = "cartpole") -> dict:
    labels = {"namespace": NAMESPACE, "job": name}
    v = lambda metric, **extra: op.metrics.registry.get_sample_value(metric, {**labels, **extra})
    return {"desired": v("tianji_job_actors_desired", group="0"), "ready": v("tianji_job_actors_ready", group="0"),
            "learner_restarts": v("tianji_job_container_restarts", role="learner"),
            "learner_recreated": v("tianji_job_pods_recreated", role="learner"),
            "actor_restarts": v("tianji_job_container_restarts", role="actor")}


def from_status(st: dict) -> dict:
    (g,) = st["groups"]
    by = st["restartsByRole"]
    return {"desired": float(g["actors"]["desired"]), "ready": float(g["actors"]["ready"]),
            "learner_restarts": float(by["learner"]["containers"]), "learner_recreated": float(by["learner"]["pods"]),
            "actor_restarts": float(by["actor"]["containers"])}


async def test_job_gauges_equal_the_status_and_go_with_the_job(kube):
    async with RunningOperator(kube, clock=FakeClock()) as op:
        await kube.create_job(job_manifest("cartpole", {}))
        await created(kube)
        await run_pods(kube, "cartpole")
        await eventually(lambda: status(kube).get("phase") == "Running" and status(kube).get("actors") == "2/2",
                         what="phase Running, actors 2/2")
        await eventually(lambda: gauges(op) == from_status(status(kube)), what="gauges = status")
        assert gauges(op)["desired"] == gauges(op)["ready"] == 2.0
        await kube.set_status("v1/pods", NAMESPACE, LEARNER, crash(2))
        await eventually(lambda: status(kube).get("restarts") == 2, what="2 restarts counted")
        await eventually(lambda: gauges(op) == from_status(status(kube)), what="gauges = status after restarts")
        assert gauges(op)["learner_restarts"] == 2.0 and gauges(op)["ready"] == 2.0
        await kube.delete_job("cartpole", NAMESPACE)
        await eventually(lambda: not [s for m in op.metrics.registry.collect() if m.name.startswith("tianji_job_")
                                      for s in m.samples], what="the deleted job's series dropped")
