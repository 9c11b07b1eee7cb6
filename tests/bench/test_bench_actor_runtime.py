"""bench/actor_runtime.py --lower-precision: the int8 graphs quantize what they say, and every variant
is timed and compared with float32 torch on the same frames."""
import io

import pytest
import torch

from bench import actor_runtime as ar
from helpers import EXAMPLES
from tianji.control.spec import load_job

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")
torch.set_num_threads(1)


def _graph(model) -> bytes:
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(2, 4, 84, 84, dtype=torch.uint8),), buf, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
    return buf.getvalue()


def test_int8_graphs_quantize_the_ops_named_and_the_variants_are_measured():
    model = ar.policy(load_job(EXAMPLES / "pong-ppo.yaml"))
    graph = _graph(model)
    ops = lambda g: {n.op_type for n in onnx.load_from_string(g).graph.node}  # noqa: E731
    linear, every = ops(ar.quantized(graph, ["MatMul", "Gemm"])), ops(ar.quantized(graph, ["Conv", "MatMul", "Gemm"]))
    assert "MatMulInteger" in linear and "ConvInteger" not in linear and "Conv" in linear
    assert {"MatMulInteger", "ConvInteger"} <= every and "Conv" not in every
    point, = ar.lower_precision(model, graph, [2], reps=1)
    assert set(point) == {"batch", "onnxruntime_fp32", "int8_all", "int8_linear", "bf16_torch"}
    assert point["onnxruntime_fp32"]["max_abs_logit_diff"] < 1e-5  # float32: torch's function
    for k in ("int8_all", "int8_linear", "bf16_torch"):
        v = point[k]
        assert v["us"] > 0 and 0 < v["max_abs_logit_diff"] < 0.1 and v["mean_abs_dlogp"] < 0.05, (k, v)
