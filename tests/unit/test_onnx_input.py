"""The ONNX policy's input stage (runtime/onnxinput.py): TianJi's Nature CNN models export from the
first convolution on, and numpy reproduces their preprocessing (the normaliser's bit for bit)."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.algos.models import build_model
from tianji.control.spec import load_job
from tianji.envs import EnvInfo
from tianji.runtime.onnxinput import lift

torch.set_num_threads(1)
PONG = EnvInfo((4, 84, 84), "uint8", 6)


def _model(job: str, sets=(), info: EnvInfo = PONG):
    spec = load_job(EXAMPLES / job, list(sets)).spec
    return build_model(spec.algorithm, spec.model, info, 0).eval()


def _frames(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).integers(0, 256, (n, *PONG.obs_shape), dtype=np.uint8)
    x[:, :, 60:] = 87  # pixels that never change: the normaliser's std is its eps floor there
    return x


@pytest.mark.parametrize("job,sets,kind,folded", [
    ("pong-dqn.yaml", (), "pixels", ("net.0.net.0.weight",)),
    ("pong-ppo.yaml", (), "standardize", ()),
    ("pong-ppo.yaml", ("spec.algorithm.normalizeObservations=false",), "pixels", ("encoder.net.0.weight",)),
])
def test_tianjis_nature_cnn_models_are_lifted(job, sets, kind, folded):
    model = _model(job, sets)
    twin, stage = lift(model, _frames(2))
    assert stage is not None and stage.kind == kind and stage.folded == folded
    assert twin is not model and all(k in model.state_dict() for k in stage.folded)
    if kind == "standardize":
        assert twin.obs_rms is None and model.obs_rms is not None  # the model itself keeps its normaliser
    else:
        cnn = twin.net[0] if hasattr(twin, "net") else twin.encoder
        assert not cnn.scale


def test_other_models_and_observations_are_exported_whole():
    cartpole = _model("cartpole-ppo.yaml", info=EnvInfo((4,), "float32", 2))
    assert lift(cartpole, np.zeros((2, 4), np.float32))[1] is None
    pong = _model("pong-dqn.yaml")
    assert lift(pong, _frames(2).astype(np.float32))[1] is None  # float frames: the graph takes them as they are


def test_the_normalisers_stage_is_torchs_normalize_bit_for_bit():
    model = _model("pong-ppo.yaml")
    model.obs_rms.update(torch.from_numpy(_frames(64)).float())
    _, stage = lift(model, _frames(2))
    weights: dict = {}
    stage.snapshot(model.state_dict(), weights, {})
    x = _frames(8, seed=3)
    x[0, 0, 70, :5] = 255  # where the pixel never changed: far outside, clipped
    scratch: dict = {}
    got = stage.apply(x, (weights["tianji.input.mean"], weights["tianji.input.std"]), scratch)
    with torch.inference_mode():
        want = model.obs_rms.normalize(torch.from_numpy(x)).numpy()
    assert np.array_equal(got, want)
    assert np.abs(got).max() == pytest.approx(model.obs_rms.clip)
    again = stage.apply(x[:8], (weights["tianji.input.mean"], weights["tianji.input.std"]), scratch)
    assert again is got and len(scratch) == 1  # one buffer per batch shape, reused
    other = stage.apply(x[:3], (weights["tianji.input.mean"], weights["tianji.input.std"]), scratch)
    assert other.shape == (3, *PONG.obs_shape) and len(scratch) == 2


@pytest.mark.parametrize("job,kind", [("pong-dqn.yaml", "q"), ("pong-ppo.yaml", "logits")])
def test_the_session_starts_at_the_first_convolution(job, kind, tmp_path):
    """What ONNX Runtime runs (its optimised graph): no element-wise pass over the frames before the CNN."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from tianji.runtime.onnxpolicy import export

    exported = export(_model(job), kind, _frames(8))
    assert onnx.load_from_string(exported.graph).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # portable: no NCHWc layout
    so.optimized_model_filepath = str(tmp_path / "run.onnx")
    ort.InferenceSession(exported.graph, so, providers=["CPUExecutionProvider"])
    first = onnx.load(so.optimized_model_filepath).graph.node[0]
    assert first.op_type in ("Conv", "FusedConv") and first.input[0] == "obs"


def test_the_scale_rides_in_the_first_convolutions_weights():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tianji.runtime.onnxpolicy import export, snapshot

    model = _model("pong-dqn.yaml")
    exported = export(model, "q", _frames(8))
    weights = snapshot(model, exported)
    name = next(n for n, k in exported.keys.items() if k == "net.0.net.0.weight")
    np.testing.assert_allclose(weights[name] * 255.0, model.state_dict()["net.0.net.0.weight"].numpy(), rtol=1e-6)
