"""The TianJiJob itself: its spec (with the cross-field rules), metadata and the whole object."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, Field, field_validator, model_validator

from tianji.control.contracts.addressing import host_port_ranges
from tianji.control.contracts.ratelimit import SampleToInsertRatio
from tianji.control.spec.actor import ActorConfig
from tianji.control.spec.algos import Algorithm, DQNConfig, PPOConfig
from tianji.control.spec.base import API_VERSION, IMAGE_PATTERN, KIND, _Model, immutable
from tianji.control.spec.env import EnvConfig, ModelConfig, import_allowed
from tianji.control.spec.lagbound import auto_dependencies, fitted_max_lag
from tianji.control.spec.pods import MOVED_FIELDS, Pods, RunPolicy
from tianji.control.spec.resources import Autoscale, Network, PlanConfig, Resources
from tianji.control.spec.run import CheckpointConfig, EvaluationConfig, Staleness, StopConfig, Topology


def deprecated_fields(spec: Any) -> list[str]:
    """Deprecation notes for the moved fields a raw spec dict uses."""
    if not isinstance(spec, dict):
        return []
    return [f"spec.{old} is deprecated: use spec.{new[0]}.{new[1]}" for old, new in MOVED_FIELDS.items() if old in spec]


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
                sec_key = section if section in v else re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), section)
                sec = v.get(sec_key)
                if isinstance(sec, BaseModel):
                    sec = sec.model_dump(by_alias=True, exclude_unset=True)
                sec = dict(sec or {})
                have = sec.get(new, sec.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), new)))
                if have is not None and have != value:
                    raise ValueError(
                        f"{old} ({value!r}) and {section}.{new} ({have!r}) disagree: "
                        f"{old} is deprecated, set {section}.{new} only"
                    )
                sec.setdefault(new, value)
                v[sec_key] = sec
        return v

    algorithm: Algorithm = Field(default_factory=PPOConfig)
    env: EnvConfig = Field(default_factory=EnvConfig, description="the Gymnasium env each actor steps, and how")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="the policy network: built-in, or your own torch module"
    )
    topology: Topology = Field(default_factory=Topology)
    actor: ActorConfig = Field(default_factory=ActorConfig, description="how actors run their policy")
    staleness: Staleness = Field(
        default_factory=Staleness,
        description="how stale a consumed sample may be, and how production follows consumption",
    )
    dependencies: Literal["auto", "relaxed", "strict"] = Field(
        "auto",
        description="relaxed: actors, buffers and learners never wait for one another (the paper's design). "
        "strict: the classic synchronous loop on the same processes and wire, the paper's baseline "
        "(bench/ablation.py): each actor sends one rollout (batchSize / actors per buffer samples) and waits "
        "for the policy trained on it; the learner trains on exactly the last rollout of every actor (policy "
        "lag 0). PPO only. auto (default): relaxed, except a PPO job whose policy version is at least 256 "
        "optimizer steps (epochs x batchSize / minibatchSize), with no staleness.maxPolicyLag set, on a "
        "topology strict runs: strict there, where it needed 0.5-0.75 of relaxed's frames in at most about "
        "the same time (control/spec/lagbound.py, docs/ablation.md)",
    )
    stop: StopConfig = Field(default_factory=StopConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    resources: Resources = Field(default_factory=Resources, description="the planner's budget and each role's requests")
    plan: PlanConfig = Field(default_factory=PlanConfig, description="the planner's budget rule (topology: auto)")
    network: Network = Field(default_factory=Network, description="ports, transport security, links")
    autoscale: Autoscale = Field(
        default_factory=Autoscale, description="Kubernetes: actors rescaled while the job runs"
    )
    image: str = Field(
        "tianji-worker:0.1.0",
        min_length=1,
        json_schema_extra={"pattern": IMAGE_PATTERN, "x-kubernetes-validations": [immutable("image")]},
        description="worker image reference, e.g. registry.example.com/tianji-worker:0.1.0",
    )
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    pods: Pods = Field(default_factory=Pods)
    wandb: Optional[WandbConfig] = Field(
        None,
        description="optional Weights & Biases logging, local runs "
        "(`tianji run`; needs the `tianji[wandb]` extra); the operator ignores it",
    )

    @field_validator("image")
    @classmethod
    def _image_reference(cls, v: str) -> str:
        if not re.fullmatch(IMAGE_PATTERN, v):
            raise ValueError(
                f"{v!r} is not an image reference: [registry[:port]/]name[:tag][@digest], name in lowercase"
            )
        return v

    @model_validator(mode="after")
    def _algo_fits(self) -> JobSpec:
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
        """The sample-to-insert limiter of each off-policy buffer (control/contracts/ratelimit.py)."""
        a = self.algorithm
        if not isinstance(a, DQNConfig):
            raise TypeError(f"{a.name} keeps no replay buffer: only an off-policy algorithm has a replay limiter")
        return SampleToInsertRatio.for_replay(
            self.replay_ratio,
            a.learning_starts,
            a.batch_size * a.steps_per_batch,
            self.env.num_envs * self.env.fragment_length,
            self.staleness.replay_error_buffer,
        )

    @model_validator(mode="after")
    def _strict_fits(self) -> JobSpec:
        if self.dependencies == "strict" and (why := self.strict_misfit()):
            raise ValueError(why)
        return self

    def strict_misfit(self) -> Optional[str]:
        """Why dependencies: strict cannot run this spec (None: it can). It needs a topology whose rounds
        close: every learner fed by one buffer, and the actors of a buffer filling one batch with one
        rollout each (runtime/roles/actor.py)."""
        t, st = self.topology, self.staleness
        if self.algorithm.name != "ppo":
            return (
                "dependencies: strict is implemented for ppo (a DQN learner trains on replay, "
                "whose rounds the sample-to-insert limiter sets, not the actors)"
            )
        if t.auto or self.autoscale.effective_mode != "off":
            return "dependencies: strict runs the topology it is given: not with topology: auto or autoscale"
        if st.publish_every != 1:  # (maxPolicyLag is moot: strict drops any sample with lag > 0)
            return "dependencies: strict: actors wait for every new version, so staleness.publishEvery must be 1"
        if t.buffers != t.learners or t.actors % t.buffers:
            return (
                f"dependencies: strict needs buffers == learners and actors a multiple of buffers "
                f"(got actors {t.actors}, buffers {t.buffers}, learners {t.learners})"
            )
        if t.groups > 1 and t.group_sync.mode != "allreduce":
            return "dependencies: strict with several groups needs topology.groupSync.mode: allreduce"
        frags = self.algorithm.batch_size // (self.env.num_envs * self.env.fragment_length)
        if frags % (t.actors // t.buffers):
            return (
                f"dependencies: strict: a batch of {frags} fragment(s) cannot be split evenly over "
                f"the {t.actors // t.buffers} actor(s) of a buffer; make algorithm.batchSize a "
                "multiple of actors per buffer x env.numEnvs x env.fragmentLength"
            )
        return None

    @property
    def dependency_mode(self) -> Literal["relaxed", "strict"]:
        """What `dependencies` runs as: auto resolved (control/spec/lagbound.py's auto_dependencies)."""
        return self.dependencies if self.dependencies != "auto" else auto_dependencies(self)[0]

    @model_validator(mode="after")
    def _inference_fits(self) -> JobSpec:
        if self.actor.inference == "onnx" and self.model.actor_precision not in ("auto", "float32"):
            raise ValueError(
                f"actor.inference: onnx runs the policy in float32; model.actorPrecision "
                f"{self.model.actor_precision} needs actor.inference torch (or auto)"
            )
        return self

    @model_validator(mode="after")
    def _model_import_gate(self) -> JobSpec:
        """A model class is an import on every worker: only from a module the job lists."""
        ep = self.model.entry_point
        if ep is not None:
            module = ep.split(":", 1)[0]
            if not import_allowed(module, (*self.env.imports, *self.model.imports)):
                raise ValueError(
                    f"model.entryPoint: module {module!r} is not in a package listed in env.imports or model.imports"
                )
        return self

    @model_validator(mode="after")
    def _host_ports(self) -> JobSpec:
        """Host networking gives every (group, index) slot its own ports (addressing.py): the
        data and metrics ranges must fit below 65536 and never overlap."""
        net, t = self.network, self.topology
        if not net.host_network or t.auto:
            return self
        data, metrics = host_port_ranges(net.base_port, net.metrics_port, t.groups, t.buffers)
        for what, r in (("data", data), ("metrics", metrics)):
            if r.stop - 1 > 65535:
                raise ValueError(
                    f"network: with hostNetwork, {t.groups} group(s) x {t.buffers} buffer(s) take "
                    f"{what} ports {r.start}-{r.stop - 1}, beyond 65535: lower "
                    f"network.{'basePort' if what == 'data' else 'metricsPort'}"
                )
        if data.start < metrics.stop and metrics.start < data.stop:
            raise ValueError(
                f"network: with hostNetwork, data ports {data.start}-{data.stop - 1} and metrics "
                f"ports {metrics.start}-{metrics.stop - 1} overlap: move network.metricsPort"
            )
        return self

    # Derived defaults that depend on the algorithm.
    @property
    def max_policy_lag(self) -> Optional[int]:
        if self.dependency_mode == "strict":
            return 0
        if self.staleness.max_policy_lag is not None:
            return self.staleness.max_policy_lag
        return fitted_max_lag(self.algorithm) if self.algorithm.name == "ppo" else None  # (control/spec/lagbound.py)

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
    name: str = Field(
        ..., min_length=1, max_length=40, description="a DNS-1035 label: names the processes, pods and the run dir"
    )
    namespace: Optional[str] = Field(None, max_length=63, description="Kubernetes namespace")
    labels: Optional[dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]]] = Field(
        None, description="Kubernetes labels"
    )
    annotations: Optional[dict[Annotated[str, Field(max_length=317)], str]] = Field(
        None, description="Kubernetes annotations (256 KiB in all)"
    )

    @model_validator(mode="after")
    def _annotations_size(self) -> Metadata:
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
    api_version: Literal["tianji.dev/v1alpha1"] = Field(
        API_VERSION, alias="apiVersion", description="the API group and version"
    )
    kind: Literal["TianJiJob"] = Field(KIND, description="required in a manifest file")
    metadata: Metadata = Field(..., description="the job's name (and, on Kubernetes, namespace, labels, annotations)")
    spec: JobSpec = Field(default_factory=JobSpec, description="what to train and how")

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
