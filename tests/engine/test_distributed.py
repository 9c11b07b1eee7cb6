"""Data-parallel learners: identical parameters after every synchronised update (allreduce mode, and
within a group in average mode); across groups in average mode, equal parameters after a completed
averaging collective, and a non-finite average never reaches the weights."""

import re

import numpy as np
import pytest
import torch

from helpers import EXAMPLES, read_summary, run_ranks, run_tianji


def _batch(rng) -> dict:
    T, N = 32, 8
    return {"obs": rng.normal(size=(T, N, 4)).astype(np.float32), "actions": rng.integers(0, 2, (T, N)),
            "logp": np.full((T, N), -0.69, np.float32), "rewards": np.ones((T, N), np.float32),
            "dones": rng.random((T, N)) < 0.05, "terminated": np.zeros((T, N), bool),
            "valid": rng.random((T, N)) > 0.02, "last_obs": rng.normal(size=(N, 4)).astype(np.float32)}


def _learner(rank: int, init: str, world: int, out) -> None:
    torch.set_num_threads(1)
    from tianji.algos.models import build_model
    from tianji.algos.ppo import PPOLearner
    from tianji.control.spec import load_job
    from tianji.envs import probe_env
    from tianji.runtime.distributed import GroupSync

    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    info = probe_env(job.spec.env)
    model = build_model("ppo", job.spec.model, info, job.spec.env.seed)
    learner = PPOLearner(model, job.spec.algorithm, seed=rank)  # different minibatch order per rank
    avg = GroupSync(rank, world, 1, init, "allreduce", backend="gloo")  # `world` groups of one learner
    learner.sync_grads, learner.world = avg.sync_grads, world
    rng = np.random.default_rng(rank)  # and different data per rank
    for _ in range(3):
        learner.update(_batch(rng))
        out.put((rank, [p.detach().numpy().copy() for p in model.parameters()]))  # by value, not shared memory
        # what the learner role calls after every update, in allreduce mode too: nothing to apply
        if avg.after_update(model) or (avg.posted, avg.averages, avg.skipped) != (0, 0, 0):
            raise AssertionError("allreduce mode averaged parameters after an update")
    avg.close()


def test_learners_hold_identical_parameters_after_each_update():
    got = {0: [], 1: []}
    for rank, params in run_ranks(_learner, 2, (2,), 6):
        got[rank].append(params)
    for step in range(3):
        for a, b in zip(got[0][step], got[1][step]):
            assert np.array_equal(a, b), f"parameters differ after update {step}"
    assert not np.array_equal(got[0][0][0], got[0][2][0])  # and they did change


def _cpu_learner_beside_a_gpu(rank: int, init: str, out) -> None:
    """A CPU learner on a machine where CUDA is available (faked: this machine has none)."""
    torch.set_num_threads(1)
    torch.cuda.is_available = lambda: True
    from tianji.runtime.distributed import GroupSync

    gs = GroupSync(rank, 2, 1, init, "average", interval=1, device=torch.device("cpu"))
    t = torch.full((3,), float(rank))
    torch.distributed.all_reduce(t, group=gs.cross)
    out.put((rank, gs.backend, t.tolist()))
    gs.close()


def test_a_cpu_learner_syncs_over_gloo_even_where_cuda_is_available():
    """nccl moves CUDA tensors only: chosen for a CPU learner because a GPU is present, it failed
    every multi-group CartPole run on a GPU machine (docs/device/planner-validation.json)."""
    got = sorted(run_ranks(_cpu_learner_beside_a_gpu, 2, (), 2))
    assert got == [(0, "gloo", [1.0] * 3), (1, "gloo", [1.0] * 3)]


def test_nccl_only_for_learners_each_on_a_gpu_of_its_own():
    from tianji.runtime.distributed import sync_backend

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert sync_backend(cuda, shares_gpu=False) == "nccl"
    assert sync_backend(cuda, shares_gpu=True) == "gloo"  # nccl refuses two ranks on one GPU
    assert sync_backend(cpu, shares_gpu=False) == "gloo"


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
    # groupSync defaults to average: the groups averaged their parameters, and none was skipped
    for g in range(2):
        log = (run / "logs" / f"learner-{g}-0.log").read_text()
        m = re.search(r"(\d+) averaging collectives posted, (\d+) applied, (\d+) skipped", log)
        assert m and int(m[2]) >= 1 and int(m[3]) == 0, log[-2000:]


GROUPS, PER_GROUP = 2, 2


def _averaging_learner(rank: int, init: str, out) -> None:
    """2 groups x 2 learners, average mode: gradients shared within a group only."""
    torch.set_num_threads(1)
    from tianji.algos.models import build_model
    from tianji.algos.ppo import PPOLearner
    from tianji.control.spec import load_job
    from tianji.envs import probe_env
    from tianji.runtime.distributed import GroupSync

    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    model = build_model("ppo", job.spec.model, probe_env(job.spec.env), job.spec.env.seed)
    learner = PPOLearner(model, job.spec.algorithm, seed=rank)
    gs = GroupSync(rank, GROUPS, PER_GROUP, init, "average", interval=3, backend="gloo")
    gs.broadcast_from_first(model)
    learner.sync_grads, learner.world = gs.sync_grads, GROUPS * PER_GROUP
    rng = np.random.default_rng(rank)
    snap = lambda: [p.detach().numpy().copy() for p in model.parameters()]  # noqa: E731
    for step in range(3):  # the 3rd update posts the first averaging collective, on every rank alike
        learner.update(_batch(rng))
        assert not gs.after_update(model)
        out.put((rank, "update", step, snap()))
    assert gs.posted == 1
    out.put((rank, "before", 0, snap()))
    for w in gs.work:  # the test waits (a learner never does), then polls with no further update
        w.wait()
    assert gs.poll(model) and gs.averages == 1
    out.put((rank, "averaged", 0, snap()))
    gs.interval = 2  # keep training: asynchronous averaging, groups' learners must stay identical
    for step in range(3, 9):
        learner.update(_batch(rng))
        gs.after_update(model)
        out.put((rank, "update", step, snap()))
    out.put((rank, "counts", 0, (gs.posted, gs.averages, gs.skipped)))
    gs.close()


def test_average_mode_groups_stay_identical_and_averaging_equalises_groups():
    world = GROUPS * PER_GROUP
    msgs = run_ranks(_averaging_learner, world, (), world * (9 + 3))
    got = {(r, kind, step): v for r, kind, step, v in msgs}
    for step in range(9):  # within a group: identical after every update, averaging or not
        for g in range(GROUPS):
            a, b = got[(g * PER_GROUP, "update", step)], got[(g * PER_GROUP + 1, "update", step)]
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"group {g} learners differ at {step}"
    # across groups: different data, different parameters, until a completed average equalises them
    before0, before1 = got[(0, "before", 0)], got[(PER_GROUP, "before", 0)]
    assert not all(np.array_equal(x, y) for x, y in zip(before0, before1))
    after = [got[(r, "averaged", 0)] for r in range(world)]
    for r in range(1, world):
        for x, y in zip(after[0], after[r]):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)  # theta + (mean - theta): mean up to rounding
    mean = [(x + y) / 2 for x, y in zip(before0, before1)]
    for x, m in zip(after[0], mean):
        np.testing.assert_allclose(x, m, rtol=0, atol=1e-6)
    for r in range(world):
        posted, averages, skipped = got[(r, "counts", 0)]
        assert posted >= 2 and averages >= 1 and skipped == 0


def _poisoned_learner(rank: int, init: str, out) -> None:
    """2 groups x 1 learner: rank 1 posts a snapshot with a NaN; nobody's weights take it."""
    torch.set_num_threads(1)
    from tianji.runtime.distributed import GroupSync

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    gs = GroupSync(rank, 2, 1, init, "average", interval=1, backend="gloo")
    assert gs.sync_grads is None and gs.subgroup is None  # one learner per group: no per-step collective
    with torch.no_grad():
        model.weight += rank
        if rank == 1:
            model.bias[0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    gs.after_update(model)  # posts
    for w in gs.work:
        w.wait()
    applied = gs.poll(model)
    same = all(torch.equal(a, b) for a, b in zip(before, model.parameters()) if bool(torch.isfinite(a).all()))
    out.put((rank, applied, gs.skipped, same))
    gs.close()


def test_a_non_finite_average_is_skipped_on_every_rank():
    for rank, applied, skipped, same in run_ranks(_poisoned_learner, 2, (), 2):
        assert not applied and skipped == 1 and same, rank
