"""A learner that cannot be poisoned: non-finite updates are skipped, non-finite weights are never
published or checkpointed, and the last good parameters are kept."""
import numpy as np
import torch
import zmq

from helpers import EXAMPLES
from tianji.algos import apply_gradients, params_finite
from tianji.algos.dqn import DQNLearner
from tianji.algos.models import build_model
from tianji.algos.ppo import PPOLearner
from tianji.control.contracts.addressing import Addresses
from tianji.control.spec import load_job
from tianji.envs import EnvInfo
from tianji.runtime import checkpoint, security
from tianji.runtime.roles.learner import Learner
from tianji.runtime.wire import decode

INFO = EnvInfo((4,), "float32", 2)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def ppo_batch(T=32, B=8, bad=None):
    rng = np.random.default_rng(0)
    b = {"obs": rng.standard_normal((T, B, 4)).astype(np.float32),
         "actions": rng.integers(0, 2, (T, B)).astype(np.int64), "logp": np.full((T, B), -0.69, np.float32),
         "rewards": np.ones((T, B), np.float32), "dones": np.zeros((T, B), bool),
         "terminated": np.zeros((T, B), bool), "valid": np.ones((T, B), bool),
         "last_obs": rng.standard_normal((B, 4)).astype(np.float32), "versions": np.zeros(B, np.int64)}
    if bad:
        b[bad] = b[bad].copy()
        b[bad].reshape(-1)[0] = np.nan
    return b


def test_apply_gradients_skips_a_non_finite_step_and_leaves_weights_and_optimizer_alone():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = snapshot(model)
    loss = model(torch.tensor([[float("nan"), 1.0, 1.0]])).sum()
    assert apply_gradients(loss, model, opt, 0.5) is False
    assert same(before, snapshot(model)) and not opt.state
    assert apply_gradients(model(torch.ones(1, 3)).sum(), model, opt, 0.5) is True
    assert not same(before, snapshot(model))


def test_ppo_update_on_a_nan_batch_changes_nothing():
    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    model = build_model("ppo", job.spec.model, INFO, 1)
    learner = PPOLearner(model, job.spec.algorithm, 1)
    before = snapshot(model)
    for field in ("obs", "rewards", "logp", "last_obs"):
        stats = learner.update(ppo_batch(bad=field))
        assert stats["train_steps"] == 0 and stats["skipped_steps"] > 0, field
        assert same(before, snapshot(model)), field
    assert learner.update(ppo_batch())["train_steps"] > 0 and params_finite(model)


def test_dqn_update_on_non_finite_returns_changes_nothing():
    job = load_job(EXAMPLES / "cartpole-dqn.yaml")
    cfg = job.spec.algorithm
    model = build_model("dqn", job.spec.model, INFO, 1)
    learner = DQNLearner(model, cfg, 1)
    M = cfg.batch_size * cfg.steps_per_batch
    b = {"obs": np.zeros((M, 4), np.float32), "next_obs": np.zeros((M, 4), np.float32),
         "actions": np.zeros(M, np.int64), "returns": np.full(M, np.inf, np.float32),
         "discounts": np.full(M, 0.9, np.float32), "versions": np.zeros(M, np.int64)}
    before = snapshot(model)
    stats = learner.update(b)
    assert stats["train_steps"] == 0 and stats["skipped_steps"] == cfg.steps_per_batch
    assert same(before, snapshot(model))


def test_learner_never_publishes_or_checkpoints_non_finite_weights_and_restores_the_last_good(tmp_path, monkeypatch):
    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    rings = security.issue(["learner-0-0", "buffer-0-0", "actor-0-0"])
    security.write_keyring(tmp_path / "learner.json", rings["learner-0-0"])
    monkeypatch.setenv("TIANJI_CURVE_KEYS", str(tmp_path / "learner.json"))
    learner = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), run_dir=str(tmp_path))
    sub = learner.ctx.socket(zmq.SUB)
    try:
        learner.setup()
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        security.Curve(None, rings["actor-0-0"]).client(sub, "learner-0-0")
        sub.connect(learner.addrs.connect("params", 0, 0))
        good = snapshot(learner.model)
        learner.save_checkpoint()
        with torch.no_grad():  # as if an update had produced NaNs
            next(learner.model.parameters()).fill_(float("nan"))
        learner.publish()
        learner.save_checkpoint()
        assert not sub.poll(300), "non-finite parameters were published"
        assert len(checkpoint.list_checkpoints(learner.ckpt_dir)) == 1
        assert learner._keep_good() is False and same(good, snapshot(learner.model))
        learner.publish()
        assert sub.poll(2000)
        msg = decode(sub.recv_multipart(), job=job.name)
        assert all(np.isfinite(a).all() for a in msg.arrays.values())
    finally:
        sub.close(linger=0)
        learner.teardown()
        learner.ctx.destroy(linger=0)
    st = checkpoint.load(checkpoint.list_checkpoints(learner.ckpt_dir)[-1])
    assert all(torch.isfinite(t).all() for t in st["model"].values())
