"""Data-parallel learners keep one model: identical parameters after every synchronised update."""

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from helpers import EXAMPLES, free_port, read_summary, run_tianji


def _learner(rank: int, world: int, init: str, out) -> None:
    torch.set_num_threads(1)
    from tianji.algos.ppo import PPOLearner
    from tianji.runtime.distributed import GradientAverager
    from tianji.envs import probe_env
    from tianji.algos.models import build_model
    from tianji.control.spec import load_job

    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    info = probe_env(job.spec.env)
    model = build_model("ppo", job.spec.model, info, job.spec.env.seed)
    learner = PPOLearner(model, job.spec.algorithm, seed=rank)  # different minibatch order per rank
    avg = GradientAverager(rank, world, init, backend="gloo")
    learner.sync_grads, learner.world = avg, world
    rng = np.random.default_rng(rank)  # and different data per rank
    T, N = 32, 8
    for _ in range(3):
        b = {"obs": rng.normal(size=(T, N, 4)).astype(np.float32), "actions": rng.integers(0, 2, (T, N)),
             "logp": np.full((T, N), -0.69, np.float32), "rewards": np.ones((T, N), np.float32),
             "dones": rng.random((T, N)) < 0.05, "terminated": np.zeros((T, N), bool),
             "valid": rng.random((T, N)) > 0.02, "last_obs": rng.normal(size=(N, 4)).astype(np.float32)}
        learner.update(b)
        out.put((rank, [p.detach().numpy().copy() for p in model.parameters()]))  # by value, not shared memory
    avg.close()


def test_learners_hold_identical_parameters_after_each_update():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_learner, args=(r, 2, init, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = {0: [], 1: []}
    for _ in range(6):
        rank, params = q.get(timeout=120)
        got[rank].append(params)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for step in range(3):
        for a, b in zip(got[0][step], got[1][step]):
            assert np.array_equal(a, b), f"parameters differ after update {step}"
    assert not np.array_equal(got[0][0][0], got[0][2][0])  # and they did change


@pytest.mark.slow
def test_two_groups_with_data_parallel_learners_reach_target(tmp_path):
    run = tmp_path / "run"
    r = run_tianji("run", str(EXAMPLES / "cartpole-ppo.yaml"), "--run-dir", str(run), "--quiet",
                   "--set", "spec.topology.groups=2", "--set", "spec.topology.actors=1",
                   "--set", "spec.stop.envFrames=600000", "--set", "spec.stop.seconds=900", timeout=1000)
    s = read_summary(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert s["processes"] == {"actors": 2, "buffers": 2, "learners": 2}
    assert s["reached_target"], s
