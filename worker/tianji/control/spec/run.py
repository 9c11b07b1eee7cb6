"""How a TianJiJob runs: topology, staleness, stop rule, checkpoints, evaluation."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from tianji.control.contracts.curvekeys import ACTOR_ORDINALS
from tianji.control.spec.base import QUANTITY_PATTERN, _Model, quantity_value


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
        "learner). With one group both are the same",
    )
    interval_updates: int = Field(
        20, ge=1, le=1_000_000, description="average mode: learner updates between cross-group averagings"
    )


class Topology(_Model):
    """Processes per training group. `topology: auto` asks the planner."""

    auto: bool = Field(
        False,
        description="let the planner choose groups, actors, buffers and learners (`topology: auto` is the shorthand)",
    )
    groups: int = Field(
        1,
        ge=1,
        le=1024,
        description="training groups, each with its own actors, buffers and learners, sharing one model (groupSync)",
    )
    actors: int = Field(2, ge=1, le=ACTOR_ORDINALS, description="actor processes per group")
    buffers: int = Field(1, ge=1, le=256, description="buffer processes per group")
    learners: int = Field(1, ge=1, le=256, description="learner processes per group")
    group_sync: GroupSync = Field(
        default_factory=GroupSync,
        description="how groups share one model: synchronous gradient all-reduce or asynchronous parameter averaging",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if v == "auto":
            return {"auto": True}
        return v

    @model_validator(mode="after")
    def _fan_in(self) -> Topology:
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
        None,
        ge=0,
        description="drop samples older than this many learner versions (default for PPO: about 256 "
        "optimizer steps of lag, 1-4 versions of epochs x batchSize / minibatchSize steps; off for DQN)",
    )
    replay_ratio: Optional[float] = Field(
        None, gt=0, description="samples consumed per sample inserted (default: 1 for PPO, 32 for DQN)"
    )
    pace_actors: bool = Field(True, description="actors pace production to the learner's advertised capacity")
    pace_headroom: float = Field(
        1.2,
        ge=1,
        le=10,
        description="when pacing, actors start at this multiple of learner capacity / replayRatio; the learner "
        "then adapts it to keep dropped samples under 5 % without starving itself",
    )
    replay_error_buffer: Optional[float] = Field(
        None,
        gt=0,
        description="off-policy: samples the replay limiter lets consumed - replayRatio x inserted (counted from "
        "learningStarts) drift either way before it holds back batches or refuses inserts (Reverb's "
        "error_buffer; default batchSize x stepsPerBatch + replayRatio x numEnvs x fragmentLength)",
    )
    credit_window: Optional[int] = Field(
        None,
        ge=1,
        le=64,
        description="batches in flight from a buffer to its learner (default: 1 for PPO, whose "
        "every queued batch adds a version of policy lag; 2 for DQN)",
    )
    queue_fragments: int = Field(64, ge=1, description="on-policy queue bound (fragments) per buffer")
    publish_every: int = Field(1, ge=1, description="learner versions between parameter publishes")


class StopConfig(_Model):
    """When a run ends: the first rule met. `tianji run` needs one set (or --max-seconds); a job on
    Kubernetes without one runs until it is deleted, suspended or past runPolicy.activeDeadlineSeconds."""

    mean_return: Optional[float] = Field(
        None, description="stop when the mean of the last 100 episodes reaches it (with a trained policy: version > 0)"
    )
    env_frames: Optional[int] = Field(None, ge=1, description="stop after this many env frames (all actors)")
    seconds: Optional[float] = Field(None, gt=0, description="stop after this many seconds of wall-clock time")

    @property
    def empty(self) -> bool:
        return self.mean_return is None and self.env_frames is None and self.seconds is None


def stop_problem(stop: StopConfig, max_seconds: Optional[float] = None) -> Optional[str]:
    """Why a local run with this stop rule (and `--max-seconds`) would never end, or None."""
    if stop.empty and max_seconds is None:
        return (
            "spec.stop: no stop rule, so the run would never end: set meanReturn, envFrames or seconds "
            "(or give `tianji run --max-seconds`)"
        )
    return None


class CheckpointConfig(_Model):
    """Learner checkpoints (model, optimizer, policy version, counters), written every
    intervalSeconds or intervalVersions policy versions, whichever comes first, and as a learner
    stops (a force-deleted or node-lost learner loses at most one interval). On Kubernetes they
    outlive the pod when they are on a claim: persistentVolumeClaim, size, or by default one
    claim per learner pod from the cluster's default StorageClass; with `ephemeral` (or no
    default class: status condition Durable says so) they are in an emptyDir and a replaced learner starts over."""

    interval_seconds: float = Field(60.0, gt=0, description="seconds between a learner's checkpoints")
    interval_versions: Optional[int] = Field(
        100,
        ge=1,
        description="policy versions between a learner's checkpoints (null: by time only)",
    )
    keep: int = Field(3, ge=1, le=100, description="checkpoints kept per learner (the newest)")
    # Kubernetes only: where learners keep checkpoints. Default: one claim per learner pod from the
    # cluster's default StorageClass (status condition Durable); an emptyDir only when asked
    # (`ephemeral`) or when the cluster has no default class (then Durable is False and says so).
    persistent_volume_claim: Optional[str] = Field(
        None,
        min_length=1,
        max_length=253,
        json_schema_extra={"pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        description="an existing PersistentVolumeClaim for the learners' checkpoints",
    )
    size: Optional[str] = Field(
        None,
        json_schema_extra={"pattern": QUANTITY_PATTERN},
        description="the operator creates a claim <job>-checkpoints of this size",
    )
    storage_class_name: Optional[str] = Field(
        None, min_length=1, description="its storage class (default: the cluster's default class)"
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany when learners may run on several nodes"
    )
    ephemeral: bool = Field(
        False,
        description="Kubernetes: keep learner state in an emptyDir, lost with its pod (a replaced or "
        "resumed learner starts again from policy version 0). Default false: each learner "
        "pod gets a claim <job>-state-<pod> from the cluster's default StorageClass",
    )
    replay_snapshot: bool = Field(
        False,
        description="DQN: each buffer also writes its replay (every intervalSeconds and on exit) and a "
        "resumed buffer loads it, so training goes on without a new warm-up. Off by default: "
        "a snapshot is the whole ring (GBs for Atari) and "
        "briefly doubles the buffer's memory while it is written",
    )

    @field_validator("size")
    @classmethod
    def _size(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and quantity_value(v) <= 0:
            raise ValueError(f"{v!r}: a claim needs a positive size")
        return v

    @model_validator(mode="after")
    def _one_volume(self) -> CheckpointConfig:
        if self.persistent_volume_claim and (self.size or self.storage_class_name):
            raise ValueError(
                "persistentVolumeClaim names an existing claim: size and storageClassName are for "
                "the claim the operator creates; set one or the other"
            )
        if self.ephemeral and (self.persistent_volume_claim or self.size):
            raise ValueError(
                "ephemeral keeps learner state in an emptyDir: persistentVolumeClaim and size "
                "name a claim; set one or the other"
            )
        if self.storage_class_name and not self.size:
            raise ValueError("storageClassName needs size (the claim the operator creates)")
        if self.replay_snapshot and self.size and self.access_mode == "ReadWriteOncePod":
            raise ValueError(
                "replaySnapshot: buffers mount the checkpoint claim beside the learners; "
                "ReadWriteOncePod admits one pod"
            )
        return self


class EvaluationConfig(_Model):
    """Periodic evaluation during training: one evaluator process takes the learner's parameters
    like an actor and, every intervalSeconds, plays `episodes` episodes with the greedy policy
    (PPO: the mode; DQN: epsilon-greedy) on envs of its own (runtime/roles/evaluator.py)."""

    interval_seconds: Optional[float] = Field(
        None, gt=0, le=86_400, description="seconds between evaluations; unset or null: no evaluation"
    )
    episodes: int = Field(
        10,
        ge=1,
        le=1000,
        description="episodes per evaluation, the same count from each of the most envs (at most 8, or 128 for a "
        "native vector env such as CartPole's) that divide it",
    )
    epsilon: float = Field(
        0.05,
        ge=0,
        le=1,
        description="DQN: exploration rate of the evaluation policy (0.05: the Atari protocol); ignored by PPO",
    )

    @property
    def enabled(self) -> bool:
        return self.interval_seconds is not None
