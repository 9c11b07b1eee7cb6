"""Fixtures the unit tests share."""
import pytest
import torch

from tianji.control.spec import dump_job, parse_job
from tianji.runtime import checkpoint


@pytest.fixture
def dqn_checkpoint(tmp_path):
    """A CartPole Q-network that always prefers "left", saved as a learner saves it."""
    from tianji.algos.models import build_model
    from tianji.envs import probe_env

    job = parse_job({"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "cp"},
                     "spec": {"algorithm": {"name": "dqn"}}})
    model = build_model("dqn", job.spec.model, probe_env(job.spec.env), job.spec.env.seed)
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():  # Q(s, left) = 1 > Q(s, right) = 0 everywhere: greedy always pushes left
        head.weight.zero_()
        head.bias.copy_(torch.tensor([1.0, 0.0]))
    return checkpoint.save(tmp_path / "checkpoints" / "0-0", 7, {"model": model.state_dict(), "policy_version": 7,
                                                                  "manifest": dump_job(job)}, keep=1)
