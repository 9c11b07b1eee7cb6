"""Child objects of a TianJiJob: pure functions, job (+ plan) in, manifests (dicts) out.

Names are fixed (idempotent creation, no duplicates after a restart), from
`tianji.control.contracts.addressing`:

    ConfigMap      <job>-job            job.yaml: the job as planned (resolved topology and requests)
    PersistentVolumeClaim <job>-checkpoints  learners' checkpoints, when spec.checkpoint.size is set
    PersistentVolumeClaim <pod>-state   otherwise one per learner pod (and per buffer pod with
                                        replaySnapshot), when the plan's stateVolume is "claims" (statevolume.py)
    Service        <job>                headless; gives learner/buffer pods DNS names
    Pod            <job>-learner-<g>-<i>, <job>-buffer-<g>-<i>   hostname = pod name, subdomain = <job>
    StatefulSet    <job>-actor-<g>      one per group, podManagementPolicy Parallel
    NetworkPolicy  <job>                ingress: the job's own pods (all ports), scrapers (metrics port)

Every object carries the labels tianji.dev/job, tianji.dev/role and (per
group) tianji.dev/group; the handlers add owner references with kopf.adopt.
"""

from __future__ import annotations

import json
from typing import Optional

import yaml

from tianji.control.contracts.addressing import PORTS, actor_set_name, data_port, metrics_port, pod_name, service_name
from tianji.control.contracts.curvekeys import actor_seed, keypair
from tianji.control.contracts.launch import (
    CONFIG_DIR,
    CURVE_FILE,
    ENV_TERMINATION_LOG,
    ISSUER_FILE,
    JOB_FILE,
    ROLE_KEYED,
    SCRATCH_DIR,
    SEEDED_ROLES,
    STATE_DIR,
    TERMINATION_LOG,
    WorkerLaunch,
    curve_secret_name,
    worker_launch,
)
from tianji.control.spec import JobSpec, PodOverlay, TianJiJob

LABEL_JOB = "tianji.dev/job"
LABEL_ROLE = "tianji.dev/role"
LABEL_GROUP = "tianji.dev/group"
LABEL_INDEX = "tianji.dev/index"
ANNOTATION_SPEC = "tianji.dev/applied-spec"
ANNOTATION_GENERATION = "tianji.dev/applied-generation"
ANNOTATION_PLAN = "tianji.dev/plan"
MANAGED_BY = {"app.kubernetes.io/name": "tianji", "app.kubernetes.io/managed-by": "tianji-operator"}

CONTAINER = "worker"
# The worker image's user (images/worker.Dockerfile: USER 10001:10001). Numeric, so the kubelet
# can check runAsNonRoot; fsGroup makes volumes (checkpoints) writable by it.
WORKER_UID = 10001

POD_ROLES = ("learner", "buffer", "evaluator")  # roles of single pods (actors: StatefulSets)
CONFIRM_ROLE = "confirm"  # the confirming evaluation's pod (timers/confirm.py): no worker, no reports
ROLE_PORTS = {  # container ports per role (offsets from spec.network.basePort)
    "buffer": ("fragments", "credits"),
    "learner": ("batches", "params"),
    "actor": (),
    "evaluator": (),  # only subscribes (to learner-0-0's params)
}


def configmap_name(job: str) -> str:
    return f"{job}-job"


def confirm_pod_name(job: str) -> str:
    return f"{job}-confirm"


def networkpolicy_name(job: str) -> str:
    return job


def checkpoint_claim_name(job: str) -> str:
    return f"{job}-checkpoints"


def labels(job: str, role: Optional[str] = None, group: Optional[int] = None, index: Optional[int] = None) -> dict:
    out = {**MANAGED_BY, "app.kubernetes.io/instance": job, LABEL_JOB: job}
    if role is not None:
        out[LABEL_ROLE] = role
        out["app.kubernetes.io/component"] = role
    if group is not None:
        out[LABEL_GROUP] = str(group)
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out


def selector(job: str, role: Optional[str] = None, group: Optional[int] = None) -> dict:
    out = {LABEL_JOB: job}
    if role is not None:
        out[LABEL_ROLE] = role
    if group is not None:
        out[LABEL_GROUP] = str(group)
    return out


def label_selector(job: str, role: Optional[str] = None) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(job, role).items())


def cpu_quantity(cores: float) -> str:
    milli = int(round(cores * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


# ----------------------------------------------------------------- the applied spec
def spec_json(spec: JobSpec) -> str:
    """Canonical JSON of a spec (defaults filled): what `applied-spec` stores and diffs compare."""
    return json.dumps(
        spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True, separators=(",", ":")
    )


# ----------------------------------------------------------------- objects
def _meta(job: TianJiJob, name: str, lab: dict, annotations: Optional[dict] = None) -> dict:
    m = {"name": name, "labels": lab}
    if job.metadata.namespace:
        m["namespace"] = job.metadata.namespace
    if annotations:
        m["annotations"] = annotations
    return m


def configmap(resolved: TianJiJob, applied_spec: JobSpec, generation: int = 0, plan: Optional[dict] = None) -> dict:
    """The planned job for the workers; annotations record the applied spec and the plan."""
    manifest = resolved.to_manifest()
    manifest["metadata"] = {
        "name": resolved.name,
        **({"namespace": resolved.metadata.namespace} if resolved.metadata.namespace else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            resolved,
            configmap_name(resolved.name),
            labels(resolved.name),
            {
                ANNOTATION_SPEC: spec_json(applied_spec),
                ANNOTATION_GENERATION: str(generation),
                **({ANNOTATION_PLAN: json.dumps(plan, sort_keys=True, separators=(",", ":"))} if plan else {}),
            },
        ),
        "data": {JOB_FILE: yaml.safe_dump(manifest, sort_keys=False)},
    }


def _data_ports(job: TianJiJob) -> list[dict]:
    base = job.spec.network.base_port
    return [
        {"name": ch, "port": base + PORTS[ch], "targetPort": ch, "protocol": "TCP"}
        for r in ("buffer", "learner")
        for ch in ROLE_PORTS[r]
    ]


def service(job: TianJiJob) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, service_name(job.name), labels(job.name)),
        "spec": {
            "clusterIP": "None",
            # DNS records before readiness: peers resolve each other while starting.
            "publishNotReadyAddresses": True,
            "selector": selector(job.name),
            "ports": _data_ports(job)
            + [{"name": "metrics", "port": job.spec.network.metrics_port, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def network_policy(job: TianJiJob, scrapers: list[dict]) -> dict:
    """Ingress to the job's pods: from its own pods (any port: data ports, and the dynamic
    ports torch.distributed uses between learners), and from `scrapers` to `metrics` only."""
    rules: list[dict] = [{"from": [{"podSelector": {"matchLabels": selector(job.name)}}]}]
    if scrapers:
        rules.append({"from": [dict(p) for p in scrapers], "ports": [{"protocol": "TCP", "port": "metrics"}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, networkpolicy_name(job.name), labels(job.name)),
        "spec": {"podSelector": {"matchLabels": selector(job.name)}, "policyTypes": ["Ingress"], "ingress": rules},
    }


# ----------------------------------------------------------------- checkpoints
def checkpoint_claim(job: TianJiJob) -> Optional[str]:
    """The claim learners checkpoint onto: spec.checkpoint.persistentVolumeClaim, the claim the
    operator creates (spec.checkpoint.size), or None (an emptyDir, lost with the pod)."""
    c = job.spec.checkpoint
    if c.persistent_volume_claim:
        return c.persistent_volume_claim
    return checkpoint_claim_name(job.name) if c.size else None


def checkpoint_pvc(job: TianJiJob) -> Optional[dict]:
    c = job.spec.checkpoint
    if not c.size:
        return None
    spec: dict = {"accessModes": [c.access_mode], "resources": {"requests": {"storage": c.size}}}
    if c.storage_class_name:
        spec["storageClassName"] = c.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(job, checkpoint_claim_name(job.name), labels(job.name, "learner")),
        "spec": spec,
    }


# The claim each learner pod gets by default (statevolume.py decides; a checkpoint is the model, the
# optimizer state and counters: tens of MB for an Atari network, times checkpoint.keep).
AUTO_CLAIM_SIZE = "1Gi"


def keeps_state(job: TianJiJob, role: str) -> bool:
    """Roles whose TIANJI_STATE_DIR is worth keeping: learners (checkpoints), and buffers with
    checkpoint.replaySnapshot (their replay)."""
    return role == "learner" or (role == "buffer" and job.spec.checkpoint.replay_snapshot)


def state_claim_name(pod: str) -> str:
    return f"{pod}-state"


def per_pod_claims(job: TianJiJob, plan: Optional[dict]) -> bool:
    """The plan chose one claim per stateful pod (statevolume.py: the cluster's default StorageClass),
    and the spec names no claim of its own."""
    c = job.spec.checkpoint
    mode = ((plan or {}).get("stateVolume") or {}).get("mode")
    return mode == "claims" and not (c.persistent_volume_claim or c.size or c.ephemeral)


def state_pvcs(job: TianJiJob, plan: Optional[dict]) -> list[dict]:
    """The per-pod claims (ReadWriteOnce: each is mounted by one pod, wherever it runs). A buffer's
    holds its replay snapshot, at most its ring: the buffer's memory request."""
    if not per_pod_claims(job, plan):
        return []
    t, out = job.spec.topology, []
    for g in range(t.groups):
        for role, n in (("learner", t.learners), ("buffer", t.buffers)):
            if not keeps_state(job, role):
                continue
            size = AUTO_CLAIM_SIZE if role == "learner" else job.spec.resources.buffer.memory
            for i in range(n):
                out.append(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": _meta(
                            job, state_claim_name(pod_name(job.name, role, g, i)), labels(job.name, role, g, i)
                        ),
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
                    }
                )
    return out


def state_volume(job: TianJiJob, role: str, pod: Optional[str] = None, plan: Optional[dict] = None) -> dict:
    """TIANJI_STATE_DIR: the checkpoint claim for learners (a re-created learner resumes from
    it) and, with checkpoint.replaySnapshot, for buffers (their replay snapshots): the spec's
    claim, else the pod's own claim when the plan chose them; an emptyDir otherwise."""
    claim = checkpoint_claim(job)
    if claim and keeps_state(job, role):
        return {"name": "state", "persistentVolumeClaim": {"claimName": claim}}
    if pod and keeps_state(job, role) and per_pod_claims(job, plan):
        return {"name": "state", "persistentVolumeClaim": {"claimName": state_claim_name(pod)}}
    return {"name": "state", "emptyDir": {}}


def _resources(job: TianJiJob, role: str) -> dict:
    r = getattr(job.spec.resources, role)
    q = {"cpu": cpu_quantity(r.cpu), "memory": r.memory}
    if r.gpu:
        q["nvidia.com/gpu"] = str(r.gpu)
    if job.spec.network.rdma:
        q[job.spec.network.rdma] = "1"
    # requests == limits: Guaranteed QoS, so a role gets the cores the planner counted on.
    return {"requests": dict(q), "limits": dict(q)}


# ----------------------------------------------------------------- Pod Security
def pod_security_context() -> dict:
    """Pod Security "restricted": a non-root user, the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": WORKER_UID,
        "runAsGroup": WORKER_UID,
        "fsGroup": WORKER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(job: TianJiJob) -> dict:
    """Pod Security "restricted" for the worker container: no privilege escalation, no
    capabilities, a read-only root filesystem (scratch on an emptyDir at SCRATCH_DIR).
    RDMA adds IPC_LOCK (pinned memory), which only a privileged namespace admits."""
    caps: dict = {"drop": ["ALL"]}
    if job.spec.network.rdma:
        caps["add"] = ["IPC_LOCK"]
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": caps,
    }


# ----------------------------------------------------------------- pod overlays
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def role_overlays(job: TianJiJob, role: str, defaults: Optional[PodOverlay] = None) -> list[PodOverlay]:
    """In order: the operator's cluster-wide defaults (chart values), spec.pods.all, spec.pods.<role>."""
    return [o for o in (defaults, job.spec.pods.all, getattr(job.spec.pods, role)) if o is not None]


def apply_overlay(spec: dict, container: dict, overlay: PodOverlay) -> None:
    """Maps merge (the overlay's keys win), lists add up, scalars are replaced."""
    o = overlay.model_dump(mode="json", by_alias=True, exclude_none=True)
    if "nodeSelector" in o:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **o["nodeSelector"]}
    for t in o.get("tolerations", []):
        if t not in spec.setdefault("tolerations", []):
            spec["tolerations"].append(t)
    for key in ("affinity", "priorityClassName", "serviceAccountName"):
        if key in o:
            spec[key] = o[key]
    for name in o.get("imagePullSecrets", []):
        if {"name": name} not in spec.setdefault("imagePullSecrets", []):
            spec["imagePullSecrets"].append({"name": name})
    for var in o.get("env", []):
        env = container["env"]
        env[:] = [e for e in env if e["name"] != var["name"]] + [var]
    spec["volumes"] += o.get("volumes", [])
    container["volumeMounts"] += o.get("volumeMounts", [])


def scheduling(job: TianJiJob, role: str, spec: dict, container: dict, defaults: Optional[PodOverlay] = None) -> None:
    """Overlays, and the toleration of tainted GPU pools for roles that request GPUs."""
    if getattr(job.spec.resources, role).gpu:
        spec["tolerations"] = [dict(GPU_TOLERATION)]
    for overlay in role_overlays(job, role, defaults):
        apply_overlay(spec, container, overlay)


# ----------------------------------------------------------------- ports
def port_slots(job: TianJiJob) -> Optional[int]:
    """Buffers per group under host networking (per-slot ports), else None (fixed ports)."""
    return job.spec.topology.buffers if job.spec.network.host_network else None


def _slot_index(index: str) -> int:
    """The pod's index for its ports: an actor's (`auto`, its ordinal) counts as 0, since the
    actors of a group share their ports."""
    return int(index) if index.isdigit() else 0


def pod_metrics_port(job: TianJiJob, role: str, group: int, index: str) -> int:
    return metrics_port(job.spec.network.metrics_port, role, group, _slot_index(index), port_slots(job))


def container_ports(job: TianJiJob, role: str, group: int, index: str) -> list[dict]:
    """Named data ports of the role (tianji.control.contracts.addressing's layout) and `metrics`."""
    i = _slot_index(index)
    ports = [
        {
            "name": ch,
            "containerPort": data_port(job.spec.network.base_port, ch, group, i, port_slots(job)),
            "protocol": "TCP",
        }
        for ch in ROLE_PORTS[role]
    ]
    ports.append({"name": "metrics", "containerPort": pod_metrics_port(job, role, group, index), "protocol": "TCP"})
    return ports


# ----------------------------------------------------------------- the worker pod
def downward_env(field_env: dict[str, str]) -> list[dict]:
    """Env entries from the downward API: name -> fieldPath."""
    return [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in field_env.items()]


def worker_container(job: TianJiJob, role: str, group: int, index: str, launch: WorkerLaunch) -> dict:
    """The worker container: `launch` (tianji.control.contracts.launch: command, env, the role's
    own mounts), the role's ports and resources, a readiness probe, Pod Security "restricted"."""
    return {
        "name": CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": launch.command,
        "args": launch.args,
        "env": [
            *downward_env(launch.field_env),
            *({"name": k, "value": v} for k, v in launch.env.items()),
        ],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "ports": container_ports(job, role, group, index),
        "resources": _resources(job, role),
        # timeoutSeconds 5, not the default 1: a worker whose loop keeps its cores busy (unpaced
        # actors on 2 cores) can take over a second to render /metrics, and a pod marked not ready
        # holds the autoscaler back ("waiting for actors to become ready")
        "readinessProbe": {
            "httpGet": {"path": "/metrics", "port": "metrics"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "job", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": SCRATCH_DIR},
            *launch.volume_mounts,
        ],
        "securityContext": container_security_context(job),
    }


def init_container(job: TianJiJob, i: dict, worker: dict) -> dict:
    """`i` (WorkerLaunch.init: the actor key's init container) as a container: the worker's image, resources
    (a pod's request is the larger of the two, so this costs nothing) and security context, less
    any capability."""
    return {
        "name": i["name"],
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": i["command"],
        "args": i["args"],
        "env": downward_env(i["field_env"]),
        "resources": worker["resources"],
        "volumeMounts": i["volume_mounts"],
        "securityContext": {**container_security_context(job), "capabilities": {"drop": ["ALL"]}},  # no RDMA
    }


def pod_spec(
    job: TianJiJob,
    role: str,
    group: int,
    index: str,
    command: list[str],
    hostname: Optional[str] = None,
    defaults: Optional[PodOverlay] = None,
    plan: Optional[dict] = None,
) -> dict:
    """Every worker pod's spec: learner, buffer and evaluator pods (`hostname`: their stable DNS
    name) and the actor StatefulSets' template (index `auto`); the overlays last."""
    launch = worker_launch(
        job,
        role,
        group,
        index,
        engine="pod",
        job_file=f"{CONFIG_DIR}/{JOB_FILE}",
        command=command,
        metrics_port=pod_metrics_port(job, role, group, index),
    )
    container = worker_container(job, role, group, index, launch)
    spec: dict = {
        **({"initContainers": [init_container(job, launch.init, container)]} if launch.init else {}),
        # an evaluator that fails is restarted, never the job's failure (as an actor)
        "restartPolicy": "Always" if role in ("actor", "evaluator") else "OnFailure",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [
            {
                "name": "job",
                "configMap": {"name": configmap_name(job.name), "items": [{"key": JOB_FILE, "path": JOB_FILE}]},
            },
            state_volume(job, role, hostname, plan),
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "scratch", "emptyDir": {}},
            *launch.volumes,
        ],
    }
    if hostname:
        spec["hostname"] = hostname
        spec["subdomain"] = service_name(job.name)
    if job.spec.network.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    scheduling(job, role, spec, container, defaults)
    return spec


# ----------------------------------------------------------------- key Secrets, pods, StatefulSets, all of them
def curve_secrets(job: TianJiJob) -> list[dict]:
    """The job's CurveZMQ keys as Secrets (fresh each call: `ensure` creates them once, and an
    existing one is never replaced), none with `network.encryption: none`:
    - learner, buffer, evaluator: one identity per role, mounted only into that role's pods
      (worker_launch); learners' and buffers' keyrings also hold the actor seed;
    - actor: the issuer, {"actorSeed", "peers"}, mounted only into actor pods' init container,
      which derives the pod's own key pair ("actor-G-I") from it (`tianji actor-key`).
    Keyrings name every role's public key (runtime/security.py's format)."""
    if job.spec.network.encryption != "curve":
        return []
    pairs = {role: keypair() for role in ROLE_KEYED}
    peers = {role: public for role, (public, _) in pairs.items()}
    seed = actor_seed()

    def keyring(role: str) -> dict:
        public, secret = pairs[role]
        ring = {"identity": role, "public": public, "secret": secret, "peers": peers}
        return {**ring, "actorSeed": seed} if role in SEEDED_ROLES else ring

    docs = {role: (CURVE_FILE, keyring(role)) for role in ROLE_KEYED}
    docs["actor"] = (ISSUER_FILE, {"actorSeed": seed, "peers": peers})
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": _meta(job, curve_secret_name(job.name, role), labels(job.name, role)),
            "stringData": {key: json.dumps(doc)},
        }
        for role, (key, doc) in docs.items()
    ]


def confirm_pod(job: TianJiJob, command: list[str], args: list[str], defaults: Optional[PodOverlay] = None) -> dict:
    """The confirming evaluation's pod (`tianji confirm ARGS`, timers/confirm.py): it fetches
    learner-0-0's checkpoint, checks its digest and plays it; its answer is its termination
    message. Runs once (restartPolicy Never), nothing mounted but scratch space, placed and
    sized as an actor (it runs the env and the policy, as actors do)."""
    container = {
        "name": CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": args,
        "env": [
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "HOME", "value": SCRATCH_DIR},
            {"name": "TMPDIR", "value": SCRATCH_DIR},
            {"name": ENV_TERMINATION_LOG, "value": TERMINATION_LOG},
        ],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "resources": _resources(job, "actor"),
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_DIR}],
        "securityContext": container_security_context(job),
    }
    spec: dict = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    scheduling(job, "actor", spec, container, defaults)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, confirm_pod_name(job.name), labels(job.name, CONFIRM_ROLE)),
        "spec": spec,
    }


def role_pod(
    job: TianJiJob,
    role: str,
    group: int,
    index: int,
    command: list[str],
    defaults: Optional[PodOverlay] = None,
    plan: Optional[dict] = None,
) -> dict:
    """A learner, buffer or evaluator pod: stable name = hostname, under the headless Service's subdomain."""
    name = pod_name(job.name, role, group, index)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, name, labels(job.name, role, group, index)),
        "spec": pod_spec(job, role, group, str(index), command, hostname=name, defaults=defaults, plan=plan),
    }


def actor_statefulset(
    job: TianJiJob, group: int, replicas: int, command: list[str], defaults: Optional[PodOverlay] = None
) -> dict:
    """One group's actors; each pod derives its index from its ordinal (`--index auto`)."""
    lab = labels(job.name, "actor", group)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(job, actor_set_name(job.name, group), lab),
        "spec": {
            "serviceName": service_name(job.name),
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(job.name, "actor", group)},
            "template": {
                "metadata": {"labels": dict(lab)},
                "spec": pod_spec(job, "actor", group, "auto", command, defaults=defaults),
            },
        },
    }


def children(
    resolved: TianJiJob,
    applied_spec: JobSpec,
    actors: dict[int, int],
    *,
    scrapers: list[dict],
    command: list[str],
    generation: int = 0,
    plan: Optional[dict] = None,
    defaults: Optional[PodOverlay] = None,
) -> list[dict]:
    """Everything a job needs, in creation order (the ConfigMap first: pods mount it).
    `defaults`: the cluster-wide pod overlay (chart values `workerDefaults`)."""
    t = resolved.spec.topology
    out = [
        configmap(resolved, applied_spec, generation, plan),
        service(resolved),
        network_policy(resolved, scrapers),
        *curve_secrets(resolved),
    ]
    pvc = checkpoint_pvc(resolved)
    if pvc is not None:
        out.append(pvc)
    out += state_pvcs(resolved, plan)
    for g in range(t.groups):
        out += [role_pod(resolved, "learner", g, i, command, defaults, plan) for i in range(t.learners)]
        out += [role_pod(resolved, "buffer", g, i, command, defaults, plan) for i in range(t.buffers)]
        out.append(actor_statefulset(resolved, g, actors.get(g, t.actors), command, defaults))
    if resolved.spec.evaluation.enabled:  # spec.evaluation: one evaluator pod per job
        out.append(role_pod(resolved, "evaluator", 0, 0, command, defaults))
    return out
