"""spec.model.actorPrecision: auto (the default) — int8 for a DQN actor's Nature CNN where the CPU's
int8 kernels run and agree, float32 for everything else (runtime/onnxpolicy.PolicyRuntime)."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.algos import int8, models
from tianji.algos.models import Int8Policy, build_model
from tianji.control.spec import load_job
from tianji.envs import EnvInfo
from tianji.runtime.onnxpolicy import PolicyRuntime

torch.set_num_threads(1)
PONG = EnvInfo((4, 84, 84), "uint8", 6)
KERNELS = int8.ops() is not None and int8.vnni()


def _runtime(job: str, sets=(), info: EnvInfo = PONG) -> PolicyRuntime:
    spec = load_job(EXAMPLES / job, ["spec.actor.inference=torch", *sets]).spec
    model = build_model(spec.algorithm, spec.model, info, 0).eval()
    rng = np.random.default_rng(0)
    example = (rng.integers(0, 256, (4, *info.obs_shape), dtype=np.uint8) if info.obs_dtype == "uint8"
               else rng.normal(size=(4, *info.obs_shape)).astype(np.float32))
    return PolicyRuntime(model, spec, example)


def test_auto_is_the_default():
    assert load_job(EXAMPLES / "pong-dqn.yaml").spec.model.actor_precision == "auto"


@pytest.mark.skipif(not KERNELS, reason="no oneDNN int8 kernels with VNNI/AMX on this CPU")
def test_auto_acts_in_int8_for_a_dqn_nature_cnn_where_the_kernels_agree():
    rt = _runtime("pong-dqn.yaml")
    assert rt.precision == "int8" and isinstance(rt.policy, Int8Policy) and not rt.policy.refused
    assert "argmax" in rt.report["precision_reason"]
    assert all(m._kernels is not None for m in rt.policy._cnns)  # built at start-up, on the example


@pytest.mark.parametrize("job,sets,info,why", [
    ("pong-ppo.yaml", (), PONG, "log-probs"),
    ("cartpole-dqn.yaml", (), EnvInfo((4,), "float32", 2), "no Nature CNN"),
    ("pong-dqn.yaml", ("spec.model.actorPrecision=float32",), PONG, "requested"),
])
def test_auto_keeps_float32_where_int8_is_wrong_or_useless(job, sets, info, why):
    rt = _runtime(job, sets, info)
    assert rt.precision == "float32" and rt.policy is rt.model and why in rt.report["precision_reason"]


def test_auto_keeps_float32_on_a_cpu_without_int8_sums(monkeypatch):
    monkeypatch.setattr(models, "vnni", lambda: False)
    rt = _runtime("pong-dqn.yaml")
    assert rt.precision == "float32" and rt.policy is rt.model and "VNNI" in rt.report["precision_reason"]


def test_auto_with_onnx_inference_is_float32():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    rt = _runtime("pong-dqn.yaml", ("spec.actor.inference=onnx",))
    try:
        assert rt.precision == "float32" and rt.name == "onnx"
    finally:
        rt.close()


@pytest.mark.skipif(not KERNELS, reason="no oneDNN int8 kernels with VNNI/AMX on this CPU")
def test_auto_falls_back_to_float32_where_the_first_build_refuses(monkeypatch):
    monkeypatch.setattr(int8, "MAX_ERROR", -1.0)  # every build disagrees
    rt = _runtime("pong-dqn.yaml")
    assert rt.precision == "float32" and rt.policy is rt.model and "refused" in rt.report["precision_reason"]
