"""spec.algorithm.normalizeObservations on images: per-pixel running statistics the learner owns
(Sample Factory's Atari default), folded from uint8 batches exactly, applied inside the model so
that the actor's ONNX session and a checkpoint's evaluation compute the same thing."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.algos.models import build_model, load_arrays, state_arrays
from tianji.algos.normalize import PIXEL_CLIP, PIXEL_EPS, RunningMeanStd
from tianji.control.spec import load_job
from tianji.envs import EnvInfo

torch.set_num_threads(1)
PONG = EnvInfo((4, 84, 84), "uint8", 6)


def _pong_model(normalize: bool | None):
    spec = load_job(EXAMPLES / "pong-ppo.yaml").spec
    algo = spec.algorithm.model_copy(update={"normalize_observations": normalize})
    return build_model(algo, spec.model, PONG, 0).eval()


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """Pong-like frames: a fixed background, a few pixels that change."""
    rng = np.random.default_rng(seed)
    x = np.full((n, *PONG.obs_shape), 87, np.uint8)
    x[:, :, 10:14, 20:60] = rng.integers(0, 256, (n, 4, 4, 40), dtype=np.uint8)
    return x


def test_uint8_batches_fold_in_exactly():
    batches = [_frames(n, seed=n) for n in (3, 64, 1)]
    rms = RunningMeanStd(PONG.obs_shape)
    for b in batches:
        rms.update(torch.from_numpy(b))
    allx = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-9)
    # atol: the prior (var 1 at count 1e-8) leaves ~1e-6 on a constant pixel, nothing beside PIXEL_EPS
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-6, atol=1e-5)
    assert rms.count.item() == pytest.approx(len(allx))


def test_images_are_normalised_only_when_asked_and_then_per_pixel():
    plain = _pong_model(None)
    assert plain.obs_rms is None and plain.encoder.scale  # the default: x / 255 in the encoder
    model = _pong_model(True)
    rms = model.obs_rms
    assert tuple(rms.mean.shape) == PONG.obs_shape and (rms.eps, rms.clip) == (PIXEL_EPS, PIXEL_CLIP)
    assert not model.encoder.scale  # the input arrives normalised: no second scaling
    rms.update(torch.from_numpy(_frames(256)))
    x = torch.from_numpy(_frames(5, seed=7))
    with torch.inference_mode():
        z = model.encoder.net(((x.double() - rms.mean) / torch.sqrt(rms.var + PIXEL_EPS)).clamp(-5, 5).float())
        want = model.pi(z)
        got = model.logits(x)
        normalised = rms.normalize(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(normalised[:, :, 50:, :].abs().max()) == 0.0  # a pixel that never changed carries nothing
    assert float(normalised.abs().max()) <= PIXEL_CLIP


def test_statistics_travel_with_the_parameters_and_the_onnx_session_applies_them():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from tianji.runtime.onnxpolicy import OrtPolicy

    learner, actor = _pong_model(True), _pong_model(True)
    learner.obs_rms.update(torch.from_numpy(_frames(128)))
    load_arrays(actor, state_arrays(learner))  # what a publish carries, buffers included
    torch.testing.assert_close(actor.obs_rms.var, learner.obs_rms.var)
    x = _frames(8, seed=3)
    policy = OrtPolicy.create(actor, "logits", x)
    try:
        with torch.inference_mode():
            want = learner.logits(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(policy.logits(torch.from_numpy(x)).numpy(), want, rtol=1e-5, atol=1e-5)
    finally:
        policy.close()


def test_an_actors_kept_float32_statistics_follow_every_write_and_copy():
    """Under inference mode normalize keeps its float32 mean/std between calls; an update, a
    parameter load and a deep copy of a stale model must each give the statistics as they are."""
    import copy

    rms = RunningMeanStd(PONG.obs_shape, PIXEL_EPS, PIXEL_CLIP)
    x = torch.from_numpy(_frames(4))

    def fresh(r):  # what normalize computes outside inference mode: nothing kept
        return r.normalize(x)

    with torch.inference_mode():
        first = rms.normalize(x)
    rms.update(x)
    with torch.inference_mode():
        after_update = rms.normalize(x)
    assert not torch.equal(first, after_update)
    assert torch.equal(after_update, fresh(rms))
    stale = RunningMeanStd(PONG.obs_shape, PIXEL_EPS, PIXEL_CLIP)
    with torch.inference_mode():
        stale.normalize(x)  # kept: the initial statistics
    twin = copy.deepcopy(stale)
    stale.load_state_dict(rms.state_dict())
    twin.load_state_dict(rms.state_dict())
    with torch.inference_mode():
        assert torch.equal(stale.normalize(x), after_update)
        assert torch.equal(twin.normalize(x), after_update)
    rms.update(torch.from_numpy(_frames(4, seed=1)))
    copied = copy.deepcopy(rms)  # a copy taken after a write the cache has not seen
    with torch.inference_mode():
        assert torch.equal(copied.normalize(x), fresh(rms))


def test_statistics_built_under_inference_mode_normalize_without_a_version_counter():
    """Inference tensors count no writes, so nothing can be kept for them: made afresh each call."""
    x = torch.from_numpy(_frames(4))
    with torch.inference_mode():
        rms = RunningMeanStd(PONG.obs_shape, PIXEL_EPS, PIXEL_CLIP)
        before = rms.normalize(x)
        rms.mean.add_(3.0)
        assert not torch.equal(rms.normalize(x), before)
