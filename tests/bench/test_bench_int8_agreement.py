"""bench/int8_agreement.py: the int8 copy's argmax and score error are counted on the frames the
float32 network plays, and a copy that scores differently is seen to."""
import numpy as np
import pytest
import torch

from bench import int8_agreement
from helpers import EXAMPLES
from tianji.algos.models import Int8Policy, build_model
from tianji.control.spec import load_job
from tianji.envs import env_info, make_vec_env

pytest.importorskip("ale_py.vector_env")
torch.set_num_threads(1)


def _model_and_env(job: str):
    spec = load_job(EXAMPLES / job, ["spec.env.numEnvs=2"]).spec
    env = make_vec_env(spec.env, 2)
    model = build_model(spec.algorithm, spec.model, env_info(env), 0).eval()
    return model, env


@pytest.mark.parametrize("job,algo", [("pong-dqn.yaml", "dqn"), ("pong-ppo.yaml", "ppo")])
def test_the_agreement_walk_counts_every_frame(job, algo):
    model, env = _model_and_env(job)
    try:
        got = int8_agreement.agreement(model, Int8Policy(model), algo, env, steps=3, seed=0)
        assert got["frames"] == 6 and 0.0 <= got["argmax_differs"] <= 1.0
        assert 0.0 <= got["dq_over_spread_mean"] <= got["dq_over_spread_p99"]
        same = int8_agreement.agreement(model, model, algo, env, steps=3, seed=0)
        assert same["argmax_differs"] == 0.0 and same["dq_over_spread_p99"] == 0.0
    finally:
        env.close()


def test_a_copy_that_acts_otherwise_is_counted():
    model, env = _model_and_env("pong-dqn.yaml")

    class Reversed(torch.nn.Module):  # the same Q-values in reverse order: another argmax on every frame
        def forward(self, x):
            q = model(x)
            return q.max(-1, keepdim=True).values + q.min(-1, keepdim=True).values - q

    try:
        got = int8_agreement.agreement(model, Reversed(), "dqn", env, steps=3, seed=0)
        assert got["argmax_differs"] == 1.0 and got["dq_over_spread_mean"] == pytest.approx(1.0, abs=1e-4)
    finally:
        env.close()
    assert np.isfinite(got["dq_over_spread_p99"])
