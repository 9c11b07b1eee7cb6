"""spec.model.actorPrecision: int8 — the Nature CNN through oneDNN's int8 kernels (algos/int8.py):
close to float32 on real frames, the log-probs stored are those of the policy acted with, float32
where the kernels cannot run or disagree, and an off-policy actor adopts versions as builds pay."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.algos import distributions, int8
from tianji.algos.models import Int8Policy, _Int8NatureCNN, load_arrays, state_arrays
from tianji.control.spec import SpecError, load_job
from tianji.runtime.rollout import Rollout

pytest.importorskip("ale_py.vector_env")
torch.set_num_threads(1)

SMALL = ["spec.env.numEnvs=4", "spec.env.fragmentLength=8", "spec.actor.inference=torch",
         "spec.model.actorPrecision=int8"]


def _rollout(example: str, wait_swaps: bool = False) -> Rollout:
    return Rollout(load_job(EXAMPLES / example, SMALL).spec, seed=5, wait_swaps=wait_swaps)


def _frames(r: Rollout, steps: int) -> list[torch.Tensor]:
    """Real observations: the env under random actions (copies: the env reuses its buffer)."""
    rng = np.random.default_rng(0)
    return [torch.from_numpy(np.array(r.env.step(rng.integers(0, r.info.n_actions, r.n))[0], copy=True))
            for _ in range(steps)]


def _scaled(model, scale: float, prefix: str = "") -> None:
    arrays = state_arrays(model)
    for k in arrays:
        if k.startswith(prefix) and arrays[k].dtype == np.float32:
            arrays[k] = arrays[k] * scale
    load_arrays(model, arrays)


def test_int8_q_values_stay_within_a_few_percent_of_float32_on_real_frames():
    r = _rollout("pong-dqn.yaml")
    try:
        policy = r.policy
        assert isinstance(policy, Int8Policy)
        frames = _frames(r, 12)
        with torch.inference_mode():
            policy(frames[0])  # builds on this batch
            (cnn,) = policy._cnns
            if int8.ops() is not None and int8.vnni():
                assert cnn.int8 and cnn._kernels is not None, "the int8 kernels should run on this CPU"
            for x in frames[1:]:  # batches it was not built on
                ref, got = r.model(x), policy(x)
                assert got.dtype == torch.float32
                assert float((got - ref).abs().max()) <= 0.05 * float(ref.abs().max())
                assert not torch.equal(got, ref) or not cnn.int8  # really the int8 computation
    finally:
        r.close()


def test_a_call_whose_range_jumps_is_scaled_again_not_clipped():
    """Built on dim frames, then shown bright ones: the convolutions' uint8 outputs would clip at the
    dim frames' scales, so those calls run again at their own range and stay close to float32."""
    r = _rollout("pong-dqn.yaml")
    try:
        bright = _frames(r, 1)[0]
        dim = bright // 8
        with torch.inference_mode():
            r.policy(dim)
            r.policy(dim)
            (cnn,) = r.policy._cnns
            if not cnn.int8:
                pytest.skip("no int8 kernels here")
            before = cnn._kernels.rescaled
            ref, got = r.model(bright), r.policy(bright)
        assert cnn._kernels.rescaled > before
        assert float((got - ref).abs().max()) <= 0.05 * float(ref.abs().max())
    finally:
        r.close()


def _learner_logp(model, arrays) -> np.ndarray:
    obs = torch.from_numpy(arrays["obs"].reshape(-1, *arrays["obs"].shape[2:]))
    act = torch.from_numpy(arrays["actions"].reshape(-1))
    with torch.no_grad():
        logp, _ = distributions.logp_entropy(model, model.logits(obs), act, False)
    return logp.numpy().reshape(arrays["logp"].shape)


def test_on_policy_int8_actor_stores_its_own_log_probs_of_every_new_version(monkeypatch):
    """PPO behind an observation normaliser (the normalised input is quantized): each loaded version
    acts from the next fragment on, and the stored log-probs are the int8 policy's own."""
    r = _rollout("pong-ppo.yaml", wait_swaps=True)
    try:
        r.fragment()
        monkeypatch.setattr(Int8Policy, "BUILD_SHARE", 0.0)  # never "due": on-policy syncs every version anyway
        _scaled(r.model, 300.0, "pi.")  # trained-policy-sized logits (the init's pi head has gain 0.01)
        r.params_loaded(1)
        arrays, _ = r.fragment()
        assert r.acting_version == 1
        np.testing.assert_allclose(arrays["logp"], _learner_logp(r.policy, arrays), rtol=1e-5, atol=1e-5)
        diff = np.abs(_learner_logp(r.model, arrays) - arrays["logp"])
        (cnn,) = r.policy._cnns
        assert diff.max() > 0 or not cnn.int8  # a different computation from the learner's (with VNNI) ...
        assert diff.mean() < 0.05  # ... close to its float32 policy
    finally:
        r.close()


def test_off_policy_int8_actor_adopts_a_version_once_its_build_pays(monkeypatch):
    """A DQN actor keeps acting with its built version until the CNN's acting time since covers the
    next build (BUILD_SHARE); the version it reports is the one it acts with throughout."""
    r = _rollout("pong-dqn.yaml")
    try:
        r.fragment()
        obs = torch.from_numpy(np.array(r.obs, copy=True))
        with torch.inference_mode():
            v0 = r.model(obs).clone()
        monkeypatch.setattr(Int8Policy, "BUILD_SHARE", 0.0)  # a build never pays
        _scaled(r.model, 3.0)
        r.params_loaded(1)
        r.fragment()
        (cnn,) = r.policy._cnns
        if not cnn.int8:  # float32 acting: nothing to build, so the version is adopted at once
            assert r.acting_version == 1
            pytest.skip("no int8 kernels here")
        assert r.acting_version == 0
        with torch.inference_mode():
            v1 = r.model(obs)
            close = lambda out, ref: float((out - ref).abs().max()) <= 0.05 * float(ref.abs().max())  # noqa: E731
            assert close(r.policy(obs), v0) and not close(r.policy(obs), v1)  # version 0's weights, heads included
        monkeypatch.setattr(Int8Policy, "BUILD_SHARE", 1e12)  # any acting time pays
        r.fragment()
        assert r.acting_version == 1
        with torch.inference_mode():
            assert close(r.policy(obs), v1)
    finally:
        r.close()


@pytest.mark.parametrize("example", ["pong-dqn.yaml", "pong-ppo.yaml"])  # PPO's: behind the normaliser
@pytest.mark.parametrize("refusal", ["no kernels", "no VNNI", "disagrees"])
def test_int8_nature_cnn_acts_in_float32_where_the_kernels_cannot(monkeypatch, refusal, example):
    if refusal == "no kernels":
        monkeypatch.setattr(int8, "ops", lambda: None)
    elif refusal == "no VNNI":  # 16-bit sums that saturate
        monkeypatch.setattr(int8, "vnni", lambda: False)
    else:
        monkeypatch.setattr(int8, "MAX_ERROR", -1.0)  # any difference from float32 is too much
    r = _rollout(example)
    try:
        obs = torch.from_numpy(r.obs)
        with torch.inference_mode():
            out = r.policy(obs)
            ref = r.model(obs)
        (cnn,) = [m for m in r.policy.modules() if isinstance(m, _Int8NatureCNN)]
        assert cnn.int8 is False and cnn._kernels is None
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        assert r.policy.due()  # nothing to build: every version is adopted at once
    finally:
        r.close()


def test_int8_is_a_precision_of_torch_only():
    assert load_job(EXAMPLES / "pong-dqn.yaml", ["spec.model.actorPrecision=int8"]).spec.model.actor_precision == "int8"
    with pytest.raises(SpecError, match="actorPrecision int8"):
        load_job(EXAMPLES / "pong-dqn.yaml", ["spec.model.actorPrecision=int8", "spec.actor.inference=onnx"])


def _fitted_normaliser(r: Rollout, frames: list[torch.Tensor]) -> None:
    """PPO's per-pixel statistics from real frames (the init's are mean 0, var 1), as a learner
    publishes them: a fixed background has near-zero variance, the ball and paddles do not; the
    acting copy synced to them."""
    with torch.no_grad():
        r.model.obs_rms.update(torch.cat(frames))
    r.policy.sync()


def test_the_normaliser_fused_into_the_input_quantization_matches_float32_normalisation():
    """Standardized: (x - mean) / std per pixel, clipped to +-5, quantized in one pass, equals the
    float32 normaliser's output to within half a quantization step: over the full +-5 at the first
    call, over the narrower low side it saw after, and again on a frame below that side."""
    r = _rollout("pong-ppo.yaml")
    try:
        frames = _frames(r, 6)
        _fitted_normaliser(r, frames[:4])
        rms = r.model.obs_rms
        fused = int8.Standardized(rms)
        dark = (frames[5].float() * 0.3).to(torch.uint8)  # darker than any pixel's mean: reaches -5
        scales = []
        for x in (frames[4], frames[5], dark, frames[5]):
            q, scale, zero = fused(x)
            scales.append(scale)
            assert q.dtype == torch.uint8 and q.is_contiguous(memory_format=torch.channels_last)
            dequantized = (q.float() - zero) * scale
            np.testing.assert_allclose(dequantized.numpy(), rms.normalize(x).numpy(), rtol=0, atol=scale * 0.5 + 1e-5)
        assert scales[0] == pytest.approx(5 / 127)
        assert scales[1] < scales[0] * 0.9  # Pong's low side is narrower than -5
        assert scales[2] == pytest.approx(5 / 127) and scales[3] == scales[2]  # widened, for good
    finally:
        r.close()


def test_ppo_int8_copy_normalises_in_its_kernels_and_stays_close_to_float32():
    """Behind fitted pixel statistics the int8 CNN takes the raw frames (no float32 normalisation
    pass); its features and logits stay within a few percent of the float32 policy's (the value
    head's init outputs are near 0: its error is the features', relative to almost nothing)."""
    r = _rollout("pong-ppo.yaml")
    try:
        frames = _frames(r, 10)
        _scaled(r.model, 300.0, "pi.")  # trained-policy-sized logits
        _fitted_normaliser(r, frames[:4])
        (cnn,) = r.policy._cnns
        assert cnn.normalizes
        with torch.inference_mode():
            r.policy(frames[4])  # builds on this batch
            if int8.ops() is None or not int8.vnni():
                pytest.skip("no int8 kernels here")
            assert cnn._kernels._standardized is not None
            for x in frames[5:]:
                logits, ref_logits = r.policy.logits(x), r.model.logits(x)
                features, ref_features = cnn(x, r.policy.inner.obs_rms), r.model.encoder(r.model.obs_rms.normalize(x))
                assert float((features - ref_features).abs().max()) <= 0.06 * float(ref_features.max())
                assert float((logits - ref_logits).abs().max()) <= 0.06 * float(ref_logits.abs().max())
                assert not torch.equal(logits, ref_logits)
            assert cnn.int8  # no build refused: the normaliser's sparse +-5 pixels are within MAX_ERROR
    finally:
        r.close()
