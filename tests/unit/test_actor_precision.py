"""Actor inference precision (spec.model.actorPrecision): float32 is the learner's policy exactly;
the opt-in bfloat16 copy stores the log-probs of the policy it sampled from and follows new parameters."""
import numpy as np
import pytest
import torch

from helpers import EXAMPLES
from tianji.algos import distributions, onednn
from tianji.algos.models import Bf16Policy, _Bf16NatureCNN, load_arrays, state_arrays
from tianji.algos.onednn import FusedNatureCNN
from tianji.control.spec import SpecError, load_job
from tianji.runtime.rollout import Rollout

pytest.importorskip("ale_py.vector_env")
torch.set_num_threads(1)

SMALL = ["spec.env.numEnvs=4", "spec.env.fragmentLength=8", "spec.actor.inference=torch"]  # precision in torch


def _rollout(precision: str) -> Rollout:
    job = load_job(EXAMPLES / "pong-ppo.yaml", [*SMALL, f"spec.model.actorPrecision={precision}"])
    return Rollout(job.spec, seed=5)


def _learner_logp(model, arrays) -> np.ndarray:
    """What the PPO learner computes for the stored actions (algos/ppo.py: model(obs) + logp_entropy)."""
    obs = torch.from_numpy(arrays["obs"].reshape(-1, *arrays["obs"].shape[2:]))
    act = torch.from_numpy(arrays["actions"].reshape(-1))
    with torch.no_grad():
        pi, _ = model(obs)
        logp, _ = distributions.logp_entropy(model, pi, act, False)
    return logp.numpy().reshape(arrays["logp"].shape)


def _sharpen(model, scale: float) -> None:
    """Trained-policy-sized logits (the init's pi head has gain 0.01)."""
    with torch.no_grad():
        for p in model.pi.parameters():
            p.mul_(scale)


def test_float32_actor_stores_the_learners_log_probs():
    r = _rollout("float32")
    try:
        assert r.policy is r.model
        _sharpen(r.model, 300.0)
        arrays, _ = r.fragment()
        np.testing.assert_allclose(arrays["logp"], _learner_logp(r.model, arrays), rtol=1e-5, atol=1e-5)
    finally:
        r.close()


def test_bfloat16_actor_stores_its_own_log_probs_and_follows_new_parameters():
    r = _rollout("bfloat16")
    try:
        assert isinstance(r.policy, Bf16Policy)
        assert all(p.dtype == torch.bfloat16 for p in r.policy.inner.parameters())
        assert all(p.dtype == torch.float32 for p in r.model.parameters())  # the master copy stays float32
        # New parameters (as from the learner): the bf16 copy must follow after params_loaded().
        arrays_in = state_arrays(r.model)
        for k in arrays_in:
            if k.startswith("pi."):
                arrays_in[k] = arrays_in[k] * 300.0
        load_arrays(r.model, arrays_in)
        r.params_loaded()
        arrays, _ = r.fragment()
        own = _learner_logp(r.policy, arrays)  # the bf16 policy's log-probs of what it sampled
        np.testing.assert_allclose(arrays["logp"], own, rtol=1e-5, atol=1e-5)
        ref = _learner_logp(r.model, arrays)  # the learner's float32 view of the same actions
        diff = np.abs(ref - arrays["logp"])
        assert diff.max() > 0  # really a different (bf16) computation ...
        assert diff.mean() < 0.05  # ... that stays close to the float32 policy
    finally:
        r.close()


def test_bfloat16_copy_is_refreshed_only_by_sync():
    r = _rollout("bfloat16")
    try:
        obs = torch.from_numpy(r.obs)
        before = r.policy.logits(obs).clone()
        _sharpen(r.model, 300.0)
        assert torch.equal(r.policy.logits(obs), before)  # not yet synced
        r.params_loaded()
        after = r.policy.logits(obs)
        assert after.dtype == torch.float32
        torch.testing.assert_close(after, r.model.logits(obs).detach(), rtol=0.05, atol=0.05)
        assert not torch.equal(after, before)
    finally:
        r.close()


def test_actor_precision_is_validated():
    with pytest.raises(SpecError, match="actorPrecision"):
        load_job(EXAMPLES / "pong-ppo.yaml", ["spec.model.actorPrecision=float16"])


def test_bfloat16_nature_cnn_takes_pixels_with_the_scale_folded_in_once():
    """A DQN's Nature CNN scales pixels by 1/255 inside: the bf16 copy folds that into its first
    convolution's weights from the float32 master at every sync (never compounding) and acts on
    the uint8 frames directly, within bf16 rounding of the float32 network."""
    job = load_job(EXAMPLES / "pong-dqn.yaml", SMALL)
    r = Rollout(job.spec, seed=5)
    try:
        policy, model = Bf16Policy(r.model), r.model
        first = "net.0.net.0.weight"
        assert policy._folded == [first]
        obs = torch.from_numpy(r.obs)
        with torch.inference_mode():
            ref, once = model(obs), policy(obs)
            policy.sync()
            policy.sync()
            twice = policy(obs)
        assert torch.equal(once, twice)
        expect = (model.state_dict()[first] / 255.0).to(torch.bfloat16)
        assert torch.equal(policy.inner.state_dict()[first], expect)
        assert once.dtype == torch.float32
        torch.testing.assert_close(once, ref, rtol=0.05, atol=0.02 * float(ref.abs().max()))
    finally:
        r.close()


def _cnns(policy):
    return [m for m in policy.modules() if isinstance(m, _Bf16NatureCNN)]


def test_bfloat16_nature_cnn_acts_through_onednn_kernels_as_the_module_does():
    """The fused kernels (algos/onednn.py) compute what the bf16 module computes, at the actor's
    batch and at another, are rebuilt after every sync (the packed weights are a snapshot), and
    where they cannot run the module path acts."""
    job = load_job(EXAMPLES / "pong-dqn.yaml", SMALL)
    r = Rollout(job.spec, seed=5)
    try:
        fused, plain = Bf16Policy(r.model), Bf16Policy(r.model)
        for m in _cnns(plain):
            m.fused = False
        obs = torch.from_numpy(r.obs)
        with torch.inference_mode():
            out = fused(obs)
            (cnn,) = _cnns(fused)
            if onednn._ops() is not None:  # a CPU with oneDNN's bf16 kernels (every machine measured)
                assert isinstance(cnn._kernels, FusedNatureCNN), "oneDNN's bf16 kernels should run on this CPU"
            torch.testing.assert_close(out, plain(obs), rtol=1e-3, atol=1e-3 * float(out.abs().max()))
            torch.testing.assert_close(fused(obs[:3]), plain(obs[:3]), rtol=1e-3, atol=1e-3 * float(out.abs().max()))
            _sharpen_all(r.model, 3.0)
            fused.sync(), plain.sync()
            assert cnn._kernels is None  # rebuilt at the next forward, from the new weights
            after = fused(obs)
            assert not torch.allclose(after, out)
            torch.testing.assert_close(after, plain(obs), rtol=1e-3, atol=1e-3 * float(after.abs().max()))
    finally:
        r.close()


def _sharpen_all(model, scale: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)


def test_bfloat16_nature_cnn_falls_back_to_the_module_where_the_kernels_are_missing(monkeypatch):
    monkeypatch.setattr(onednn, "_ops", lambda: None)
    job = load_job(EXAMPLES / "pong-dqn.yaml", SMALL)
    r = Rollout(job.spec, seed=5)
    try:
        policy = Bf16Policy(r.model)
        with torch.inference_mode():
            out = policy(torch.from_numpy(r.obs))
        (cnn,) = _cnns(policy)
        assert cnn.fused is False and cnn._kernels is None
        assert out.shape == (4, r.info.n_actions) and torch.isfinite(out).all()
    finally:
        r.close()
