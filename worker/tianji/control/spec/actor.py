"""How an actor runs its policy (spec.actor): which inference runtime computes the forward pass."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tianji.control.spec.base import _Model


class ActorConfig(_Model):
    inference: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="the runtime of the actors' policy forward pass. torch: the model itself. onnx: ONNX Runtime "
        "on the CPU, one thread, the model exported once at start-up and a session built for each new "
        "version's weights (a fragment acts with one version throughout; PPO actors wait for the build "
        "at the next fragment, DQN actors build off the env loop); needs the `tianji[onnx]` extra in the "
        "worker. auto (default): torch where its forward at the actor's batch size takes under 100 µs of "
        "CPU (a small MLP: ONNX Runtime's import would cost more than it can save); else onnx where it is "
        "installed, the export reproduces the model's outputs and a start-up micro-benchmark at the "
        "actor's batch size finds it faster by more than the session build each version costs over a "
        "fragment's forwards, torch otherwise (and wherever the actor's precision, model.actorPrecision "
        "or what its auto picks, is bfloat16 or int8)",
    )
