"""The TianJiJob manifest: one pydantic model, the single source of truth.

The same file runs locally (`tianji run job.yaml`) and on Kubernetes
(`kubectl apply -f job.yaml`); the CRD's openAPIV3Schema is generated from
these models (`tianji crd`). Field names are camelCase in YAML, snake_case in
Python. Unknown fields are errors everywhere (`extra="forbid"`).

This module is the spec's one import point; the parts live by concern:
specbase (errors, Kubernetes grammar, the strict base model), specalgos (PPO, DQN),
specenv (env and model), specrun (topology, staleness, stop, checkpoints, evaluation),
specresources (resources, plan, network, autoscale), specpods (Kubernetes-only pod
overlays, run policy), jobspec (JobSpec's cross-field rules, TianJiJob) and specload
(reading files, `--set` overrides, one-line errors); YAML itself is read by yamlload.
"""

from __future__ import annotations

from tianji.control.spec.actor import ActorConfig
from tianji.control.spec.algos import Algorithm, DQNConfig, PPOConfig
from tianji.control.spec.base import (
    API_VERSION,
    EXTENDED_RESOURCE_PATTERN,
    IMAGE_PATTERN,
    KIND,
    MIN_CPU,
    MIN_MEMORY,
    QUANTITY_PATTERN,
    SpecError,
    immutable,
    quantity_value,
)
from tianji.control.spec.env import (
    ENTRY_POINT_PATTERN,
    MAX_JSON_DEPTH,
    MAX_JSON_ITEMS,
    MODULE_PATTERN,
    ActionSpace,
    EnvConfig,
    EnvSpaces,
    EnvWrapper,
    ModelConfig,
    ModulePath,
    ObservationSpace,
    check_json_like,
    import_allowed,
)
from tianji.control.spec.job import JOB_NAME_PATTERN, JobSpec, Metadata, TianJiJob, WandbConfig, deprecated_fields
from tianji.control.spec.load import apply_override, dump_job, format_validation_error, load_job, parse_job
from tianji.control.spec.pods import (
    MOVED_FIELDS,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUMES,
    EnvVar,
    PodOverlay,
    Pods,
    RunPolicy,
    Toleration,
    VolumeMount,
)
from tianji.control.spec.resources import Autoscale, Link, Network, PlanConfig, Resources, RoleResources
from tianji.control.spec.run import (
    CheckpointConfig,
    EvaluationConfig,
    GroupSync,
    Staleness,
    StopConfig,
    Topology,
    stop_problem,
)

__all__ = [
    "API_VERSION",
    "EXTENDED_RESOURCE_PATTERN",
    "IMAGE_PATTERN",
    "KIND",
    "MIN_CPU",
    "MIN_MEMORY",
    "QUANTITY_PATTERN",
    "SpecError",
    "immutable",
    "quantity_value",
    "Algorithm",
    "DQNConfig",
    "PPOConfig",
    "ActorConfig",
    "ActionSpace",
    "ENTRY_POINT_PATTERN",
    "EnvConfig",
    "EnvSpaces",
    "EnvWrapper",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "MODULE_PATTERN",
    "ModelConfig",
    "ModulePath",
    "ObservationSpace",
    "check_json_like",
    "import_allowed",
    "CheckpointConfig",
    "EvaluationConfig",
    "GroupSync",
    "Staleness",
    "StopConfig",
    "Topology",
    "stop_problem",
    "Autoscale",
    "Link",
    "Network",
    "PlanConfig",
    "Resources",
    "RoleResources",
    "EnvVar",
    "MOVED_FIELDS",
    "PodOverlay",
    "Pods",
    "RESERVED_MOUNT_PATHS",
    "RESERVED_VOLUMES",
    "RunPolicy",
    "Toleration",
    "VolumeMount",
    "JOB_NAME_PATTERN",
    "JobSpec",
    "Metadata",
    "TianJiJob",
    "WandbConfig",
    "deprecated_fields",
    "apply_override",
    "dump_job",
    "format_validation_error",
    "load_job",
    "parse_job",
]
