"""Kubernetes-only parts of a TianJiJob: pod overlays and the run policy."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from tianji.control.spec.base import _Model

# ----------------------------------------------------------------- pod overlay (Kubernetes only)
_FREE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
# What the operator itself puts in every pod: an overlay may not redefine it.
RESERVED_VOLUMES = ("job", "state", "dshm", "scratch", "curve", "curve-issuer")
RESERVED_MOUNT_PATHS = (
    "/etc/tianji",
    "/var/lib/tianji",
    "/dev/shm",
    "/tmp",
    "/etc/tianji-curve",
    "/etc/tianji-curve-issuer",
)
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class Toleration(_Model):
    key: Optional[str] = Field(None, description="the taint's key (unset with Exists: every taint)")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Equal: key and value match; Exists: the key")
    value: Optional[str] = Field(None, description="the taint's value (Equal)")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        None, description="the taint effect tolerated (unset: all)"
    )
    toleration_seconds: Optional[int] = Field(None, description="NoExecute: how long the pod stays once tainted")


class EnvVar(_Model):
    name: str = Field(
        ..., min_length=1, json_schema_extra={"pattern": _ENV_NAME}, description="the variable's name (not TIANJI_*)"
    )
    value: Optional[str] = Field(None, description="its value")
    value_from: Optional[dict[str, Any]] = Field(None, json_schema_extra=_FREE, description="a Kubernetes EnvVarSource")

    @field_validator("name")
    @classmethod
    def _not_ours(cls, v: str) -> str:
        if not re.fullmatch(_ENV_NAME, v):
            raise ValueError(f"{v!r} is not an environment variable name")
        if v.startswith("TIANJI_"):
            raise ValueError(f"{v}: TIANJI_* variables are set by the operator (tianji.control.contracts.launch)")
        return v


class VolumeMount(_Model):
    name: str = Field(..., min_length=1, description="the volume's name (in volumes)")
    mount_path: str = Field(..., min_length=1, description="where it is mounted in the container")
    read_only: bool = Field(False, description="mount it read-only")
    sub_path: Optional[str] = Field(None, description="mount this path inside the volume")


class PodOverlay(_Model):
    """Added to the pods of a role (or of all roles): scheduling and extra volumes/env."""

    node_selector: Optional[dict[str, str]] = Field(None, description="node labels the pods must match")
    tolerations: Optional[list[Toleration]] = Field(None, description="taints the pods tolerate")
    affinity: Optional[dict[str, Any]] = Field(None, json_schema_extra=_FREE, description="a Kubernetes Affinity")
    priority_class_name: Optional[str] = Field(None, description="the pods' PriorityClass")
    image_pull_secrets: Optional[list[str]] = Field(None, description="names of Secrets")
    service_account_name: Optional[str] = Field(None, description="the pods' ServiceAccount")
    env: Optional[list[EnvVar]] = Field(None, description="extra environment variables of the worker container")
    volumes: Optional[list[dict[str, Any]]] = Field(
        None, json_schema_extra={"items": {"type": "object", **_FREE}}, description="Kubernetes Volumes"
    )
    volume_mounts: Optional[list[VolumeMount]] = Field(
        None, description="mounts of `volumes` into the worker container"
    )

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: Optional[list[dict]]) -> Optional[list[dict]]:
        for vol in v or []:
            name = vol.get("name") if isinstance(vol, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError("every volume needs a name")
            if name in RESERVED_VOLUMES:
                raise ValueError(f"volume name {name!r} is the operator's ({', '.join(RESERVED_VOLUMES)})")
        return v

    @field_validator("volume_mounts")
    @classmethod
    def _mounts(cls, v: Optional[list[VolumeMount]]) -> Optional[list[VolumeMount]]:
        for m in v or []:
            if m.mount_path.rstrip("/") in RESERVED_MOUNT_PATHS:
                raise ValueError(f"mountPath {m.mount_path!r} is the operator's ({', '.join(RESERVED_MOUNT_PATHS)})")
        return v


class Pods(_Model):
    """Pod overlays: `all` first, then the role's (maps merge, lists add up, scalars: the role's)."""

    all: PodOverlay = Field(default_factory=PodOverlay)
    actor: PodOverlay = Field(default_factory=PodOverlay, description="actor pods only (the same fields as all)")
    buffer: PodOverlay = Field(default_factory=PodOverlay, description="buffer pods only (the same fields as all)")
    learner: PodOverlay = Field(default_factory=PodOverlay, description="learner pods only (the same fields as all)")
    evaluator: PodOverlay = Field(
        default_factory=PodOverlay, description="the evaluator pod only (the same fields as all)"
    )


class RunPolicy(_Model):
    """How the job runs on Kubernetes: retries, time limits, clean-up, queueing (Kubeflow's RunPolicy)."""

    backoff_limit: int = Field(
        6,
        ge=0,
        le=1000,
        description="container restarts (all pods of the job together) before the job fails with "
        "reason BackoffLimitExceeded",
    )
    active_deadline_seconds: Optional[int] = Field(
        None,
        ge=1,
        description="the job fails (DeadlineExceeded) when it has been active this long, counted "
        "from its creation or its last resume",
    )
    ttl_seconds_after_finished: Optional[int] = Field(
        None, ge=0, description="delete the TianJiJob (and with it its children) this long after it ended"
    )
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        "Running",
        description="at the end: Running deletes learner/buffer pods still running and scales "
        "actors to 0; All deletes finished ones too; None keeps them",
    )
    suspend: bool = Field(
        False,
        description="true deletes the pods; false again resumes (Kubernetes Job / Kueue semantics). "
        "Kept: the counts (in status) and the learners' checkpoints when they are on a claim "
        "(the default, see status condition Durable); with an emptyDir "
        "(checkpoint.ephemeral, or no default StorageClass) the learners start over",
    )


# Fields that moved: old name -> (new section, new name). Accepted on read (older manifests,
# ConfigMaps written by an older operator, objects stored under an older CRD: Helm does not
# upgrade CRDs) and moved; `deprecated_fields` names them for a warning.
MOVED_FIELDS = {"cleanPodPolicy": ("runPolicy", "cleanPodPolicy")}
