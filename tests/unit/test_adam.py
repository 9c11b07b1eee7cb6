"""tianji.algos.adam.Adam is torch.optim.Adam without torch._dynamo: the same parameters after
the same steps, state_dicts that load into each other, and a learner's whole life (build, update,
checkpoint, restore) that never imports torch._dynamo."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from tianji.algos.adam import Adam

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for i in range(steps):
        x = torch.randn(32, 4, generator=gen)
        for g in opt.param_groups:
            g["lr"] = 1e-2 / (1 + i)  # as the learners anneal it
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).sum().backward()
        opt.step()


@pytest.mark.parametrize("kwargs", [{}, {"eps": 1e-5, "fused": True}, {"foreach": False, "weight_decay": 0.1}])
def test_the_same_update_as_torch_adam(kwargs):
    ours, theirs = _model(), _model()
    o1, o2 = Adam(ours.parameters(), lr=1e-2, **kwargs), torch.optim.Adam(theirs.parameters(), lr=1e-2, **kwargs)
    _train(ours, o1, 6, seed=1)
    _train(theirs, o2, 6, seed=1)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)  # bit for bit: the same torch kernels
    assert all(not p.requires_grad or p.grad is not None for p in ours.parameters())
    s1, s2 = o1.state_dict(), o2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k in s2["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1["state"][k][name], s2["state"][k][name])


def test_state_dicts_move_between_the_two_both_ways():
    m = _model()
    ours = Adam(m.parameters(), lr=1e-2)
    _train(m, ours, 3, seed=2)
    m_ref = copy.deepcopy(m)
    theirs = torch.optim.Adam(m_ref.parameters(), lr=1e-2)
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))  # a checkpoint of ours, restored by torch's
    back = Adam(m.parameters(), lr=1e-2)
    back.load_state_dict(copy.deepcopy(theirs.state_dict()))  # and an older checkpoint of torch's, by ours
    # (deep copies: load_state_dict keeps same-device tensors as they are, shared with the source)
    _train(m, back, 3, seed=3)
    _train(m_ref, theirs, 3, seed=3)
    for a, b in zip(m.parameters(), m_ref.parameters()):
        assert torch.equal(a, b)


_LEARNER_LIFE = r"""
import json, sys
import numpy as np
import torch
from tianji.algos.dqn import DQNLearner
from tianji.algos.models import build_model
from tianji.algos.ppo import PPOLearner
from tianji.control.spec import load_job
from tianji.envs import probe_env

out = {}
for algo, cls in (("ppo", PPOLearner), ("dqn", DQNLearner)):
    s = load_job(f"examples/cartpole-{algo}.yaml").spec
    info = probe_env(s.env)
    learner = cls(build_model(s.algorithm, s.model, info, s.env.seed, s.env.imports), s.algorithm, 0)
    rng = np.random.default_rng(0)
    if algo == "ppo":
        T, N = 8, 4
        b = {"obs": rng.normal(size=(T, N, 4)).astype(np.float32),
             "last_obs": rng.normal(size=(N, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, (T, N)), "logp": np.full((T, N), -0.7, np.float32),
             "rewards": np.ones((T, N), np.float32), "dones": np.zeros((T, N), np.float32),
             "terminated": np.zeros((T, N), np.float32), "valid": np.ones((T, N), bool),
             "versions": np.zeros(N, np.int64)}
    else:
        n = s.algorithm.batch_size
        b = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, n), "returns": np.ones(n, np.float32),
             "discounts": np.full(n, 0.99, np.float32)}
    stats = learner.update(b)
    learner.load_state(learner.state())
    out[algo] = stats["train_steps"]
out["dynamo"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def test_a_learners_life_never_imports_torch_dynamo():
    proc = subprocess.run([sys.executable, "-c", _LEARNER_LIFE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "worker")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ppo"] > 0 and out["dqn"] > 0  # both really stepped their optimizers
    assert out["dynamo"] is False
