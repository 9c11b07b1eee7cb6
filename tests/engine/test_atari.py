"""Atari envs (tianji.envs.atari) and a Pong smoke run through the real roles."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tianji.control.spec import EnvConfig
from tianji.envs import atari, env_info, make_vec_env

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["native", pytest.param("gymnasium", marks=pytest.mark.skipif(
    importlib.util.find_spec("cv2") is None, reason="gymnasium's AtariPreprocessing needs opencv-python"))]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("TIANJI_ATARI_BACKEND", request.param)
    if request.param == "native":
        pytest.importorskip("ale_py.vector_env")
    return request.param


def _env(env_id="ALE/Breakout-v5", n=1, **kw):
    return atari.make_atari_vec(EnvConfig(id=env_id, num_envs=n, **kw), n)


def test_rom_names():
    assert atari.rom_name("ALE/Pong-v5") == "pong"
    assert atari.rom_name("PongNoFrameskip-v4") == "pong"
    assert atari.rom_name("ALE/MsPacman-v5") == "ms_pacman"
    with pytest.raises(ValueError, match="env.id"):
        atari.rom_name("ALE/NoSuchGame-v5")


def test_shapes_dtypes(backend):
    env = make_vec_env(EnvConfig(id="ALE/Pong-v5", num_envs=3, frame_stack=4))
    try:
        assert env.backend == backend
        info = env_info(env)
        assert info.obs_shape == (4, 84, 84) and info.obs_dtype == "uint8" and info.n_actions == 6
        obs, _ = env.reset(seed=3)
        assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
        obs, r, term, trunc, _ = env.step(np.zeros(3, dtype=np.int64))
        assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
        assert np.asarray(r).shape == (3,) and np.asarray(term).dtype == bool and np.asarray(trunc).dtype == bool
        assert obs[:, -1].max() > 0  # a real picture in the newest frame
    finally:
        env.close()
    env = _env("ALE/Pong-v5", 2, frame_stack=2)
    try:
        assert env.reset(seed=0)[0].shape == (2, 2, 84, 84)
    finally:
        env.close()


def test_reward_clipping_flag(backend):
    for clip in (True, False):
        env = _env(clip_rewards=clip)
        try:
            assert env.clip_rewards is clip  # the actor clips; the env reports raw rewards
        finally:
            env.close()


def _lockstep_until(a, b, rng, stop, limit=20_000):
    """Step two identically seeded envs with the same random actions until stop(term, trunc, info)."""
    for _ in range(limit):
        act = rng.integers(0, a.single_action_space.n, 1)
        oa, ra, ta, tra, ia = a.step(act)
        ob, rb, tb, trb, ib = b.step(act)
        np.testing.assert_array_equal(oa, ob)
        if stop(ta, tra, ia):
            return oa, ra, ta, tra, ia
    raise AssertionError("condition never met")


def test_next_step_autoreset(backend):
    """The step after a game over returns the reset observation, reward 0, and ignores its action."""
    a, b = _env(), _env()
    try:
        a.reset(seed=5)
        b.reset(seed=5)
        rng = np.random.default_rng(0)
        _lockstep_until(a, b, rng, lambda t, tr, i: bool(t[0] or tr[0]))
        oa, ra, ta, tra, _ = a.step(np.array([0]))
        ob, rb, tb, trb, _ = b.step(np.array([3]))  # a different action: must be ignored
        np.testing.assert_array_equal(oa, ob)
        assert float(ra[0]) == 0.0 and not ta[0] and not tra[0]
        assert not oa[0, :-1].any() and oa[0, -1].any()  # fresh stack: zero padding + the reset frame
        oa, *_ = a.step(np.array([1]))
        assert oa[0, -2].any()  # and then stacking continues
    finally:
        a.close()
        b.close()


def test_episodic_life(backend):
    """A lost life is `terminated` for learning; info['episode_end'] marks the game over."""
    a, b = _env(episodic_life=True), _env(episodic_life=True)
    try:
        _, info = a.reset(seed=7)
        b.reset(seed=7)
        lives0 = int(np.asarray(info["lives"])[0])
        assert lives0 == 5
        rng = np.random.default_rng(1)
        lost = 0
        while True:
            oa, ra, ta, tra, ia = _lockstep_until(a, b, rng, lambda t, tr, i: bool(t[0] or tr[0]))
            if ia["episode_end"][0]:
                break
            lost += 1
            assert ta[0] and ia["life_loss"][0]
            assert int(ia["lives"][0]) == lives0 - lost  # the game goes on
            # the step after a life loss ignores its action, like a reset step
            oa, ra, ta, tra, ia = a.step(np.array([0]))
            ob, *_ = b.step(np.array([3]))
            np.testing.assert_array_equal(oa, ob)
            assert not ta[0] and not ia["episode_end"][0]
            assert int(ia["lives"][0]) == lives0 - lost
        assert lost == lives0 - 1  # the last life ends the game: episode_end, not a plain life loss
        oa, ra, ta, tra, ia = a.step(np.array([0]))  # reset step: lives back, no false life loss
        assert not ta[0] and not ia["life_loss"][0] and int(ia["lives"][0]) == lives0
    finally:
        a.close()
        b.close()


def test_without_episodic_life_no_life_loss_done():
    env = _env(episodic_life=False)
    try:
        env.reset(seed=7)
        rng = np.random.default_rng(1)
        lives = 5
        for _ in range(20_000):
            _, _, t, tr, info = env.step(rng.integers(0, 4, 1))
            now = int(np.asarray(info["lives"])[0])
            if t[0] or tr[0]:
                assert now == 0 or tr[0]
                break
            assert now <= lives
            lives = now
        else:
            raise AssertionError("no game over")
        assert lives < 5  # lives were lost on the way without a done
    finally:
        env.close()


def test_pong_smoke_through_roles(tmp_path):
    """A few thousand Pong frames through actor -> buffer -> learner (no learning target)."""
    from tianji.cli import main

    run = tmp_path / "run"
    rc = main(["run", str(ROOT / "examples" / "pong-dqn.yaml"), "--run-dir", str(run), "--quiet",
               "--max-seconds", "120",
               "--set", "spec.stop.envFrames=3000",
               "--set", "spec.algorithm.learningStarts=200",
               "--set", "spec.algorithm.replayCapacity=5000",
               "--set", "spec.algorithm.stepsPerBatch=1",
               "--set", "spec.staleness.replayRatio=4",
               "--set", "spec.staleness.paceActors=false",
               "--set", "spec.env.numEnvs=4",
               "--set", "spec.env.fragmentLength=16",
               "--set", "spec.topology.actors=1",
               "--set", "spec.resources.learner.cpu=1",
               "--set", "spec.evaluation.intervalSeconds=null"])  # the example's evaluator: not this smoke
    s = json.loads((run / "summary.json").read_text())
    assert rc == 0, s
    assert s["exit_reason"] == "frames"
    assert s["env_frames"] >= 3000
    assert s["throughput"]["consumed_sps"] > 0
    assert s["policy_version"] >= 1
    assert s["rejected_messages"] == 0
    assert s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}


def _frames(env, seed, steps=40):
    """Observations of `steps` fixed-action steps after reset(seed=seed)."""
    obs, _ = env.reset(seed=seed)
    out = [obs.copy()]
    for t in range(steps):
        obs, *_ = env.step(np.full(env.num_envs, t % 3))
        out.append(obs.copy())
    return np.stack(out)


@pytest.mark.parametrize("seed", [2 ** 31 + 5, np.int64(7), [3, 2 ** 40]])
def test_reset_takes_every_seed_form_and_repeats_it(backend, seed):
    """Seeds at or above 2**31 (the evaluator's), numpy integers and one seed per env: ale-py's native
    vector env rejected all three (a C int per env; only a Python int), Gymnasium's the numpy int."""
    env = _env("ALE/Breakout-v5", 2)
    try:
        first = _frames(env, seed)
        np.testing.assert_array_equal(first, _frames(env, seed))  # the same seed, the same play
    finally:
        env.close()


def test_seeds_are_plain_ints_in_the_c_range_and_distinct():
    from tianji.envs import seeding

    assert seeding.per_env(np.int64(4), 3) == [4, 5, 6] and seeding.per_env(None, 3) is None
    assert all(type(s) is int for s in seeding.per_env(np.array([1, 2]), 2))
    with pytest.raises(ValueError, match="2 ints"):
        seeding.per_env([1.5, 2.5], 2)
    big = seeding.fit_c_int(seeding.per_env(2 ** 31 + 10, 8))
    assert ((big >= 0) & (big < 2 ** 31 - 1)).all() and len(set(big.tolist())) == 8
    assert seeding.fit_c_int([0, 5, 2 ** 31 - 2]).tolist() == [0, 5, 2 ** 31 - 2]  # in range: unchanged
    assert seeding.fit_c_int([2 ** 31 + 10]).tolist() == big[:1].tolist()  # deterministic


def _pong_job(**evaluation):
    import yaml

    from tianji.control.spec import parse_job

    doc = yaml.safe_load((ROOT / "examples" / "pong-ppo.yaml").read_text())
    doc["spec"]["evaluation"] = evaluation
    doc["spec"]["network"] = {"encryption": "none"}
    return parse_job(doc)


def test_the_in_run_evaluator_evaluates_pong(tmp_path, backend):
    """The evaluator role's own path (its seeds start at env.seed + 2**31): on Pong every evaluation
    crashed in ale-py's reset, so a Pong run's evaluator was restarted until it was given up."""
    import zmq

    from tianji.algos.models import state_arrays
    from tianji.control.contracts.addressing import Addresses
    from tianji.control.contracts.rolereport import parse_report
    from tianji.runtime.roles.evaluator import Evaluator
    from tianji.runtime.wire import encode

    job = _pong_job(intervalSeconds=0.01, episodes=2)
    ev = Evaluator(job, 0, 0, Addresses(job.name, 5550, tmp_path))
    ev.setup()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    (tmp_path / "sock").mkdir(exist_ok=True)
    pub.bind(ev.addrs.bind("params", 0, 0))
    try:
        arrays = state_arrays(ev.model)
        for _ in range(100):  # until the subscription has reached the publisher
            pub.send_multipart(encode("params", job.name, "learner-0-0", 0, 3, arrays, {"frames": 512}))
            if ev.sub.poll(100):
                ev.probe_params()
            if ev.version == 3:
                break
        assert ev.version == 3
        ev.next_at = 0.0
        ev.step()  # due: one evaluation of version 3
        rep = parse_report(ev.report(), job.name)
        last = rep.extra["eval"]["last"]
        assert rep.extra["eval"]["count"] == 1 and last["policy_version"] == 3 and last["episodes"] == 2
        assert -21 <= last["return_mean"] <= 21
    finally:
        ctx.destroy(linger=0)
        ev.teardown()
        ev.ctx.destroy(linger=0)


def test_tianji_eval_of_a_pong_checkpoint(tmp_path):
    from tianji.algos.models import build_model
    from tianji.control.spec import dump_job
    from tianji.envs import probe_env
    from tianji.runtime import checkpoint
    from tianji.runtime.evaluation import evaluate

    job = _pong_job()
    model = build_model(job.spec.algorithm, job.spec.model, probe_env(job.spec.env), job.spec.env.seed)
    path = checkpoint.save(tmp_path / "ckpt", 2, {"model": model.state_dict(), "policy_version": 2,
                                                  "manifest": dump_job(job)}, keep=1)
    for seed in (12345, 2 ** 31 + 1):  # the CLI's default, and a seed in the evaluator's range
        res = evaluate(path, episodes=1, seed=seed, num_envs=1)
        assert res["episodes"] == 1 and res["policy_version"] == 2 and -21 <= res["mean_return"] <= 21


def test_the_cnn_trains_the_same_in_either_memory_layout():
    """The learner's CPU steps take the Nature CNN's input channels-last (faster in oneDNN); the loss and
    every gradient are those of the default layout, to float32 rounding."""
    import torch

    from tianji.algos.models import NatureCNN

    x = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    grads = {}
    for layout in (False, True):
        torch.manual_seed(0)
        net = NatureCNN(4)
        net.channels_last_training = layout
        loss = net(x).square().mean()
        loss.backward()
        grads[layout] = (loss.detach(), [p.grad.clone() for p in net.parameters()])
    assert torch.allclose(grads[False][0], grads[True][0], rtol=1e-5)
    for g0, g1 in zip(grads[False][1], grads[True][1]):
        assert torch.allclose(g0, g1, rtol=1e-4, atol=1e-6)
    seen = []
    net.net[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous()))
    net(x)
    with torch.no_grad():  # inference (actors) keeps the default layout: faster at their batch sizes
        net(x)
    assert seen == [False, True]  # a training step's conv input is channels-last, an inference's is not
