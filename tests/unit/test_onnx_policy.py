"""spec.actor.inference: the ONNX Runtime policy computes torch's outputs (within 1e-5), follows new
versions off the env loop (a fragment acts with one version, tagged with it), and `auto` falls back
to torch when ONNX Runtime cannot run the policy."""
import threading

import numpy as np
import pytest
import torch

from helpers import EXAMPLES, ROOT
from tianji.algos import distributions
from tianji.algos.models import build_model, load_arrays, state_arrays
from tianji.control.spec import SpecError, load_job
from tianji.envs import EnvInfo
from tianji.runtime import onnxpolicy
from tianji.runtime.onnxpolicy import OnnxUnavailable, OrtPolicy, PolicyRuntime
from tianji.runtime.rollout import Rollout

torch.set_num_threads(1)
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

ACROBOT = ROOT / "bench" / "jobs" / "acrobot-ppo-rlzoo.yaml"  # MLP with observation normalisation
TOL = 1e-5


def _model(job, info: EnvInfo):
    spec = load_job(job).spec
    return build_model(spec.algorithm, spec.model, info, 0).eval()


def _obs(info: EnvInfo, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if info.obs_dtype == "uint8":
        return rng.integers(0, 256, (batch, *info.obs_shape), dtype=np.uint8)
    return rng.normal(0, 2, (batch, *info.obs_shape)).astype(np.float32)


def _torch_out(model, kind: str, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        x = torch.from_numpy(obs)
        return (model.logits(x) if kind == "logits" else model(x)).numpy()


def _new_version(model, scale: float = 1.5) -> None:
    """Load different weights as the actor does (load_arrays), normalisation statistics included."""
    arrays = state_arrays(model)
    rng = np.random.default_rng(1)
    for k, a in arrays.items():
        if a.dtype.kind == "f":
            arrays[k] = (a * scale + rng.normal(0, 0.05, a.shape) + (0.5 if k.endswith("var") else 0)).astype(a.dtype)
    load_arrays(model, arrays)


CASES = [  # (job, env info, what an actor computes)
    (EXAMPLES / "pong-ppo.yaml", EnvInfo((4, 84, 84), "uint8", 6), "logits"),
    (EXAMPLES / "pong-dqn.yaml", EnvInfo((4, 84, 84), "uint8", 6), "q"),  # 1/255 folded (onnxinput.py)
    (ACROBOT, EnvInfo((6,), "float32", 3), "logits"),
    (EXAMPLES / "pendulum-ppo.yaml", EnvInfo((3,), "float32", 0, (1,), (-2.0,), (2.0,)), "logits"),
    (EXAMPLES / "cartpole-dqn.yaml", EnvInfo((4,), "float32", 2), "q"),
]


@pytest.mark.parametrize("job,info,kind", CASES,
                         ids=["pong-cnn", "pong-dqn-cnn", "acrobot-normalised", "pendulum-gauss", "dqn"])
def test_outputs_equal_torchs_at_any_batch_and_after_a_new_version(job, info, kind):
    model = _model(job, info)
    policy = OrtPolicy.create(model, kind, _obs(info, 8))
    try:
        for batch in (1, 3, 8):  # exported at 8, run at every batch an actor uses
            x = _obs(info, batch, seed=batch)
            np.testing.assert_allclose(policy.logits(torch.from_numpy(x)).numpy(), _torch_out(model, kind, x),
                                       rtol=TOL, atol=TOL)
        x = _obs(info, 8, seed=9)
        before = _torch_out(model, kind, x)
        _new_version(model)
        after = _torch_out(model, kind, x)
        assert np.abs(after - before).max() > 1e-3  # really different weights
        policy.sync(1)
        assert policy.live.version == 0  # until the swap the session is the old version's, whole
        np.testing.assert_allclose(policy(torch.from_numpy(x)).numpy(), before, rtol=TOL, atol=TOL)
        assert policy.refresh(wait=True) == 1
        np.testing.assert_allclose(policy(torch.from_numpy(x)).numpy(), after, rtol=TOL, atol=TOL)
        if info.continuous:
            torch.testing.assert_close(policy.log_std, model.log_std.detach())
    finally:
        policy.close()


def test_a_new_versions_session_is_built_off_the_calling_thread(monkeypatch):
    info = EnvInfo((6,), "float32", 3)
    model = _model(ACROBOT, info)
    policy = OrtPolicy.create(model, "logits", _obs(info, 8))
    built_on, release = [], threading.Event()
    real_build = onnxpolicy.build

    def slow_build(*a, **k):
        built_on.append(threading.current_thread())
        assert release.wait(30)
        return real_build(*a, **k)

    monkeypatch.setattr(onnxpolicy, "build", slow_build)
    try:
        _new_version(model)
        policy.sync(1)  # returns while the build is held back
        assert policy.refresh() == 0  # not built yet: the old version keeps acting, nothing waits
        release.set()
        assert policy.refresh(wait=True) == 1
        assert built_on and threading.current_thread() not in built_on
    finally:
        release.set()
        policy.close()


def test_a_build_under_way_acts_once_built_though_a_newer_version_arrived(monkeypatch):
    info = EnvInfo((6,), "float32", 3)
    model = _model(ACROBOT, info)
    policy = OrtPolicy.create(model, "logits", _obs(info, 8))
    started, release = threading.Event(), {1: threading.Event(), 2: threading.Event()}
    real_build = onnxpolicy.build

    def held_build(exported, weights, version, log_std=None):
        started.set()
        assert release[version].wait(30)
        return real_build(exported, weights, version, log_std)

    monkeypatch.setattr(onnxpolicy, "build", held_build)
    try:
        _new_version(model)
        policy.sync(1)
        assert started.wait(30)  # version 1's build is under way
        _new_version(model)
        policy.sync(2)  # version 2 queues behind it
        release[1].set()
        policy._pending[0].result(timeout=30)
        assert policy.refresh() == 1  # version 1 acts while version 2 builds: not the version before it
        release[2].set()
        assert policy.refresh(wait=True) == 2
    finally:
        release[1].set()
        release[2].set()
        policy.close()


def _rollout(job, *sets: str, **kw) -> Rollout:
    return Rollout(load_job(job, ["spec.env.numEnvs=4", "spec.env.fragmentLength=8", *sets]).spec, seed=5, **kw)


def test_onnx_rollout_stores_the_learners_log_probs_and_tags_the_version_it_acted_with(monkeypatch):
    r = _rollout(ACROBOT, "spec.actor.inference=onnx")
    try:
        assert isinstance(r.policy, OrtPolicy)
        _new_version(r.model, scale=40.0)  # trained-policy-sized logits
        release = threading.Event()
        real_build = onnxpolicy.build
        monkeypatch.setattr(onnxpolicy, "build", lambda *a, **k: release.wait(30) and real_build(*a, **k))
        r.params_loaded(7)
        r.fragment()  # the session of version 7 is still building: this fragment acts with version 0
        assert r.acting_version == 0
        release.set()
        r.policy.settle(timeout=30)
        arrays, _ = r.fragment()
        assert r.acting_version == 7
        obs = torch.from_numpy(arrays["obs"].reshape(-1, 6))
        with torch.no_grad():
            pi, _ = r.model(obs)
            logp, _ = distributions.logp_entropy(r.model, pi, torch.from_numpy(arrays["actions"].reshape(-1)), False)
        np.testing.assert_allclose(arrays["logp"], logp.numpy().reshape(arrays["logp"].shape), rtol=TOL, atol=TOL)
    finally:
        r.close()


def test_the_strict_loop_acts_with_the_version_it_waited_for():
    r = _rollout(ACROBOT, "spec.actor.inference=onnx", wait_swaps=True)
    try:
        _new_version(r.model)
        r.params_loaded(3)
        r.fragment()
        assert r.acting_version == 3
    finally:
        r.close()


@pytest.fixture
def auto_weighs_any_model(monkeypatch):
    """auto's benchmark on a small MLP: without this its torch forward is under TORCH_FAST_US."""
    monkeypatch.setattr(onnxpolicy, "TORCH_FAST_US", 0.0)


def test_auto_keeps_a_fast_torch_forward_without_importing_onnx_runtime(monkeypatch):
    def imported():
        raise AssertionError("ONNX Runtime imported for a forward auto keeps on torch")

    monkeypatch.setattr(onnxpolicy, "_import_ort", imported)
    monkeypatch.setattr(onnxpolicy, "TORCH_FAST_US", float("inf"))
    info = EnvInfo((6,), "float32", 3)
    model = _model(ACROBOT, info)
    for background in (False, True):
        rt = PolicyRuntime(model, load_job(ACROBOT).spec, _obs(info, 8), background=background)
        assert rt.policy is model and rt.name == "torch" and rt._selection is None
        assert rt.report["torch_us"] > 0 and "under inf us" in rt.report["reason"]
    monkeypatch.setattr(onnxpolicy, "TORCH_FAST_US", 0.0)  # a forward that is not fast goes on to the import
    with pytest.raises(AssertionError, match="imported"):
        onnxpolicy.OrtPolicy.create(model, "logits", _obs(info, 8))
    assert onnxpolicy.torch_is_fast(model, "logits", _obs(info, 8)) is None


def test_auto_decides_in_the_background_and_adopts_the_newest_version(auto_weighs_any_model):
    r = _rollout(ACROBOT, background_choice=True)
    try:
        assert r.runtime.name == "torch"  # the env loop starts at once, on torch
        _new_version(r.model)
        r.params_loaded(2)  # while auto is deciding
        r.runtime._selection.result(timeout=120)
        r.fragment()  # adopts the decision
        rep = r.runtime.report
        assert rep["torch_us"] > 0 and rep["onnx_us"] > 0 and rep["max_abs_diff"] <= TOL
        if rep["inference"] == "onnx":  # the micro-benchmark's verdict on this machine
            assert r.acting_version in (0, 2)  # version 2's session may still be building: not waited for
            r.policy.settle(timeout=30)
            r.fragment()
            assert r.acting_version == 2
            x = np.array(r.obs)
            np.testing.assert_allclose(r.policy.logits(torch.from_numpy(x)).numpy(),
                                       _torch_out(r.model, "logits", x), rtol=TOL, atol=TOL)
    finally:
        r.close()


def test_auto_falls_back_to_torch_and_onnx_says_what_is_missing(monkeypatch, auto_weighs_any_model):
    def missing():
        raise OnnxUnavailable("onnxruntime is not installed (pip install 'tianji[onnx]')")

    monkeypatch.setattr(onnxpolicy, "_import_ort", missing)
    spec = load_job(ACROBOT).spec
    info = EnvInfo((6,), "float32", 3)
    model = _model(ACROBOT, info)
    rt = PolicyRuntime(model, spec, _obs(info, 8))
    assert rt.policy is model and rt.name == "torch" and "not installed" in rt.report["reason"]
    with pytest.raises(OnnxUnavailable, match=r"spec.actor.inference: onnx: .*tianji\[onnx\]"):
        PolicyRuntime(model, load_job(ACROBOT, ["spec.actor.inference=onnx"]).spec, _obs(info, 8))


def test_auto_falls_back_when_the_export_disagrees(monkeypatch, auto_weighs_any_model):
    """A session that does not reproduce the model (here: built from the export's shifted copy) is refused."""
    monkeypatch.setattr(onnxpolicy, "snapshot", lambda model, exported: {})
    info = EnvInfo((6,), "float32", 3)
    rt = PolicyRuntime(_model(ACROBOT, info), load_job(ACROBOT).spec, _obs(info, 8))
    assert rt.name == "torch" and "differ from torch's" in rt.report["reason"]


def test_spec_default_and_the_bfloat16_conflict():
    assert load_job(ACROBOT).spec.actor.inference == "auto"
    assert load_job(ACROBOT, ["spec.actor.inference=torch"]).spec.actor.inference == "torch"
    with pytest.raises(SpecError, match="actorPrecision bfloat16 needs actor.inference torch"):
        load_job(ACROBOT, ["spec.actor.inference=onnx", "spec.model.actorPrecision=bfloat16"])
    with pytest.raises(SpecError, match="actor.inference"):
        load_job(ACROBOT, ["spec.actor.inference=tensorrt"])
    info = EnvInfo((6,), "float32", 3)
    rt = PolicyRuntime(_model(ACROBOT, info), load_job(ACROBOT, ["spec.model.actorPrecision=bfloat16"]).spec,
                       _obs(info, 8))
    assert rt.name == "torch" and "bfloat16" in rt.report["reason"]


def test_auto_takes_onnx_only_where_its_saving_outweighs_the_build_each_version_costs():
    bench = {"torch_us": 4500.0, "onnx_us": 3100.0, "build_us": 60_000.0}
    assert onnxpolicy.onnx_pays(bench, 64)  # 64 x 1.4 ms saved > 60 ms built
    assert not onnxpolicy.onnx_pays(bench, 32)  # 32 x 1.4 ms < 60 ms
    assert onnxpolicy.onnx_pays(bench, 0)  # builds not counted (no versions to follow)
    assert not onnxpolicy.onnx_pays({**bench, "onnx_us": 4400.0}, 10_000)  # under MIN_SPEEDUP
