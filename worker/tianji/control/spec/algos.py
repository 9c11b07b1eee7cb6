"""The algorithms of a TianJiJob: PPO and DQN settings."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from tianji.control.spec.base import _Model

Precision = Literal["auto", "fp32", "bf16"]
PRECISION_DESCRIPTION = (
    "the learner's forward pass and loss: bf16 runs them under bfloat16 autocast (the optimizer's state and "
    "the master weights stay float32); auto is bf16 on a CUDA device that supports it, else fp32"
)


# ----------------------------------------------------------------- algorithms
class PPOConfig(_Model):
    """Proximal Policy Optimisation against the behaviour policy's log-probs."""

    name: Literal["ppo"] = Field("ppo", description="the algorithm: ppo (PPO with GAE or V-trace)")
    lr: float = Field(1e-3, gt=0, le=1, description="Adam learning rate")
    lr_anneal_frames: Optional[int] = Field(
        None,
        gt=0,
        description="linear lr decay to 0 over this many frames trained on (batchSize x learners per "
        "update; frames dropped as stale or overflow do not count)",
    )
    gamma: float = Field(0.98, gt=0, le=1, description="discount factor")
    gae_lambda: float = Field(0.8, ge=0, le=1, description="GAE lambda (V-trace's lambda too)")
    clip_coef: float = Field(0.2, gt=0, le=1, description="PPO's clip range of the probability ratio")
    epochs: int = Field(10, ge=1, le=100, description="passes over each batch")
    minibatch_size: int = Field(256, ge=1, description="samples per gradient step (at most batchSize)")
    batch_size: int = Field(256, ge=1, description="samples per learner batch (whole fragments)")
    ent_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus in the loss")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    max_grad_norm: float = Field(0.5, gt=0, description="gradients are clipped to this global norm")
    norm_adv: bool = Field(True, description="normalise advantages per minibatch")
    off_policy_correction: Literal["none", "vtrace"] = Field(
        "none",
        description="none: GAE on the learner's critic; vtrace: value targets and advantages corrected by "
        "truncated importance weights between the learner's policy at update start and the behaviour policy "
        "(IMPALA's V-trace, with gaeLambda as its lambda)",
    )
    vtrace_rho_bar: float = Field(
        1.0, gt=0, le=100, description="V-trace truncation of the weights in the TD error and the advantage (rho-bar)"
    )
    vtrace_c_bar: float = Field(
        1.0, gt=0, le=100, description="V-trace truncation of the trace weights (c-bar); at most vtraceRhoBar"
    )

    @model_validator(mode="after")
    def _vtrace_bars(self) -> PPOConfig:
        if self.vtrace_c_bar > self.vtrace_rho_bar:  # IMPALA assumes c-bar <= rho-bar (its Theorem 1)
            raise ValueError("vtraceCBar must be <= vtraceRhoBar")
        return self

    normalize_observations: Optional[bool] = Field(
        None,
        description="normalise observations by running statistics the learner owns and publishes "
        "with the parameters, per element (per pixel for images) (default: on for continuous actions "
        "with vector observations, off for images)",
    )
    normalize_rewards: Optional[bool] = Field(
        None,
        description="scale rewards by the running std of discounted returns, at the learner "
        "(default: on for continuous actions)",
    )
    init_log_std: float = Field(
        0.0, ge=-5, le=2, description="continuous actions: initial log-std of the Gaussian policy (state-independent)"
    )
    precision: Precision = Field("auto", description=PRECISION_DESCRIPTION)


class DQNConfig(_Model):
    """Double DQN with a target network and optional n-step returns."""

    name: Literal["dqn"] = Field("dqn", description="the algorithm: dqn (replay, target network)")
    lr: float = Field(2.3e-3, gt=0, le=1, description="Adam learning rate")
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    batch_size: int = Field(64, ge=1, description="samples per gradient step")
    steps_per_batch: int = Field(8, ge=1, le=1024, description="gradient steps per message from the buffer")
    replay_capacity: int = Field(100_000, ge=1, description="transitions each buffer's replay holds")
    learning_starts: int = Field(1000, ge=0, description="transitions in replay before sampling")
    target_update_interval: int = Field(256, ge=1, description="gradient steps between target syncs")
    tau: float = Field(
        1.0, gt=0, le=1, description="target sync: target = tau x online + (1 - tau) x target (1: a copy)"
    )
    double_dqn: bool = Field(
        True, description="double DQN: the online network picks the next action, the target network values it"
    )
    n_step: int = Field(1, ge=1, le=20, description="n-step returns")
    epsilon_start: float = Field(1.0, ge=0, le=1, description="exploration rate at the start")
    epsilon_end: float = Field(0.04, ge=0, le=1, description="exploration rate after explorationFrames")
    exploration_frames: int = Field(8000, ge=1, description="global frames over which epsilon decays")
    max_grad_norm: float = Field(10.0, gt=0, description="gradients are clipped to this global norm")
    precision: Precision = Field("auto", description=PRECISION_DESCRIPTION)

    @model_validator(mode="after")
    def _eps_order(self) -> DQNConfig:
        if self.epsilon_end > self.epsilon_start:
            raise ValueError("epsilonEnd must be <= epsilonStart")
        return self


Algorithm = Annotated[Union[PPOConfig, DQNConfig], Field(discriminator="name")]
