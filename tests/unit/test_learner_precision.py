"""spec.algorithm.precision: bf16 autocast keeps the PPO and DQN losses of the Nature CNN on a
Pong-shaped batch within float tolerance of fp32; fp32 is the plain float32 path; batches are
staged into one packed host buffer whose views are the batch's arrays."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tianji.algos import BatchStager, autocast, resolve_precision, unpack
from tianji.algos.dqn import DQNLearner
from tianji.algos.models import build_model
from tianji.algos.ppo import PPOLearner
from tianji.control.spec import SpecError, load_job
from tianji.envs import probe_env

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
RTOL = 2e-2


def _learner(algo: str, precision: str):
    torch.manual_seed(0)
    job = load_job(ROOT / "examples" / f"pong-{algo}.yaml", [f"spec.algorithm.precision={precision}"])
    s = job.spec
    info = probe_env(s.env)
    model = build_model(s.algorithm, s.model, info, s.env.seed, s.env.imports)
    cls = PPOLearner if algo == "ppo" else DQNLearner
    return cls(model, s.algorithm, 0), info


def _obs(rng, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8))


def test_precision_resolves_per_device():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"  # auto: bf16 only on a CUDA device that has it
    assert resolve_precision("fp32", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"  # asked for explicitly: CPU autocast
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp16", cpu)


def test_spec_accepts_the_three_precisions_only():
    for p in ("auto", "fp32", "bf16"):
        job = load_job(ROOT / "examples" / "pong-ppo.yaml", [f"spec.algorithm.precision={p}"])
        assert job.spec.algorithm.precision == p
    assert load_job(ROOT / "examples" / "pong-dqn.yaml").spec.algorithm.precision == "auto"
    with pytest.raises(SpecError, match="precision"):
        load_job(ROOT / "examples" / "pong-ppo.yaml", ["spec.algorithm.precision=fp16"])


def test_ppo_loss_bf16_within_tolerance_of_fp32():
    rng = np.random.default_rng(0)
    n = 64
    obs, act = _obs(rng, n), torch.from_numpy(rng.integers(0, 6, n))
    logp = torch.from_numpy(np.log(rng.uniform(0.1, 0.3, n)).astype(np.float32))
    adv = torch.from_numpy(rng.normal(0, 1, n).astype(np.float32))
    ret = torch.from_numpy(rng.normal(0, 1, n).astype(np.float32))
    losses = {}
    for p in ("fp32", "bf16"):
        learner, _ = _learner("ppo", p)
        assert learner.precision == p
        loss, pg, vl, ent, _, _ = learner.loss(obs, act, logp, adv, ret)
        assert loss.dtype == torch.float32  # the loss itself is float32 under autocast too
        losses[p] = torch.stack([loss, pg, vl, ent]).detach()
    assert torch.allclose(losses["bf16"], losses["fp32"], rtol=RTOL, atol=1e-3), losses
    assert not torch.equal(losses["bf16"], losses["fp32"])  # the bf16 path really ran in bf16


def test_dqn_loss_bf16_within_tolerance_of_fp32():
    rng = np.random.default_rng(1)
    n = 32
    obs, nxt, act = _obs(rng, n), _obs(rng, n), torch.from_numpy(rng.integers(0, 6, n))
    ret = torch.from_numpy(rng.normal(0, 1, n).astype(np.float32))
    disc = torch.full((n,), 0.99)
    out = {}
    for p in ("fp32", "bf16"):
        learner, _ = _learner("dqn", p)
        loss, q = learner.loss(obs, act, ret, disc, nxt)
        assert loss.dtype == q.dtype == torch.float32
        out[p] = (loss.detach(), q.detach())
    assert torch.allclose(out["bf16"][0], out["fp32"][0], rtol=RTOL, atol=1e-3)
    # each Q(o, a) in bf16 carries ~3 significant digits: an absolute bound on values of order 0.5
    assert torch.allclose(out["bf16"][1], out["fp32"][1], rtol=RTOL, atol=1e-2)


def test_fp32_forward_is_the_plain_path():
    learner, _ = _learner("ppo", "fp32")
    x = _obs(np.random.default_rng(2), 8)
    logits, v = learner._forward(x)
    ref_logits, ref_v = learner.model(x)
    assert torch.equal(logits, ref_logits) and torch.equal(v, ref_v)  # bit for bit
    assert isinstance(autocast(torch.device("cpu"), "fp32"), type(__import__("contextlib").nullcontext()))


def test_bf16_update_trains_with_float32_master_weights():
    learner, info = _learner("ppo", "bf16")
    learner.cfg = learner.cfg.model_copy(update={"batch_size": 32, "minibatch_size": 16, "epochs": 1})
    rng = np.random.default_rng(3)
    T, N = 8, 4
    b = {"obs": rng.integers(0, 256, (T, N, 4, 84, 84), dtype=np.uint8),
         "last_obs": rng.integers(0, 256, (N, 4, 84, 84), dtype=np.uint8),
         "actions": rng.integers(0, 6, (T, N)), "logp": np.full((T, N), -1.8, np.float32),
         "rewards": rng.normal(0, 1, (T, N)).astype(np.float32), "dones": np.zeros((T, N), np.float32),
         "terminated": np.zeros((T, N), np.float32), "valid": np.ones((T, N), bool),
         "versions": np.zeros(N, np.int64)}
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    stats = learner.update(b)
    assert stats["train_steps"] == 2 and np.isfinite(stats["policy_loss"])
    after = learner.model.state_dict()
    assert all(v.dtype == (torch.float64 if k.startswith("obs_rms.") else torch.float32)
               for k, v in after.items() if v.is_floating_point())  # statistics stay float64
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(s["exp_avg"].dtype == torch.float32 for s in learner.opt.state.values())


def test_staged_batch_views_are_the_arrays():
    rng = np.random.default_rng(4)
    b = {"obs": rng.integers(0, 256, (3, 5, 4, 84, 84), dtype=np.uint8), "rewards": rng.random((3, 5)),
         "valid": rng.random((3, 5)) > 0.5, "actions": rng.integers(0, 6, (3, 5))}
    b["obs"].setflags(write=False)  # as a wire view
    dtypes = {"obs": None, "rewards": np.float32, "valid": bool, "actions": np.int64}
    arrays = {k: np.asarray(b[k], dtype=d) for k, d in dtypes.items()}
    st = BatchStager(torch.device("cpu"))
    for _ in range(2):  # the second batch reuses the buffer
        offsets, used = st.pack(arrays)
        assert all(o % 64 == 0 for o in offsets.values()) and used <= st.host.numel()
        views = unpack(st.host[:used], arrays, offsets)
        for k, a in arrays.items():
            assert views[k].dtype == torch.from_numpy(a).dtype and tuple(views[k].shape) == a.shape
            assert np.array_equal(views[k].numpy(), a)
    cpu = st(b, dtypes)  # on the CPU: the arrays themselves, converted only where asked
    assert np.shares_memory(cpu["obs"].numpy(), b["obs"]) and cpu["rewards"].dtype == torch.float32
