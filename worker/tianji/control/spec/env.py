"""What a TianJiJob trains on and with: the env (id, kwargs, wrappers, spaces) and the model."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, Field, WithJsonSchema, field_validator, model_validator

from tianji.control.spec.base import _FieldError, _Model, immutable

# ----------------------------------------------------------------- env, model
# User code is named, never shipped: a module path (`mypkg.envs`) or an entry point
# (`mypkg.envs:MyEnv`), imported by the worker from what its image installed.
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENTRY_POINT_PATTERN = MODULE_PATTERN[:-1] + ":" + MODULE_PATTERN[1:]  # module:attribute, each a dotted name
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
PlainData = Annotated[dict[str, Any], _FREE_FORM, AfterValidator(check_json_like)]


def entry_point_of(example: str) -> AfterValidator:
    """A `module.path:Name` field's check, its error showing `example`."""

    def check(v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(f"{v!r}: expected module.path:Class, e.g. {example}")
        return v

    return AfterValidator(check)


class ObservationSpace(_Model):
    """One observation: a fixed-shape array of uint8 or floats."""

    shape: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(
        ..., min_length=1, max_length=8, description="one observation's shape"
    )
    dtype: Literal["uint8", "float32", "float64"] = Field("float32", description="its element type")


class ActionSpace(_Model):
    """Discrete(n), or a 1-D Box: shape [d] with its bounds."""

    n: Optional[int] = Field(None, ge=1, le=1 << 20, description="Discrete(n) actions")
    shape: Optional[list[Annotated[int, Field(ge=1, le=1 << 12)]]] = Field(
        None, min_length=1, max_length=1, description="Box actions: [dimensions]"
    )
    low: Optional[list[float]] = Field(None, max_length=1 << 12, description="Box: lower bound per dimension")
    high: Optional[list[float]] = Field(None, max_length=1 << 12, description="Box: upper bound per dimension")

    @model_validator(mode="after")
    def _one_kind(self) -> ActionSpace:
        box = (self.shape, self.low, self.high)
        if (self.n is None) == all(x is None for x in box):
            raise ValueError("give either n (Discrete) or shape, low and high (Box)")
        if self.n is None:
            if self.shape is None or self.low is None or self.high is None:
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

    entry_point: Annotated[str, entry_point_of("gymnasium.wrappers:FlattenObservation")] = Field(
        ...,
        max_length=300,
        json_schema_extra={"pattern": ENTRY_POINT_PATTERN},
        description="module.path:Class of a gymnasium.Wrapper (or a function env -> env)",
    )
    kwargs: PlainData = Field(default_factory=dict, description="its keyword arguments besides the env (plain data)")


class EpisodeBoundsSpec(_Model):
    """What one episode of the env can be. An actor's report of an episode outside it is refused
    whole and counted (reason `return`): env code runs inside the actor, so its returns are claims."""

    max_steps: Optional[int] = Field(None, ge=1, le=1 << 40, description="the env's time limit, in steps")
    reward_per_step: Optional[list[float]] = Field(
        None, min_length=2, max_length=2, description="[low, high]: every step's reward lies within"
    )

    @field_validator("reward_per_step")
    @classmethod
    def _ordered(cls, v: Optional[list[float]]) -> Optional[list[float]]:
        if v is not None and not (math.isfinite(v[0]) and math.isfinite(v[1]) and v[0] <= v[1]):
            raise ValueError(f"{v}: expected [low, high], finite, low <= high")
        return v


class EnvConfig(_Model):
    id: str = Field(
        "CartPole-v1",
        min_length=1,
        max_length=300,
        description="Gymnasium id, e.g. CartPole-v1 or ALE/Pong-v5 (registered by env.imports), "
        "or an entry point module:Class",
        json_schema_extra={"x-kubernetes-validations": [immutable("env.id")]},
    )
    imports: list[ModulePath] = Field(
        default_factory=list,
        max_length=64,
        description="modules imported before the env is made (they register Gymnasium ids), in actors, "
        "the evaluator and the profiler only",
    )
    kwargs: PlainData = Field(
        default_factory=dict, description="keyword arguments of the env's constructor (plain data)"
    )
    wrappers: list[EnvWrapper] = Field(
        default_factory=list,
        max_length=16,
        description="Gymnasium wrappers applied to each env in order (the first wraps the env itself), e.g. "
        "{entryPoint: gymnasium.wrappers:FlattenObservation} for a Dict observation; imported where "
        "envs are built, like env.imports",
    )
    spaces: Optional[EnvSpaces] = Field(
        None,
        description="the env's observation and action spaces (tianji run fills them in); buffers and "
        "learners read them here instead of building an env",
    )
    episode_bounds: Optional[EpisodeBoundsSpec] = Field(
        None,
        description="what one episode can be (time limit, reward per step): actors' reports of other "
        "episodes are refused. Both engines know Gymnasium's classic-control envs; tianji run also "
        "reads what an env declares to Gymnasium; the operator has only this and the classic ones",
    )
    num_envs: int = Field(8, ge=1, le=4096, description="vectorised envs per actor")
    fragment_length: int = Field(32, ge=1, le=10_000, description="steps per env in one fragment")
    seed: int = Field(
        1,
        ge=0,
        le=2**31 - 1 - 10**7,
        description="base seed; actors, buffers and learners derive theirs from it (below 2**31)",
    )
    frame_stack: int = Field(4, ge=1, le=16, description="Atari only")
    episodic_life: bool = Field(False, description="Atari only")
    clip_rewards: bool = Field(True, description="Atari only: learn from sign(reward)")

    @field_validator("id")
    @classmethod
    def _id_or_entry_point(cls, v: str) -> str:
        if ":" in v and not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(f"{v!r}: an entry point is module.path:Name, e.g. mypkg.envs:MyEnv")
        return v


class ModelConfig(_Model):
    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [64, 64], description="hidden layer sizes of the MLP"
    )
    activation: Literal["tanh", "relu"] = Field("tanh", description="the MLP's activation")
    encoder: Literal["auto", "mlp", "nature_cnn"] = Field(
        "auto", description="auto: the Nature CNN for image observations (3-D uint8), else the MLP"
    )
    actor_precision: Literal["auto", "float32", "bfloat16", "int8"] = Field(
        "auto",
        description="actors' inference precision. auto: int8 for a DQN actor's Nature CNN where the "
        "CPU's int8 kernels run (VNNI or AMX) and its first build agrees with float32 (it acts by "
        "the argmax of its Q-values and learns off-policy from replay: int8 changes which action it "
        "picks on few frames, and no probability is stored), float32 otherwise (PPO stores "
        "behaviour log-probs, which must be the learner's policy's; an MLP gains nothing). "
        "float32: the learner's policy exactly. bfloat16 (opt-in) runs the policy from a bf16 copy "
        "of the parameters (faster where the CPU's bf16 dot products beat float32's: AMX, or "
        "an AMD EPYC's AVX-512 BF16; a Nature CNN's copy runs through oneDNN's fused "
        "conv+ReLU and packed-weight kernels where they run). int8 runs a Nature CNN "
        "through oneDNN's int8 kernels (weights per channel, activation scales that follow "
        "each call, a per-pixel observation normaliser folded into the input quantization; "
        "float32 on a CPU without VNNI or where a build disagrees with float32) and "
        "every other layer in float32; an off-policy (DQN) actor adopts a new version when its int8 build "
        "costs at most a tenth of the CNN's acting time since the last, so it may act a few "
        "versions behind. With either, the stored behaviour log-probs are those of the policy "
        "acted with, so the learner sees slightly off-policy data. Evaluation always plays the "
        "float32 model",
    )
    entry_point: Annotated[Optional[str], entry_point_of("mypkg.models:Net")] = Field(
        None,
        max_length=300,
        json_schema_extra={"pattern": ENTRY_POINT_PATTERN},
        description="a user's torch module, module.path:Class, built as Class(observation_space, action_space, "
        "config) (docs/custom-envs.md); its module must be listed in env.imports or model.imports",
    )
    imports: list[ModulePath] = Field(
        default_factory=list, max_length=64, description="modules that may provide model.entryPoint"
    )
    config: PlainData = Field(default_factory=dict, description="plain-data configuration passed to model.entryPoint")
