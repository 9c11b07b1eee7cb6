"""`tianji eval`: a fixed number of episodes per env (no bias toward short episodes), DQN at ε."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tianji.cli import build_parser
from tianji.runtime.evaluation import DQN_EVAL_EPSILON, EpisodeQuota, eval_actions, evaluate


def test_quota_takes_the_same_count_from_every_env_however_long_its_episodes():
    """Env 0 ends an episode every step (return 1), env 1 every 10 steps (return 10). The first
    4 episodes to finish are all env 0's (mean 1); per-env quotas take 2 + 2 (mean 5.5)."""
    q = EpisodeQuota(4, 2)
    first_to_finish: list[float] = []
    step = 0
    while not q.done:
        step += 1
        q.add(0, 1.0)
        first_to_finish.append(1.0)
        if step % 10 == 0:
            q.add(1, 10.0)
            first_to_finish.append(10.0)
    assert np.mean(first_to_finish[:4]) == 1.0
    assert [len(r) for r in q.returns] == [2, 2] and q.all_returns().mean() == 5.5
    assert EpisodeQuota(10, 8).quota == [2, 2, 1, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        EpisodeQuota(0, 2)


@pytest.mark.parametrize("episodes, envs", [(20, 5), (10, 5), (8, 8), (16, 8), (7, 7), (13, 1), (3, 3), (1, 1)])
def test_eval_plays_the_same_count_on_each_env(episodes, envs):
    """`tianji eval --episodes 20` takes 4 from each of 5 envs, not [3, 3, 3, 3, 2, 2, 2, 2] from 8."""
    from tianji.runtime.evaluation import eval_env_count

    assert eval_env_count(episodes, 8) == envs
    assert set(EpisodeQuota(episodes, envs).quota) == {episodes // envs}


def test_an_env_that_steps_natively_is_evaluated_on_up_to_128_copies():
    """CartPole steps all its copies in one numpy call: 100 episodes are one from each of 100 envs.
    A wrapped CartPole (the per-env loop) and Atari keep 8."""
    from tianji.control.spec import parse_job
    from tianji.runtime.evaluation import MAX_EVAL_ENVS, MAX_NATIVE_EVAL_ENVS, eval_env_count, eval_env_limit

    def env(**extra):
        doc = {"apiVersion": "tianji.dev/v1alpha1", "kind": "TianJiJob", "metadata": {"name": "e"},
               "spec": {"algorithm": {"name": "ppo"}, "env": {"id": "CartPole-v1", **extra}}}
        return parse_job(doc).spec.env

    assert eval_env_limit(env()) == MAX_NATIVE_EVAL_ENVS == 128
    assert eval_env_count(100, eval_env_limit(env())) == 100
    clip = {"entryPoint": "gymnasium.wrappers:ClipReward", "kwargs": {"min_reward": 0, "max_reward": 1}}
    wrapped = env(wrappers=[clip])
    assert eval_env_limit(wrapped) == MAX_EVAL_ENVS == 8
    assert eval_env_limit(env(id="ALE/Pong-v5")) == MAX_EVAL_ENVS


def test_epsilon_replaces_that_share_of_greedy_actions():
    scores = torch.zeros(20_000, 4)
    scores[:, 2] = 1.0  # greedy: always action 2
    rng = np.random.default_rng(0)
    assert (eval_actions(scores, 0.0, rng) == 2).all()
    a = eval_actions(scores, 0.05, rng)
    off = (a != 2).mean()  # a random action is 2 a quarter of the time: 0.05 * 3/4 differ
    assert 0.03 < off < 0.045
    assert set(np.unique(a)) == {0, 1, 2, 3}


def test_eval_counts_episodes_per_env_and_acts_at_epsilon(dqn_checkpoint, capsys):
    res = evaluate(dqn_checkpoint, episodes=6, seed=3, num_envs=4)
    assert res["epsilon"] == DQN_EVAL_EPSILON and res["policy_version"] == 7
    assert res["episodes"] == 6 and res["episodes_per_env"] == [2, 2, 2]  # 3 envs: the most <= 4 dividing 6
    assert 8 <= res["mean_length"] <= 12  # always left: the pole falls in about 10 steps; a step earns 1
    assert res["mean_length"] == pytest.approx(res["mean_return"])
    assert res == evaluate(dqn_checkpoint, episodes=6, seed=3, num_envs=4)  # seeded: repeatable
    greedy = evaluate(dqn_checkpoint, episodes=8, seed=3, epsilon=0.0)
    uniform = evaluate(dqn_checkpoint, episodes=8, seed=3, epsilon=1.0)
    # Always left: the pole falls within ~10 steps; uniformly random actions keep it up about
    # twice as long (CartPole's random-policy mean is ~22).
    assert greedy["mean_return"] < 12 < uniform["mean_return"]

    a = build_parser().parse_args(["eval", str(dqn_checkpoint), "--episodes", "3", "--epsilon", "0.01", "--json"])
    assert a.fn(a) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] == 0.01 and out["episodes"] == 3
    a = build_parser().parse_args(["eval", str(dqn_checkpoint), "--epsilon", "1.5"])
    assert a.fn(a) == 2
    assert "not in [0, 1]" in capsys.readouterr().err


class _Endless:
    """A vector env of 2 whose episodes never end; reward 1 a step on env 0, 0 on env 1."""

    num_envs = 2

    def reset(self, seed=None):
        return np.zeros((2, 3), np.float32), {}

    def step(self, actions):
        no = np.zeros(2, bool)
        return np.zeros((2, 3), np.float32), np.array([1.0, 0.0]), no, no, {}


class _Greedy(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape[0], 2)


def test_a_step_cap_ends_an_episode_that_never_ends_with_what_it_earned():
    """A policy in an env without a time limit can loop forever; with `step_cap` each capped
    stretch counts as one episode with its return so far, so the quota fills."""
    from types import SimpleNamespace

    from tianji.runtime.evaluation import play_episodes

    info = SimpleNamespace(continuous=False)
    q = play_episodes(_Greedy(), _Endless(), info, "dqn", 4, 0.0, seed=0, step_cap=25)
    assert q.done and [len(r) for r in q.returns] == [2, 2]
    assert q.all_returns().tolist() == [25.0, 25.0, 0.0, 0.0] and set(q.all_lengths().tolist()) == {25}
    stop_after = iter(range(50))
    unfinished = play_episodes(_Greedy(), _Endless(), info, "dqn", 4, 0.0, seed=0,
                               should_stop=lambda: next(stop_after) >= 49)
    assert not unfinished.done  # without a cap, only the stop signal ends it
