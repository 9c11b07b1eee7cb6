"""The README's Kubernetes quick start, on the real control plane: `helm install` of the chart,
`kubectl apply -f examples/cartpole-ppo.yaml`, `kubectl get tjj`. The namespace enforces the
Pod Security `restricted` profile, and the operator acts with nothing but its chart's RBAC."""
from __future__ import annotations

import pytest

from cluster_jobs import EXAMPLE, JOB, condition, final_reports, pods, status, wait_phase, workers_view
from clusterkit import OPERATOR_NS, RELEASE, wait_for

SA = f"system:serviceaccount:{OPERATOR_NS}:{RELEASE}-tianji-operator"


def can_i(c, *args: str) -> bool:
    res = c.kubectl("auth", "can-i", *args, f"--as={SA}", check=False)
    assert res.stdout.strip() in ("yes", "no"), res
    return res.stdout.strip() == "yes"


def test_the_operator_can_do_what_it_needs_and_nothing_else(cluster, operator, namespace):
    sa = cluster.kubectl("get", "serviceaccounts", "-n", OPERATOR_NS, "-o", "name").stdout.split()
    assert f"serviceaccount/{RELEASE}-tianji-operator" in sa, sa
    for verb, what in (("create", "pods"), ("delete", "pods"), ("create", "statefulsets.apps"),
                       ("patch", "statefulsets.apps"), ("patch", "tianjijobs.tianji.dev/status"),
                       ("create", "configmaps"), ("create", "services"), ("list", "pods")):
        assert can_i(cluster, verb, what, "-n", namespace), (verb, what)
    for verb, what in (("delete", "nodes"), ("create", "clusterroles.rbac.authorization.k8s.io"),
                       ("list", "secrets"), ("update", "pods"), ("delete", "statefulsets.apps"),
                       ("create", "deployments.apps"), ("delete", "namespaces")):
        assert not can_i(cluster, verb, what, "-n", namespace), (verb, what)
    for sub in ("exec", "attach", "portforward"):  # (`pods/exec` would name a pod "exec")
        assert not can_i(cluster, "create", "pods", f"--subresource={sub}", "-n", namespace), sub


@pytest.mark.timeout(900)
def test_quick_start_trains_to_the_target_in_a_restricted_namespace(cluster, operator, namespace):
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    st = wait_phase(cluster, namespace, ("Succeeded", "Failed"), 600)
    ok = condition(st, "Succeeded")
    assert st["phase"] == "Succeeded" and ok["reason"] == "StopConditionReached", st
    assert st["meanReturn"] >= 475, st
    # Once every pod is gone, `kubectl get tjj` shows what the worker processes counted themselves.
    wait_for(lambda: not pods(cluster, namespace), 120, "the job's pods to go (cleanPodPolicy Running)")
    reports, missing = final_reports(cluster, namespace)
    assert reports and not missing, missing
    want = workers_view(reports)

    def agrees() -> bool:
        s = status(cluster, namespace)
        return (s.get("envFrames"), s.get("episodes"), s.get("meanReturn")) == (
            want["env_frames"], want["episodes"], want["mean_return"])

    wait_for(agrees, 60, f"status to count the final reports {want['env_frames']} / {want['episodes']}")
    table = cluster.kubectl("get", "tjj", JOB, "-n", namespace, "--no-headers",
                            "-o", "custom-columns=F:.status.envFrames,E:.status.episodes,M:.status.meanReturn"
                            ).stdout.split()
    assert [int(table[0]), int(table[1]), float(table[2])] == [want["env_frames"], want["episodes"],
                                                                want["mean_return"]]
    default_view = cluster.kubectl("get", "tjj", "-n", namespace).stdout
    assert "Succeeded" in default_view and str(want["env_frames"]) in default_view, default_view
