"""The Kubernetes permissions the operator uses — exactly, no more.

Kopf's own calls (watching and patching TianJiJobs, posting events, resource
and namespace discovery) plus the operator's (`kube.py`). A ClusterRole
(or a Role per watched namespace, with CRD/namespace discovery in a
ClusterRole) built from RULES is sufficient; tests check that every request
the operator makes against the emulator is covered.
"""

from __future__ import annotations

RULES: list[dict] = [
    # Kopf: watch the jobs, add/remove its finalizer and progress annotations; the operator
    # reads a job afresh before each status write and deletes it after runPolicy.ttlSecondsAfterFinished.
    {"apiGroups": ["tianji.dev"], "resources": ["tianjijobs"], "verbs": ["get", "list", "watch", "patch", "delete"]},
    {"apiGroups": ["tianji.dev"], "resources": ["tianjijobs/status"], "verbs": ["patch"]},
    # Children carry ownerReferences with blockOwnerDeletion: true, which the
    # OwnerReferencesPermissionEnforcement admission plugin allows only to those who may
    # update the owner's finalizers.
    {"apiGroups": ["tianji.dev"], "resources": ["tianjijobs/finalizers"], "verbs": ["update"]},
    # Kopf: Events for kubectl describe (kopf.info/warn).
    # list: the StatefulSet controller's FailedCreate events for actor pods it cannot create.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
    # Kopf: discovery of the CRD (it may be installed after the operator) and of namespaces.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    # The operator: children of each job.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create"]},
    # learners' checkpoints (spec.checkpoint.size)
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]},
    # cluster-scoped, read only: whether the cluster has a default StorageClass (children/statevolume.py: where
    # learner state lives by default)
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["list"]},
    # secrets: one CurveZMQ keyring per role of a job (builders.curve_secrets), each created once.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    # pods: watched for the final reports in their termination messages.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create"]},
]


def allows(verb: str, group: str, resource: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in RULES)


def cluster_role(name: str = "tianji-operator") -> dict:
    """RULES as a ClusterRole manifest."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [dict(r) for r in RULES],
    }
