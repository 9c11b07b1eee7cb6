"""The TianJiJob manifest: one pydantic model, the single source of truth.

The same file runs locally (`tianji run job.yaml`) and on Kubernetes
(`kubectl apply -f job.yaml`); the CRD's openAPIV3Schema is generated from
these models (`tianji crd`). Field names are camelCase in YAML, snake_case in
Python. Unknown fields are errors everywhere (`extra="forbid"`).
"""
from __future__ import annotations

import re
import types
import typing
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator,
                      model_validator)
from pydantic.alias_generators import to_camel

from tianji.control.addressing import LAST_PORT_OFFSET, host_port_ranges
from tianji.control.ratelimit import SampleToInsertRatio
from tianji.control.suggest import better_message
from tianji.control.yamlload import ManifestYAMLError, UnreadableManifest, read_manifest, safe_yaml, yaml_problem

API_VERSION = "tianji.dev/v1alpha1"
KIND = "TianJiJob"


class SpecError(ValueError):
    """A job spec that cannot run. The message names the file and the field path."""


# ----------------------------------------------------------------- Kubernetes grammar
# What the operator puts in pods must pass the API server and the kubelet; these
# checks refuse it here instead, on both engines, with the field path. The
# patterns also go into the CRD schema (RE2 and Python `re` read them alike).

# Quantity: <number><suffix>, suffix binary (Ki..Ei), decimal (n u m "" k M G T P E) or e/E<int>.
# No sign: a memory size must be positive anyway.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Far below what any worker needs (Python with torch: ~250 MiB), so less is a unit slip
# (`memory: 512` is 512 bytes), never a tight budget.
MIN_MEMORY = "64Mi"
MIN_CPU = 0.001  # Kubernetes counts cpu in millicores

# Extended resource (`domain/name`): a DNS-1123 subdomain, '/', a qualified name of <= 63 chars.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
EXTENDED_RESOURCE_PATTERN = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"

# Image reference as the kubelet parses it: [registry[:port]/]path[:tag][@digest], path lowercase.
_PATH_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_REGISTRY = r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*(:[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_PATTERN = rf"^({_REGISTRY}/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*(:{_TAG})?(@{_DIGEST})?$"


def quantity_value(q: str) -> Decimal:
    """The number a Kubernetes quantity stands for, e.g. `1.5Gi` -> 1610612736."""
    m = re.fullmatch(QUANTITY_PATTERN, q)
    if not m:
        hint = " (K is no suffix: k is 1000, Ki 1024)" if q.endswith("K") else ""
        raise ValueError(f"{q!r} is not a Kubernetes quantity{hint}: "
                         "e.g. 512Mi, 2Gi or 1.5G; suffixes Ki Mi Gi Ti Pi Ei or k M G T P E")
    number, suffix = Decimal(m.group(1)), m.group(3) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    try:
        return number.scaleb(exponent)
    except ArithmeticError:  # e.g. 1e99999999: a ValueError, so that pydantic reports it
        raise ValueError(f"{q!r} is out of range") from None


def immutable(field: str) -> dict:
    """A CEL transition rule for the CRD (Kubernetes >= 1.25): the apiserver refuses the change.
    The operator refuses every other immutable change itself (ImmutableFieldChanged)."""
    return {"rule": "self == oldSelf",
            "message": f"{field} is immutable: delete and re-create the job to change it"}


_JSON_TYPE = {bool: "a boolean", int: "an integer", float: "a number"}


class _FieldError(ValueError):
    """A model validator's error about one field (`key`): reported at that field's path."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _scalar_type(annotation: Any) -> Optional[type]:
    """bool, int or float for a field of that type (or Optional of it); None for anything else."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    return annotation if annotation in _JSON_TYPE else None


class _Model(BaseModel):
    # allow_inf_nan=False: `meanReturn: .nan` (or any NaN/inf) is an error, not a stop rule that never fires.
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_assignment=True,
        allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        """The CRD's types, as the apiserver applies them: `actors: "2"`, `actors: true` or
        `paceActors: 1` are refused here too, not coerced (one manifest, one meaning). An
        integral number is an integer (2.0), as it is to the apiserver."""
        if not isinstance(data, dict):
            return data
        for name, f in cls.model_fields.items():
            want = _scalar_type(f.annotation)
            for key in {f.alias or name, name}:
                v = data.get(key)
                if want is None or v is None:
                    continue
                number = isinstance(v, (int, float)) and not isinstance(v, bool)
                if not (isinstance(v, bool) if want is bool else number):
                    raise _FieldError(key, f"expected {_JSON_TYPE[want]}, got {type(v).__name__} {v!r}")
        return data


# ----------------------------------------------------------------- algorithms
class PPOConfig(_Model):
    """Proximal Policy Optimisation against the behaviour policy's log-probs."""

    name: Literal["ppo"] = "ppo"
    lr: float = Field(1e-3, gt=0, le=1)
    lr_anneal_frames: Optional[int] = Field(
        None, gt=0, description="linear lr decay to 0 over this many frames trained on (batchSize x learners per "
                                "update; frames dropped as stale or overflow do not count)")
    gamma: float = Field(0.98, gt=0, le=1)
    gae_lambda: float = Field(0.8, ge=0, le=1)
    clip_coef: float = Field(0.2, gt=0, le=1)
    epochs: int = Field(10, ge=1, le=100, description="passes over each batch")
    minibatch_size: int = Field(256, ge=1)
    batch_size: int = Field(256, ge=1, description="samples per learner batch (whole fragments)")
    ent_coef: float = Field(0.0, ge=0)
    vf_coef: float = Field(0.5, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    norm_adv: bool = True
    off_policy_correction: Literal["none", "vtrace"] = Field(
        "none", description="none: GAE on the learner's critic; vtrace: value targets and advantages corrected by "
        "truncated importance weights between the learner's policy at update start and the behaviour policy "
        "(IMPALA's V-trace, with gaeLambda as its lambda)")
    vtrace_rho_bar: float = Field(1.0, gt=0, le=100, description="V-trace truncation of the weights in the TD "
                                  "error and the advantage (rho-bar)")
    vtrace_c_bar: float = Field(1.0, gt=0, le=100, description="V-trace truncation of the trace weights (c-bar); "
                                "at most vtraceRhoBar")

    @model_validator(mode="after")
    def _vtrace_bars(self) -> "PPOConfig":
        if self.vtrace_c_bar > self.vtrace_rho_bar:  # IMPALA assumes c-bar <= rho-bar (its Theorem 1)
            raise ValueError("vtraceCBar must be <= vtraceRhoBar")
        return self
    normalize_observations: Optional[bool] = Field(
        None, description="normalise vector observations by running statistics the learner owns and publishes "
                          "with the parameters (default: on for continuous actions)")
    normalize_rewards: Optional[bool] = Field(
        None, description="scale rewards by the running std of discounted returns, at the learner "
                          "(default: on for continuous actions)")
    init_log_std: float = Field(0.0, ge=-5, le=2, description="continuous actions: initial log-std of the "
                                                               "Gaussian policy (state-independent)")


class DQNConfig(_Model):
    """Double DQN with a target network and optional n-step returns."""

    name: Literal["dqn"] = "dqn"
    lr: float = Field(2.3e-3, gt=0, le=1)
    gamma: float = Field(0.99, gt=0, le=1)
    batch_size: int = Field(64, ge=1, description="samples per gradient step")
    steps_per_batch: int = Field(8, ge=1, le=1024, description="gradient steps per message from the buffer")
    replay_capacity: int = Field(100_000, ge=1)
    learning_starts: int = Field(1000, ge=0, description="transitions in replay before sampling")
    target_update_interval: int = Field(256, ge=1, description="gradient steps between target syncs")
    tau: float = Field(1.0, gt=0, le=1)
    double_dqn: bool = True
    n_step: int = Field(1, ge=1, le=20)
    epsilon_start: float = Field(1.0, ge=0, le=1)
    epsilon_end: float = Field(0.04, ge=0, le=1)
    exploration_frames: int = Field(8000, ge=1, description="global frames over which epsilon decays")
    max_grad_norm: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _eps_order(self) -> "DQNConfig":
        if self.epsilon_end > self.epsilon_start:
            raise ValueError("epsilonEnd must be <= epsilonStart")
        return self


Algorithm = Annotated[Union[PPOConfig, DQNConfig], Field(discriminator="name")]


# ----------------------------------------------------------------- env, model
# User code is named, never shipped: a module path (`mypkg.envs`) or an entry point
# (`mypkg.envs:MyEnv`), imported by the worker from what its image installed.
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENTRY_POINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ModulePath = Annotated[str, Field(max_length=253, pattern=MODULE_PATTERN)]
MAX_JSON_DEPTH = 8
MAX_JSON_ITEMS = 1024


def check_json_like(value: Any, where: str = "", depth: int = 0) -> Any:
    """`value` is plain data (null, bool, finite number, string, list, string-keyed mapping),
    at most MAX_JSON_DEPTH deep and MAX_JSON_ITEMS wide: what a manifest and the CRD carry.
    A refusal names the offending item's path below the field (`where`, e.g. `a[1]`)."""
    if depth > MAX_JSON_DEPTH:
        raise _FieldError(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _FieldError(where, f"{value} is not a finite number")
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_JSON_ITEMS:
            raise _FieldError(where, f"more than {MAX_JSON_ITEMS} items")
        return [check_json_like(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if len(value) > MAX_JSON_ITEMS:
            raise _FieldError(where, f"more than {MAX_JSON_ITEMS} keys")
        for k in value:
            if not isinstance(k, str):
                raise _FieldError(where, f"key {k!r} is not a string")
        return {k: check_json_like(v, f"{where}.{k}" if where else k, depth + 1) for k, v in value.items()}
    raise _FieldError(where, f"{type(value).__name__} is not plain data (null, bool, number, string, list, map)")


def import_allowed(module: str, listed) -> bool:
    """`module` is a listed module or inside a listed package (listing `mypkg` trusts `mypkg.models`)."""
    return any(module == m or module.startswith(m + ".") for m in listed)


# kwargs/config maps: free-form in the CRD (the apiserver keeps them), checked by check_json_like.
_FREE_FORM = WithJsonSchema({"type": "object", "default": {}, "x-kubernetes-preserve-unknown-fields": True})


class ObservationSpace(_Model):
    shape: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(..., min_length=1, max_length=8)
    dtype: Literal["uint8", "float32", "float64"] = "float32"


class ActionSpace(_Model):
    """Discrete(n), or a 1-D Box: shape [d] with its bounds."""

    n: Optional[int] = Field(None, ge=1, le=1 << 20, description="Discrete(n) actions")
    shape: Optional[list[Annotated[int, Field(ge=1, le=1 << 12)]]] = Field(
        None, min_length=1, max_length=1, description="Box actions: [dimensions]")
    low: Optional[list[float]] = Field(None, max_length=1 << 12, description="Box: lower bound per dimension")
    high: Optional[list[float]] = Field(None, max_length=1 << 12, description="Box: upper bound per dimension")

    @model_validator(mode="after")
    def _one_kind(self) -> "ActionSpace":
        box = (self.shape, self.low, self.high)
        if (self.n is None) == all(x is None for x in box):
            raise ValueError("give either n (Discrete) or shape, low and high (Box)")
        if self.n is None:
            if any(x is None for x in box):
                raise ValueError("a Box needs shape, low and high")
            if not len(self.low) == len(self.high) == self.shape[0]:
                raise ValueError(f"low and high need {self.shape[0]} values each (shape {self.shape})")
            if any(not lo <= hi for lo, hi in zip(self.low, self.high)):
                raise ValueError("low must not exceed high")
        return self


class EnvSpaces(_Model):
    """What the env's spaces are, so buffers and learners need not build an env to learn them.
    `tianji run` fills this in from its pre-flight probe; an actor whose env disagrees stops."""

    observation: ObservationSpace
    action: ActionSpace


class EnvWrapper(_Model):
    """A Gymnasium wrapper around each env: `Class(env, **kwargs)`, e.g. gymnasium.wrappers:FlattenObservation."""

    entry_point: str = Field(..., max_length=300, json_schema_extra={"pattern": ENTRY_POINT_PATTERN},
                             description="module.path:Class of a gymnasium.Wrapper (or a function env -> env)")
    kwargs: Annotated[dict[str, Any], _FREE_FORM] = Field(
        default_factory=dict, description="its keyword arguments besides the env (plain data)")

    @field_validator("entry_point")
    @classmethod
    def _entry_point(cls, v: str) -> str:
        if not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(f"{v!r}: expected module.path:Class, e.g. gymnasium.wrappers:FlattenObservation")
        return v

    @field_validator("kwargs")
    @classmethod
    def _plain_kwargs(cls, v: dict) -> dict:
        return check_json_like(v)


class EnvConfig(_Model):
    id: str = Field("CartPole-v1", min_length=1, max_length=300,
                    description="Gymnasium id, e.g. CartPole-v1 or ALE/Pong-v5 (registered by env.imports), "
                                "or an entry point module:Class",
                    json_schema_extra={"x-kubernetes-validations": [immutable("env.id")]})
    imports: list[ModulePath] = Field(
        default_factory=list, max_length=64,
        description="modules imported before the env is made (they register Gymnasium ids), in actors, "
                    "the evaluator and the profiler only")
    kwargs: Annotated[dict[str, Any], _FREE_FORM] = Field(
        default_factory=dict, description="keyword arguments of the env's constructor (plain data)")
    wrappers: list[EnvWrapper] = Field(
        default_factory=list, max_length=16,
        description="Gymnasium wrappers applied to each env in order (the first wraps the env itself), e.g. "
                    "{entryPoint: gymnasium.wrappers:FlattenObservation} for a Dict observation; imported where "
                    "envs are built, like env.imports")
    spaces: Optional[EnvSpaces] = Field(
        None, description="the env's observation and action spaces (tianji run fills them in); buffers and "
                          "learners read them here instead of building an env")
    num_envs: int = Field(8, ge=1, le=4096, description="vectorised envs per actor")
    fragment_length: int = Field(32, ge=1, le=10_000, description="steps per env in one fragment")
    seed: int = Field(1, ge=0, le=2**31 - 1 - 10**7,
                      description="base seed; actors, buffers and learners derive theirs from it (below 2**31)")
    frame_stack: int = Field(4, ge=1, le=16, description="Atari only")
    episodic_life: bool = Field(False, description="Atari only")
    clip_rewards: bool = Field(True, description="Atari only: learn from sign(reward)")

    @field_validator("id")
    @classmethod
    def _id_or_entry_point(cls, v: str) -> str:
        if ":" in v and not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(f"{v!r}: an entry point is module.path:Name, e.g. mypkg.envs:MyEnv")
        return v

    @field_validator("kwargs")
    @classmethod
    def _plain_kwargs(cls, v: dict) -> dict:
        return check_json_like(v)


class ModelConfig(_Model):
    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    encoder: Literal["auto", "mlp", "nature_cnn"] = "auto"
    actor_precision: Literal["float32", "bfloat16"] = Field(
        "float32", description="actors' inference precision. bfloat16 (opt-in) runs the policy from a bf16 copy "
                               "of the parameters (faster where the CPU has bf16 dot products); the stored "
                               "behaviour log-probs are those of that bf16 policy, so the learner sees slightly "
                               "off-policy data")
    entry_point: Optional[str] = Field(
        None, max_length=300, json_schema_extra={"pattern": ENTRY_POINT_PATTERN},
        description="a user's torch module, module.path:Class, built as Class(observation_space, action_space, "
                    "config) (docs/custom-envs.md); its module must be listed in env.imports or model.imports")
    imports: list[ModulePath] = Field(default_factory=list, max_length=64,
                                      description="modules that may provide model.entryPoint")
    config: Annotated[dict[str, Any], _FREE_FORM] = Field(
        default_factory=dict, description="plain-data configuration passed to model.entryPoint")

    @field_validator("entry_point")
    @classmethod
    def _entry_point(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(f"{v!r}: expected module.path:Class, e.g. mypkg.models:Net")
        return v

    @field_validator("config")
    @classmethod
    def _plain_config(cls, v: dict) -> dict:
        return check_json_like(v)


# ----------------------------------------------------------------- topology
class GroupSync(_Model):
    """How learner groups share one model (runtime/distributed.py)."""

    mode: Literal["allreduce", "average"] = Field(
        "average",
        description="average (default): gradients are all-reduced synchronously only among the learners of a "
                    "group; between groups, parameters are averaged asynchronously every intervalUpdates "
                    "updates (a non-blocking all-reduce, applied when it has completed, never waited on), so a "
                    "fast group never waits on a slow one. allreduce: every learner of every group in one "
                    "synchronous gradient all-reduce per step (one model, but every step waits for the slowest "
                    "learner). With one group both are the same")
    interval_updates: int = Field(20, ge=1, le=1_000_000,
                                  description="average mode: learner updates between cross-group averagings")


class Topology(_Model):
    """Processes per training group. `topology: auto` asks the planner."""

    auto: bool = False
    groups: int = Field(1, ge=1, le=1024)
    actors: int = Field(2, ge=1, le=4096, description="actor processes per group")
    buffers: int = Field(1, ge=1, le=256, description="buffer processes per group")
    learners: int = Field(1, ge=1, le=256, description="learner processes per group")
    group_sync: GroupSync = Field(default_factory=GroupSync,
                                  description="how groups share one model: synchronous gradient all-reduce or "
                                              "asynchronous parameter averaging")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if v == "auto":
            return {"auto": True}
        return v

    @model_validator(mode="after")
    def _fan_in(self) -> "Topology":
        if self.buffers > self.actors:
            raise ValueError(f"buffers ({self.buffers}) > actors ({self.actors}): a buffer would get no fragments")
        if self.learners > self.buffers:
            raise ValueError(f"learners ({self.learners}) > buffers ({self.buffers}): a learner would get no batches")
        return self


class Staleness(_Model):
    @model_validator(mode="before")
    @classmethod
    def _retired_fields(cls, v: Any) -> Any:
        # `ratioBand` was never read and is gone, but older run dirs, checkpoints, ConfigMaps and
        # objects defaulted by an older CRD (Helm does not upgrade CRDs) carry it: accept, ignore.
        if isinstance(v, dict) and ("ratioBand" in v or "ratio_band" in v):
            v = {k: x for k, x in v.items() if k not in ("ratioBand", "ratio_band")}
        return v

    max_policy_lag: Optional[int] = Field(
        None, ge=0, description="drop samples older than this many learner versions (default: 4 for PPO, off for DQN)"
    )
    replay_ratio: Optional[float] = Field(
        None, gt=0, description="samples consumed per sample inserted (default: 1 for PPO, 32 for DQN)"
    )
    pace_actors: bool = Field(True, description="actors pace production to the learner's advertised capacity")
    pace_headroom: float = Field(
        1.2, ge=1, le=10,
        description="when pacing, actors start at this multiple of learner capacity / replayRatio; the learner "
                    "then adapts it to keep dropped samples under 5 % without starving itself",
    )
    replay_error_buffer: Optional[float] = Field(
        None, gt=0,
        description="off-policy: samples the replay limiter lets consumed - replayRatio x inserted (counted from "
                    "learningStarts) drift either way before it holds back batches or refuses inserts (Reverb's "
                    "error_buffer; default batchSize x stepsPerBatch + replayRatio x numEnvs x fragmentLength)",
    )
    credit_window: Optional[int] = Field(
        None, ge=1, le=64, description="batches in flight from a buffer to its learner (default: 1 for PPO, whose "
        "every queued batch adds a version of policy lag; 2 for DQN)")
    queue_fragments: int = Field(64, ge=1, description="on-policy queue bound (fragments) per buffer")
    publish_every: int = Field(1, ge=1, description="learner versions between parameter publishes")


class StopConfig(_Model):
    mean_return: Optional[float] = Field(None, description="stop when the mean of the last 100 episodes reaches it")
    env_frames: Optional[int] = Field(None, ge=1)
    seconds: Optional[float] = Field(None, gt=0)


class CheckpointConfig(_Model):
    """Learner checkpoints (model, optimizer, policy version, counters), written every
    intervalSeconds and as a learner stops. On Kubernetes they outlive the pod when they are on
    a claim: persistentVolumeClaim, size, or by default one claim per learner pod from the
    cluster's default StorageClass; with `ephemeral` (or no default class: status condition
    Durable says so) they are in an emptyDir and a replaced learner starts over."""

    interval_seconds: float = Field(60.0, gt=0)
    keep: int = Field(3, ge=1, le=100)
    # Kubernetes only: where learners keep checkpoints. Default: one claim per learner pod from the
    # cluster's default StorageClass (status condition Durable); an emptyDir only when asked
    # (`ephemeral`) or when the cluster has no default class (then Durable is False and says so).
    persistent_volume_claim: Optional[str] = Field(
        None, min_length=1, max_length=253, json_schema_extra={"pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        description="an existing PersistentVolumeClaim for the learners' checkpoints")
    size: Optional[str] = Field(None, json_schema_extra={"pattern": QUANTITY_PATTERN},
                                description="the operator creates a claim <job>-checkpoints of this size")
    storage_class_name: Optional[str] = Field(None, min_length=1, description="its storage class (default: the "
                                                                              "cluster's default class)")
    access_mode: Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany when learners may run on several nodes")
    ephemeral: bool = Field(
        False, description="Kubernetes: keep learner state in an emptyDir, lost with its pod (a replaced or "
                           "resumed learner starts again from policy version 0). Default false: each learner "
                           "pod gets a claim <job>-state-<pod> from the cluster's default StorageClass")
    replay_snapshot: bool = Field(
        False, description="DQN: each buffer also writes its replay (every intervalSeconds and on exit) and a "
                           "resumed buffer loads it, so training goes on without a new warm-up. Off by default: "
                           "a snapshot is the whole ring (GBs for Atari) and "
                           "briefly doubles the buffer's memory while it is written")

    @field_validator("size")
    @classmethod
    def _size(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and quantity_value(v) <= 0:
            raise ValueError(f"{v!r}: a claim needs a positive size")
        return v

    @model_validator(mode="after")
    def _one_volume(self) -> "CheckpointConfig":
        if self.persistent_volume_claim and (self.size or self.storage_class_name):
            raise ValueError("persistentVolumeClaim names an existing claim: size and storageClassName are for "
                             "the claim the operator creates; set one or the other")
        if self.ephemeral and (self.persistent_volume_claim or self.size):
            raise ValueError("ephemeral keeps learner state in an emptyDir: persistentVolumeClaim and size "
                             "name a claim; set one or the other")
        if self.storage_class_name and not self.size:
            raise ValueError("storageClassName needs size (the claim the operator creates)")
        if self.replay_snapshot and self.size and self.access_mode == "ReadWriteOncePod":
            raise ValueError("replaySnapshot: buffers mount the checkpoint claim beside the learners; "
                             "ReadWriteOncePod admits one pod")
        return self


class EvaluationConfig(_Model):
    """Periodic evaluation during training: one evaluator process takes the learner's parameters
    like an actor and, every intervalSeconds, plays `episodes` episodes with the greedy policy
    (PPO: the mode; DQN: epsilon-greedy) on envs of its own (runtime/roles/evaluator.py)."""

    interval_seconds: Optional[float] = Field(
        None, gt=0, le=86_400, description="seconds between evaluations; unset or null: no evaluation")
    episodes: int = Field(10, ge=1, le=1000, description="episodes per evaluation, the same count from each of "
                                                          "the most envs (at most 8) that divide it")
    epsilon: float = Field(0.05, ge=0, le=1, description="DQN: exploration rate of the evaluation policy "
                                                          "(0.05: the Atari protocol); ignored by PPO")

    @property
    def enabled(self) -> bool:
        return self.interval_seconds is not None


class RoleResources(_Model):
    cpu: float = Field(1.0, ge=MIN_CPU, description="cores requested per process (at least 0.001: one millicore)")
    memory: str = Field("1Gi", json_schema_extra={"pattern": QUANTITY_PATTERN},
                        description=f"a Kubernetes quantity, e.g. 512Mi or 2Gi; at least {MIN_MEMORY}")
    gpu: int = Field(0, ge=0, le=16)
    threads: Optional[int] = Field(None, ge=1, le=256, description="torch threads (default: floor(cpu), >=1)")

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if quantity_value(v) < quantity_value(MIN_MEMORY):
            raise ValueError(f"{v!r} is below the minimum of {MIN_MEMORY} (a unit missing?)")
        return v


def _learner_resources() -> RoleResources:
    return RoleResources(cpu=1.0, memory="2Gi")


class Resources(_Model):
    cpus: Optional[float] = Field(None, gt=0, description="total cores the planner may use (M)")
    gpus: int = Field(0, ge=0)
    nodes: int = Field(1, ge=1)
    cpus_per_node: Optional[float] = Field(None, gt=0)
    actor: RoleResources = Field(default_factory=RoleResources)
    buffer: RoleResources = Field(default_factory=lambda: RoleResources(cpu=0.5, memory="1Gi"))
    learner: RoleResources = Field(default_factory=_learner_resources)
    evaluator: RoleResources = Field(default_factory=lambda: RoleResources(cpu=0.5, memory="1Gi"),
                                     description="the evaluator process (only with spec.evaluation)")


class PlanConfig(_Model):
    """The planner's budget rule (tianji.control.objective)."""

    min_marginal_gain: float = Field(
        0.5, ge=0, le=1,
        description="topology: auto sizes the job no bigger than its predicted progress pays for: a plan using k "
                    "times the resources (cores/M + GPUs/G) of a smaller one must predict at least k^x its "
                    "effective progress (samples/s discounted by batch growth and policy lag; time to target is "
                    "its inverse). 0.5 (default): doubling must buy at least 41 % more; 0: the most progress the "
                    "budget buys; 1: the most per core")


class Link(_Model):
    """The network between the job's processes, for the planner's communication terms:
    a named preset, or bandwidth and latency (tianji.control.costmodel.LINK_PRESETS)."""

    preset: Optional[Literal["loopback", "ethernet-10g", "infiniband-hdr"]] = Field(
        None, description="loopback: one machine (the profile's measured message cost); ethernet-10g; "
                          "infiniband-hdr (200 Gb/s)")
    bandwidth_gbps: Optional[float] = Field(None, gt=0, le=100_000, description="per-process link, Gbit/s")
    latency_us: Optional[float] = Field(None, ge=0, le=1_000_000, description="one-way, microseconds")

    @model_validator(mode="after")
    def _one_kind(self) -> "Link":
        custom = (self.bandwidth_gbps is not None, self.latency_us is not None)
        if not ((self.preset is not None and not any(custom)) or (self.preset is None and all(custom))):
            raise ValueError("give either preset, or both bandwidthGbps and latencyUs")
        return self


class Network(_Model):
    host_network: bool = False
    rdma: Optional[str] = Field(None, json_schema_extra={"pattern": EXTENDED_RESOURCE_PATTERN},
                                description="RDMA device resource name, e.g. rdma/hca_shared_devices_a")
    base_port: int = Field(5550, ge=1024, le=65535 - LAST_PORT_OFFSET,
                           description=f"the data ports are basePort..basePort+{LAST_PORT_OFFSET}")
    encryption: Literal["curve", "none"] = Field(
        "curve", description="curve: every socket of the job authenticated and encrypted with the job's own "
        "CurveZMQ key pair; none: plaintext, and anyone who can reach a socket can talk to it")
    metrics_port: int = Field(9090, ge=1024, le=65535,
                              description=f"must lie outside basePort..basePort+{LAST_PORT_OFFSET}; with "
                                          "hostNetwork every pod gets its own ports (docs/kubernetes.md)")
    interface: Optional[str] = Field(
        None, json_schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$"},
        description="hostNetwork only: the node interface whose IPv4 address the data sockets bind on and "
                    "peers connect to, e.g. ib0 (ZeroMQ over TCP on IPoIB); unset: the node's IP")
    link: Optional[Link] = Field(None, description="for the planner; unset: loopback on one node, across nodes "
                                                   "the profile's measured link (tianji profile --link-measure), "
                                                   "else ethernet-10g")

    @field_validator("rdma")
    @classmethod
    def _extended_resource(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        if not re.fullmatch(EXTENDED_RESOURCE_PATTERN, v) or len(v.split("/")[0]) > 253:
            raise ValueError(f"{v!r} is not an extended resource name: expected domain/name, "
                             "e.g. rdma/hca_shared_devices_a")
        domain = v.split("/")[0]
        if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
            raise ValueError(f"{v!r}: the kubernetes.io domain is reserved for Kubernetes' own resources")
        if v == "nvidia.com/gpu":
            raise ValueError("nvidia.com/gpu is requested by resources.<role>.gpu, not as the RDMA device")
        return v

    @model_validator(mode="after")
    def _interface_needs_host_network(self) -> "Network":
        if self.interface is not None:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}", self.interface):
                raise ValueError(f"interface {self.interface!r} is not a network interface name")
            if not self.host_network:
                raise ValueError("interface needs hostNetwork: true (a pod on the pod network has only its own "
                                 "interface)")
        return self

    @field_validator("metrics_port")
    @classmethod
    def _outside_data_ports(cls, v: int, info: ValidationInfo) -> int:
        base = info.data.get("base_port")  # absent when basePort itself is invalid
        if base is not None and base <= v <= base + LAST_PORT_OFFSET:
            raise ValueError(f"{v} is one of the data ports basePort..basePort+{LAST_PORT_OFFSET} "
                             f"({base}-{base + LAST_PORT_OFFSET})")
        return v


class Autoscale(_Model):
    enabled: bool = Field(False, description="shorthand for mode: planner (when mode is unset)")
    mode: Optional[Literal["planner", "external", "off"]] = Field(
        None, description="planner: the operator rescales actors from throughput; external: HPA/KEDA/a person "
                          "set actors (the scale subresource or the StatefulSets) and the operator adopts them; "
                          "off: topology.actors. Unset: planner if enabled, else off")
    prometheus_url: Optional[str] = Field(None, description="must match the operator's allow-list "
                                                            "(chart operator.prometheusAllowList)")
    min_actors: int = Field(1, ge=1)
    max_actors: int = Field(64, ge=1)
    band: float = Field(0.15, ge=0, lt=1, description="hysteresis band on production/consumption")
    cooldown_seconds: float = Field(60.0, ge=0, description="default of both cooldowns below")
    scale_up_cooldown_seconds: Optional[float] = Field(None, ge=0, description="after any change, before adding")
    scale_down_cooldown_seconds: Optional[float] = Field(None, ge=0, description="after any change, before removing")
    interval_seconds: float = Field(15.0, gt=0)

    @property
    def effective_mode(self) -> str:
        return self.mode or ("planner" if self.enabled else "off")

    def cooldown(self, direction: str) -> float:
        own = self.scale_up_cooldown_seconds if direction == "up" else self.scale_down_cooldown_seconds
        return self.cooldown_seconds if own is None else own

    @model_validator(mode="after")
    def _bounds(self) -> "Autoscale":
        if self.min_actors > self.max_actors:
            raise ValueError(f"minActors ({self.min_actors}) > maxActors ({self.max_actors})")
        return self


# ----------------------------------------------------------------- pod overlay (Kubernetes only)
_FREE = {"x-kubernetes-preserve-unknown-fields": True}
# What the operator itself puts in every pod: an overlay may not redefine it.
RESERVED_VOLUMES = ("job", "state", "dshm", "scratch", "curve")
RESERVED_MOUNT_PATHS = ("/etc/tianji", "/var/lib/tianji", "/dev/shm", "/tmp", "/etc/tianji-curve")
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class Toleration(_Model):
    key: Optional[str] = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Optional[str] = None
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    toleration_seconds: Optional[int] = None


class EnvVar(_Model):
    name: str = Field(..., min_length=1, json_schema_extra={"pattern": _ENV_NAME})
    value: Optional[str] = None
    value_from: Optional[dict[str, Any]] = Field(None, json_schema_extra=_FREE,
                                                 description="a Kubernetes EnvVarSource")

    @field_validator("name")
    @classmethod
    def _not_ours(cls, v: str) -> str:
        if not re.fullmatch(_ENV_NAME, v):
            raise ValueError(f"{v!r} is not an environment variable name")
        if v.startswith("TIANJI_"):
            raise ValueError(f"{v}: TIANJI_* variables are set by the operator (tianji.control.launch)")
        return v


class VolumeMount(_Model):
    name: str = Field(..., min_length=1)
    mount_path: str = Field(..., min_length=1)
    read_only: bool = False
    sub_path: Optional[str] = None


class PodOverlay(_Model):
    """Added to the pods of a role (or of all roles): scheduling and extra volumes/env."""

    node_selector: Optional[dict[str, str]] = None
    tolerations: Optional[list[Toleration]] = None
    affinity: Optional[dict[str, Any]] = Field(None, json_schema_extra=_FREE, description="a Kubernetes Affinity")
    priority_class_name: Optional[str] = None
    image_pull_secrets: Optional[list[str]] = Field(None, description="names of Secrets")
    service_account_name: Optional[str] = None
    env: Optional[list[EnvVar]] = None
    volumes: Optional[list[dict[str, Any]]] = Field(
        None, json_schema_extra={"items": {"type": "object", **_FREE}}, description="Kubernetes Volumes")
    volume_mounts: Optional[list[VolumeMount]] = None

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
    actor: PodOverlay = Field(default_factory=PodOverlay)
    buffer: PodOverlay = Field(default_factory=PodOverlay)
    learner: PodOverlay = Field(default_factory=PodOverlay)
    evaluator: PodOverlay = Field(default_factory=PodOverlay)


class RunPolicy(_Model):
    """How the job runs on Kubernetes: retries, time limits, clean-up, queueing (Kubeflow's RunPolicy)."""

    backoff_limit: int = Field(
        6, ge=0, le=1000,
        description="container restarts (all pods of the job together) before the job fails with "
                    "reason BackoffLimitExceeded")
    active_deadline_seconds: Optional[int] = Field(
        None, ge=1, description="the job fails (DeadlineExceeded) when it has been active this long, counted "
                                "from its creation or its last resume")
    ttl_seconds_after_finished: Optional[int] = Field(
        None, ge=0, description="delete the TianJiJob (and with it its children) this long after it ended")
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        "Running", description="at the end: Running deletes learner/buffer pods still running and scales "
                               "actors to 0; All deletes finished ones too; None keeps them")
    suspend: bool = Field(
        False, description="true deletes the pods; false again resumes (Kubernetes Job / Kueue semantics). "
                           "Kept: the counts (in status) and the learners' checkpoints when they are on a claim "
                           "(the default, see status condition Durable); with an emptyDir "
                           "(checkpoint.ephemeral, or no default StorageClass) the learners start over")


# Fields that moved: old name -> (new section, new name). Accepted on read (older manifests,
# ConfigMaps written by an older operator, objects stored under an older CRD: Helm does not
# upgrade CRDs) and moved; `deprecated_fields` names them for a warning.
MOVED_FIELDS = {"cleanPodPolicy": ("runPolicy", "cleanPodPolicy")}


def deprecated_fields(spec: Any) -> list[str]:
    """Deprecation notes for the moved fields a raw spec dict uses."""
    if not isinstance(spec, dict):
        return []
    return [f"spec.{old} is deprecated: use spec.{new[0]}.{new[1]}" for old, new in MOVED_FIELDS.items()
            if old in spec]


class WandbConfig(_Model):
    """Weights & Biases logging by `tianji run` (its launcher logs what it writes to metrics.jsonl)."""

    project: str = Field(min_length=1, max_length=128, description="W&B project")
    entity: Optional[str] = Field(None, min_length=1, max_length=128, description="W&B entity (team or user)")
    group: Optional[str] = Field(None, min_length=1, max_length=128, description="W&B run group")
    mode: Literal["online", "offline"] = Field("online", description="offline: write under the run dir, sync later")


class JobSpec(_Model):
    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        v = dict(v)
        for old, (section, new) in MOVED_FIELDS.items():
            snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), old)
            for key in (old, snake):
                if key not in v:
                    continue
                value = v.pop(key)
                sec_key = section if section in v else re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(),
                                                              section)
                sec = v.get(sec_key)
                if isinstance(sec, BaseModel):
                    sec = sec.model_dump(by_alias=True, exclude_unset=True)
                sec = dict(sec or {})
                have = sec.get(new, sec.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), new)))
                if have is not None and have != value:
                    raise ValueError(f"{old} ({value!r}) and {section}.{new} ({have!r}) disagree: "
                                     f"{old} is deprecated, set {section}.{new} only")
                sec.setdefault(new, value)
                v[sec_key] = sec
        return v

    algorithm: Algorithm = Field(default_factory=PPOConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    topology: Topology = Field(default_factory=Topology)
    staleness: Staleness = Field(default_factory=Staleness)
    dependencies: Literal["relaxed", "strict"] = Field(
        "relaxed", description="relaxed (default): actors, buffers and learners never wait for one another (the "
        "paper's design). strict: the classic synchronous loop on the same processes and wire, the paper's "
        "baseline (bench/ablation.py): each actor sends one rollout (batchSize / actors per buffer samples) and "
        "waits for the policy trained on it; the learner trains on exactly the last rollout of every actor "
        "(policy lag 0). PPO only")
    stop: StopConfig = Field(default_factory=StopConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    resources: Resources = Field(default_factory=Resources)
    plan: PlanConfig = Field(default_factory=PlanConfig, description="the planner's budget rule (topology: auto)")
    network: Network = Field(default_factory=Network)
    autoscale: Autoscale = Field(default_factory=Autoscale)
    image: str = Field("tianji-worker:0.1.0", min_length=1,
                       json_schema_extra={"pattern": IMAGE_PATTERN, "x-kubernetes-validations": [immutable("image")]},
                       description="worker image reference, e.g. registry.example.com/tianji-worker:0.1.0")
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    pods: Pods = Field(default_factory=Pods)
    wandb: Optional[WandbConfig] = Field(None, description="optional Weights & Biases logging, local runs "
                                         "(`tianji run`; needs the `tianji[wandb]` extra); the operator ignores it")

    @field_validator("image")
    @classmethod
    def _image_reference(cls, v: str) -> str:
        if not re.fullmatch(IMAGE_PATTERN, v):
            raise ValueError(f"{v!r} is not an image reference: [registry[:port]/]name[:tag][@digest], "
                             "name in lowercase")
        return v

    @model_validator(mode="after")
    def _algo_fits(self) -> "JobSpec":
        a = self.algorithm
        if isinstance(a, PPOConfig):
            if self.staleness.replay_error_buffer is not None:
                raise ValueError("staleness.replayErrorBuffer is for off-policy (dqn) replay only")
            if a.minibatch_size > a.batch_size:
                raise ValueError(f"algorithm.minibatchSize ({a.minibatch_size}) > algorithm.batchSize ({a.batch_size})")
            frag = self.env.num_envs * self.env.fragment_length
            if a.batch_size % frag:
                raise ValueError(
                    f"algorithm.batchSize ({a.batch_size}) must be a multiple of one fragment "
                    f"(env.numEnvs x env.fragmentLength = {frag})"
                )
        if isinstance(a, PPOConfig) and self.checkpoint.replay_snapshot:
            raise ValueError("checkpoint.replaySnapshot is for off-policy (dqn) replay only; ppo keeps no replay")
        if isinstance(a, DQNConfig) and a.batch_size > a.replay_capacity:
            raise ValueError("algorithm.batchSize > algorithm.replayCapacity")
        if isinstance(a, DQNConfig):
            try:  # the buffer's limiter refuses settings that could deadlock: refuse them here, at submission
                self.replay_limiter()
            except ValueError as e:
                raise ValueError(f"staleness.replayErrorBuffer: {e}") from None
        return self

    def replay_limiter(self) -> SampleToInsertRatio:
        """The sample-to-insert limiter of each off-policy buffer (control/ratelimit.py)."""
        a = self.algorithm
        return SampleToInsertRatio.for_replay(self.replay_ratio, a.learning_starts, a.batch_size * a.steps_per_batch,
                                              self.env.num_envs * self.env.fragment_length,
                                              self.staleness.replay_error_buffer)

    @model_validator(mode="after")
    def _strict_fits(self) -> "JobSpec":
        """dependencies: strict needs a topology whose rounds close: every learner fed by one buffer, and
        the actors of a buffer filling one batch with one rollout each (runtime/roles/actor.py)."""
        if self.dependencies != "strict":
            return self
        t, st = self.topology, self.staleness
        if self.algorithm.name != "ppo":
            raise ValueError("dependencies: strict is implemented for ppo (a DQN learner trains on replay, "
                             "whose rounds the sample-to-insert limiter sets, not the actors)")
        if t.auto or self.autoscale.effective_mode != "off":
            raise ValueError("dependencies: strict runs the topology it is given: not with topology: auto or "
                             "autoscale")
        if st.publish_every != 1:  # (maxPolicyLag is moot: strict drops any sample with lag > 0)
            raise ValueError("dependencies: strict: actors wait for every new version, so "
                             "staleness.publishEvery must be 1")
        if t.buffers != t.learners or t.actors % t.buffers:
            raise ValueError(f"dependencies: strict needs buffers == learners and actors a multiple of buffers "
                             f"(got actors {t.actors}, buffers {t.buffers}, learners {t.learners})")
        if t.groups > 1 and t.group_sync.mode != "allreduce":
            raise ValueError("dependencies: strict with several groups needs topology.groupSync.mode: allreduce")
        frags = self.algorithm.batch_size // (self.env.num_envs * self.env.fragment_length)
        if frags % (t.actors // t.buffers):
            raise ValueError(f"dependencies: strict: a batch of {frags} fragment(s) cannot be split evenly over "
                             f"the {t.actors // t.buffers} actor(s) of a buffer; make algorithm.batchSize a "
                             "multiple of actors per buffer x env.numEnvs x env.fragmentLength")
        return self

    @model_validator(mode="after")
    def _model_import_gate(self) -> "JobSpec":
        """A model class is an import on every worker: only from a module the job lists."""
        ep = self.model.entry_point
        if ep is not None:
            module = ep.split(":", 1)[0]
            if not import_allowed(module, (*self.env.imports, *self.model.imports)):
                raise ValueError(f"model.entryPoint: module {module!r} is not in a package listed in "
                                 "env.imports or model.imports")
        return self

    @model_validator(mode="after")
    def _host_ports(self) -> "JobSpec":
        """Host networking gives every (group, index) slot its own ports (addressing.py): the
        data and metrics ranges must fit below 65536 and never overlap."""
        net, t = self.network, self.topology
        if not net.host_network or t.auto:
            return self
        data, metrics = host_port_ranges(net.base_port, net.metrics_port, t.groups, t.buffers)
        for what, r in (("data", data), ("metrics", metrics)):
            if r.stop - 1 > 65535:
                raise ValueError(f"network: with hostNetwork, {t.groups} group(s) x {t.buffers} buffer(s) take "
                                 f"{what} ports {r.start}-{r.stop - 1}, beyond 65535: lower "
                                 f"network.{'basePort' if what == 'data' else 'metricsPort'}")
        if data.start < metrics.stop and metrics.start < data.stop:
            raise ValueError(f"network: with hostNetwork, data ports {data.start}-{data.stop - 1} and metrics "
                             f"ports {metrics.start}-{metrics.stop - 1} overlap: move network.metricsPort")
        return self

    # Derived defaults that depend on the algorithm.
    @property
    def max_policy_lag(self) -> Optional[int]:
        if self.dependencies == "strict":
            return 0
        if self.staleness.max_policy_lag is not None:
            return self.staleness.max_policy_lag
        return 4 if self.algorithm.name == "ppo" else None

    @property
    def credit_window(self) -> int:
        """PPO 1: a second batch queued behind the one in training is consumed a version later (measured on
        Acrobot with a peer's 4096-sample, 4-epoch settings: mean lag 2.0 with 2, 1.35 with 1, and 15 %
        fewer frames to the target; docs/ablation.md). DQN 2: its batches are replay samples, not lag."""
        if self.staleness.credit_window is not None:
            return self.staleness.credit_window
        return 1 if self.algorithm.name == "ppo" else 2

    @property
    def replay_ratio(self) -> float:
        if self.staleness.replay_ratio is not None:
            return self.staleness.replay_ratio
        return 1.0 if self.algorithm.name == "ppo" else 32.0


JOB_NAME_PATTERN = r"[a-z]([-a-z0-9]*[a-z0-9])?"


class Metadata(_Model):
    name: str = Field(..., min_length=1, max_length=40)
    namespace: Optional[str] = Field(None, max_length=63)
    labels: Optional[dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]]] = None
    annotations: Optional[dict[Annotated[str, Field(max_length=317)], str]] = None

    @model_validator(mode="after")
    def _annotations_size(self) -> "Metadata":
        if self.annotations and sum(len(k) + len(v) for k, v in self.annotations.items()) > 256 * 1024:
            raise ValueError("annotations: more than 256 KiB in all (the Kubernetes limit)")
        return self

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        # Child names are <name>-<role>-<g>-<i> and the job's Service is <name>: a Service name is a
        # DNS-1035 label, which must start with a letter.
        if not re.fullmatch(JOB_NAME_PATTERN, v):
            raise ValueError("must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter")
        return v


class TianJiJob(_Model):
    api_version: Literal["tianji.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["TianJiJob"] = KIND
    metadata: Metadata
    spec: JobSpec = Field(default_factory=JobSpec)

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ----------------------------------------------------------------- loading
def _path_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("ppo", "dqn", "function-before[_shorthand()]"):
            continue  # discriminator / validator tags, not user-visible fields
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def _message(e: dict) -> str:
    # Our validators' own words, without pydantic's "Value error, " prefix.
    if e["type"] == "value_error":
        return str(e["ctx"]["error"])
    return e["msg"]


def _where(e: dict) -> str:
    path, err = _path_str(e["loc"]), (e.get("ctx") or {}).get("error")
    if isinstance(err, _FieldError) and err.key:
        if path == "(root)":
            return err.key
        return f"{path}{err.key}" if err.key.startswith("[") else f"{path}.{err.key}"
    return path


def _line(e: dict, source: str) -> str:
    better = better_message(e, TianJiJob)  # unknown fields and wrong choices: "did you mean"
    if better is not None:
        return f"{source}: {_where(e)}{better[0]}: {better[1]}"
    return f"{source}: {_where(e)}: {_message(e)}"


def format_validation_error(err: ValidationError, source: str) -> str:
    return "\n".join(_line(e, source) for e in err.errors())


def _parse_scalar(key: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        return safe_yaml(text, root=key.strip())
    except ManifestYAMLError as e:
        raise SpecError(f"--set {e.field}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"--set {key}: value {text!r} is not valid YAML: {yaml_problem(e)}") from None
    except RecursionError:
        raise SpecError(f"--set {key}: value nested too deeply") from None


def apply_override(doc: dict, assignment: str) -> None:
    """Apply one `--set spec.algorithm.lr=3e-4` to a manifest dict (camelCase paths)."""
    if "=" not in assignment:
        raise SpecError(f"--set {assignment!r}: expected KEY=VALUE, e.g. spec.algorithm.lr=3e-4")
    key, value = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise SpecError(f"--set {assignment!r}: empty key")
    node = doc
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt == "auto" and p == "topology":
            nxt = node[p] = {"auto": True}
        if nxt is None or not isinstance(nxt, dict):
            if nxt is not None:
                raise SpecError(f"--set {key}: {p} is not a mapping")
            nxt = node[p] = {}
        node = nxt
    node[parts[-1]] = _parse_scalar(key, value)


def parse_job(doc: Any, source: str = "<manifest>") -> TianJiJob:
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a TianJiJob mapping, got {type(doc).__name__}")
    if doc.get("kind") not in (None, KIND):
        raise SpecError(f"{source}: kind: expected {KIND}, got {doc.get('kind')!r}")
    try:
        return TianJiJob.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TianJiJob:
    """Read, override and validate a manifest. Raises SpecError naming file and field."""
    path = Path(path)
    try:
        doc = read_manifest(path)
    except UnreadableManifest as e:
        raise SpecError(str(e)) from None
    if isinstance(doc, dict):
        for o in overrides:
            apply_override(doc, o)
    return parse_job(doc, str(path))


def dump_job(job: TianJiJob) -> str:
    return yaml.safe_dump(job.to_manifest(), sort_keys=False)
