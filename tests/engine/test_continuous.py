"""Continuous actions for PPO: the Gaussian policy the actor samples is the one the learner scores,
actions travel unclipped as float32 [T, N, act_dim] and are checked on receipt, normalisation
statistics are owned by the learner and travel (and checkpoint) with the parameters, and DQN
refuses a Box action space."""
import math

import numpy as np
import pytest
import torch

from helpers import EXAMPLES, read_summary, run_tianji
from tianji.algos import distributions
from tianji.algos.models import build_model, load_arrays, state_arrays
from tianji.algos.normalize import RunningMeanStd, scale_rewards
from tianji.algos.ppo import PPOLearner, act
from tianji.control.spec import load_job
from tianji.envs import EnvInfo
from tianji.runtime import checkpoint
from tianji.runtime.fields import FRAGMENT
from tianji.runtime.rollout import Rollout
from tianji.runtime.validate import GAUSS_LOGP_MAX_PER_DIM, POSITIVE_PARAMS, check_batch, check_fragment, check_params
from tianji.runtime.wire import Message, WireError

torch.set_num_threads(1)  # deliberately, as every TianJi process does (a 2-core CI box)

PENDULUM = EXAMPLES / "pendulum-ppo.yaml"
INFO = EnvInfo((3,), "float32", 0, (1,), (-2.0,), (2.0,))


def pendulum_job(**algorithm):
    job = load_job(PENDULUM)
    if algorithm:
        job.spec.algorithm = job.spec.algorithm.model_copy(update=algorithm)
    return job


def fragment_message(arrays, version=0):
    return Message("fragment", "actor-0-0", 0, version, arrays, {})


def batch_of(job, arrays):
    """One fragment repeated up to the job's batch size, as a buffer hands it over (version 0)."""
    k = job.spec.algorithm.batch_size // (job.spec.env.num_envs * job.spec.env.fragment_length)
    batch = {key: np.concatenate([arrays[key]] * k, axis=0 if key == "last_obs" else 1) for key in FRAGMENT["ppo"]}
    batch["versions"] = np.zeros(k * job.spec.env.num_envs, np.int64)
    return batch


def rollout_fragment(job, seed=3):
    r = Rollout(job.spec, seed)
    arrays, _ = r.fragment()
    arrays["last_obs"] = r.obs
    r.close()
    return r, arrays


def test_gaussian_log_probs_agree_between_actor_numpy_and_learner_torch():
    model = build_model("ppo", load_job(PENDULUM).spec.model, INFO, 1)
    with torch.no_grad():
        model.log_std.fill_(-0.7)
    obs = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    a, extra = act(model, obs, np.random.default_rng(1))
    assert a.dtype == np.float32 and a.shape == (64, 1)
    with torch.no_grad():
        mean, _ = model(torch.from_numpy(obs))
        logp, ent = distributions.logp_entropy(model, mean, torch.from_numpy(a), continuous=True)
        ref = torch.distributions.Normal(mean, torch.full_like(mean, math.exp(-0.7)))
    np.testing.assert_allclose(extra["logp"], logp.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logp.numpy(), ref.log_prob(torch.from_numpy(a)).sum(-1).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ent.numpy(), ref.entropy().sum(-1).numpy(), rtol=1e-5)


def test_log_prob_ceiling_in_validate_covers_the_narrowest_gaussian():
    ceiling = -distributions.LOG_STD_MIN - 0.5 * math.log(2 * math.pi)  # density at the mean, smallest std
    assert ceiling < GAUSS_LOGP_MAX_PER_DIM < ceiling + 0.1


def test_actor_stores_unclipped_actions_and_steps_the_env_with_clipped_ones():
    job = pendulum_job(init_log_std=2.0)  # std e^2: most samples fall outside [-2, 2]
    r = Rollout(job.spec, 3)
    sent = []
    step = r.env.step
    r.env.step = lambda a: (sent.append(np.array(a)), step(a))[1]
    arrays, _ = r.fragment()
    r.close()
    stored = arrays["actions"]
    assert stored.dtype == np.float32 and stored.shape == (job.spec.env.fragment_length, job.spec.env.num_envs, 1)
    assert np.abs(stored).max() > 2.0  # unclipped, as the log-prob was computed for it
    env_actions = np.stack(sent)
    assert np.abs(env_actions).max() <= 2.0
    np.testing.assert_array_equal(env_actions, np.clip(stored, -2.0, 2.0))


def test_buffer_and_learner_accept_an_honest_continuous_fragment_and_batch():
    job = pendulum_job()
    r, arrays = rollout_fragment(job)
    frag = check_fragment(fragment_message(arrays), job.spec, r.info)
    assert set(frag) == set(FRAGMENT["ppo"])
    batch = batch_of(job, arrays)
    check_batch(Message("batch", "buffer-0-0", 0, 0, batch, {"buffer": 0}), job.spec, r.info)


@pytest.mark.parametrize("poison,reason", [
    (lambda a: a.__setitem__("actions", np.where(a["actions"] == a["actions"], np.nan, 0).astype(np.float32)), "value"),
    (lambda a: a.__setitem__("actions", a["actions"] + np.float32(1e6)), "value"),
    (lambda a: a.__setitem__("actions", a["actions"].astype(np.int64)), "dtype"),
    (lambda a: a.__setitem__("actions", a["actions"][..., 0]), "shape"),
    (lambda a: a.__setitem__("logp", a["logp"] + np.float32(100.0)), "value"),
])
def test_continuous_fragments_with_bad_actions_or_log_probs_are_rejected(poison, reason):
    job = pendulum_job()
    r, arrays = rollout_fragment(job)
    poison(arrays)
    with pytest.raises(WireError) as e:
        check_fragment(fragment_message(arrays), job.spec, r.info)
    assert e.value.reason == reason


def test_running_mean_std_merges_batches_exactly():
    rng = np.random.default_rng(0)
    xs = [rng.normal(3.0, 2.0, (n, 3)) for n in (5, 200, 1, 64)]
    rms = RunningMeanStd((3,))
    for x in xs:
        rms.update(torch.from_numpy(x))
    allx = np.concatenate(xs)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-9)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-6)
    assert rms.count.item() == pytest.approx(len(allx))


def test_reward_scale_is_the_std_of_discounted_returns():
    rewards = torch.full((100, 4), -2.0)
    dones = torch.zeros(100, 4)
    dones[49] = 1.0
    rms = RunningMeanStd()
    scaled = scale_rewards(rms, rewards, dones, gamma=0.9)
    # returns climb from -2 towards -20 over each 50-step episode; scaled rewards divide by their std
    assert rms.mean.item() < -15 and 0 < rms.var.item() < 40
    np.testing.assert_allclose(scaled.numpy(), -2.0 / math.sqrt(rms.var.item() + 1e-8), rtol=1e-5)


def test_learner_statistics_reach_the_actor_with_the_parameters_and_are_checked():
    job = pendulum_job(batch_size=1024, epochs=1)  # one fragment, one pass: the statistics are the point
    learner_model = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    actor_model = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    assert learner_model.obs_rms is not None and learner_model.ret_rms is not None  # default on for Box actions
    learner = PPOLearner(learner_model, job.spec.algorithm, 1)
    _, arrays = rollout_fragment(job)
    batch = batch_of(job, arrays)
    learner.update(batch)
    valid = arrays["valid"].reshape(-1)
    np.testing.assert_allclose(learner_model.obs_rms.mean.numpy(), arrays["obs"].reshape(-1, 3)[valid].mean(0),
                               rtol=1e-4, atol=1e-6)
    params = state_arrays(learner_model)
    check_params(Message("params", "learner-0-0", 0, 1, params, {}))
    load_arrays(actor_model, params)
    obs = torch.from_numpy(arrays["obs"][0])
    with torch.no_grad():
        assert torch.equal(actor_model.logits(obs), learner_model.logits(obs))  # same normalised inputs
    for name in POSITIVE_PARAMS:
        for bad in (0.0, -1.0, np.nan):
            forged = dict(params)
            forged[name] = np.full_like(params[name], bad)
            with pytest.raises(WireError):
                check_params(Message("params", "learner-0-0", 0, 1, forged, {}))


def test_normalisation_statistics_are_saved_and_resumed_with_the_checkpoint(tmp_path):
    job = pendulum_job()
    model = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    model.obs_rms.update(torch.randn(500, 3) * 5 + 1)
    model.ret_rms.update(torch.randn(500, 1) * 30)
    path = checkpoint.save(tmp_path, 7, {"model": model.state_dict(), "policy_version": 7}, keep=2)
    fresh = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    fresh.load_state_dict(checkpoint.load(path)["model"])
    for rms in ("obs_rms", "ret_rms"):
        for buf in ("mean", "var", "count"):
            assert torch.equal(getattr(getattr(fresh, rms), buf), getattr(getattr(model, rms), buf))


def test_normalisation_switches_follow_the_spec():
    job = pendulum_job(normalize_observations=False, normalize_rewards=False)
    model = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    assert model.obs_rms is None and model.ret_rms is None
    cart = load_job(EXAMPLES / "cartpole-ppo.yaml")
    discrete = build_model(cart.spec.algorithm, cart.spec.model, EnvInfo((4,), "float32", 2), 1)
    assert discrete.obs_rms is None and discrete.ret_rms is None and not hasattr(discrete, "log_std")


def test_dqn_refuses_a_box_action_space_naming_it():
    job = load_job(EXAMPLES / "cartpole-dqn.yaml")
    with pytest.raises(ValueError, match=r"dqn needs a Discrete action space, got Box\(low=\[-2.0\]"):
        build_model(job.spec.algorithm, job.spec.model, INFO, 1)


def _data_parallel_learner(rank: int, init: str, world: int, out) -> None:
    torch.set_num_threads(1)
    from tianji.runtime.distributed import GroupSync

    job = pendulum_job(minibatch_size=256, epochs=2)
    model = build_model(job.spec.algorithm, job.spec.model, INFO, job.spec.env.seed)
    learner = PPOLearner(model, job.spec.algorithm, seed=rank)
    avg = GroupSync(rank, world, 1, init, "allreduce", backend="gloo")  # `world` groups of one learner
    learner.sync_grads, learner.world = avg.sync_grads, world
    rng = np.random.default_rng(rank)  # different observations and rewards per rank
    T, N = 64, 4
    for _ in range(2):
        b = {"obs": rng.normal(rank, 1 + rank, (T, N, 3)).astype(np.float32),
             "actions": rng.normal(size=(T, N, 1)).astype(np.float32), "logp": np.full((T, N), -1.5, np.float32),
             "rewards": rng.normal(-5 * (rank + 1), 1, (T, N)).astype(np.float32),
             "dones": rng.random((T, N)) < 0.05, "terminated": np.zeros((T, N), bool),
             "valid": np.ones((T, N), bool), "last_obs": rng.normal(size=(N, 3)).astype(np.float32)}
        learner.update(b)
        out.put((rank, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}))
    avg.close()


def test_data_parallel_learners_share_one_set_of_normalisation_statistics():
    from helpers import run_ranks

    got = {0: [], 1: []}
    for rank, state in run_ranks(_data_parallel_learner, 2, (2,), 4, timeout=120):
        got[rank].append(state)
    for step in range(2):
        for k in got[0][step]:
            assert np.array_equal(got[0][step][k], got[1][step][k]), f"{k} differs after update {step}"
    # the statistics are those of both ranks' observations (rank 0 ~ N(0, 1), rank 1 ~ N(1, 2))
    assert got[0][0]["obs_rms.count"][0] == pytest.approx(2 * 64 * 4, rel=1e-6)
    assert 0.3 < got[0][1]["obs_rms.mean"].mean() < 0.7


@pytest.mark.slow
def test_ppo_learns_pendulum_through_tianji_run(tmp_path):
    run = tmp_path / "run"
    r = run_tianji("run", str(PENDULUM), "--run-dir", str(run), "--quiet", "--set", "spec.stop.envFrames=600000",
                   "--set", "spec.stop.seconds=900", timeout=1000)
    s = read_summary(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert s["reached_target"] and s["exit_reason"] == "target", s
    # the mean that met the rule; episodes that end while the run stops still count in mean_return
    assert s["mean_return_at_target"] >= -250 and s["mean_return"] >= -300 and s["rejected_messages"] == 0, s
    # Updates here take longer than the learner's 1 s credit top-up: that must not queue extra batches
    # (lag bound: maxPolicyLag 2 at the buffer + the credit window + the batch being trained).
    assert s["policy_lag"]["max"] <= 5, s["policy_lag"]


def test_an_update_scores_its_batch_with_the_statistics_it_was_acted_with():
    """The importance ratio starts at 1 although the batch moves the statistics (SB3's VecNormalize
    normalises observations when they are collected); the batch is folded in after the update."""
    job = pendulum_job(batch_size=1024, epochs=1)
    _, arrays = rollout_fragment(job)
    model = build_model(job.spec.algorithm, job.spec.model, INFO, 1)
    with torch.no_grad():  # statistics far from the batch's, a policy that notices the difference
        model.obs_rms.mean.fill_(3.0)
        model.obs_rms.var.fill_(0.05)
        model.pi[-1].weight.mul_(100.0)
    batch = batch_of(job, arrays)
    obs = torch.from_numpy(batch["obs"].reshape(-1, 3))
    with torch.no_grad():  # the behaviour log-probs of this very model: what a strict actor sends
        mean, _ = model(obs)
        logp, _ = distributions.logp_entropy(model, mean, torch.from_numpy(batch["actions"].reshape(-1, 1)), True)
    batch["logp"] = logp.reshape(batch["logp"].shape).numpy()
    learner = PPOLearner(model, job.spec.algorithm, 1)
    ratios, loss = [], learner.loss

    def spy(*args):
        out = loss(*args)
        ratios.append(out[4].detach().clone())
        return out

    learner.loss = spy
    learner.update(batch)
    torch.testing.assert_close(ratios[0], torch.ones_like(ratios[0]), rtol=0, atol=1e-4)
    assert float(model.obs_rms.mean[2]) < 1.0  # folded in: the batch's mean (velocities near 0) pulled it from 3
    assert float(model.obs_rms.count) > batch["valid"].sum()
