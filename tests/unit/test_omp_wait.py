"""OpenMP's spin-wait only where each learner thread has a core: a local host whose learners'
torch threads outnumber its cores gets OMP_WAIT_POLICY=PASSIVE (contracts/launch.omp_wait_policy)."""
from __future__ import annotations

from pathlib import Path

from tianji.control.contracts.launch import omp_wait_policy, worker_launch
from tianji.control.spec import load_job

JOB = Path(__file__).resolve().parents[2] / "examples" / "cartpole-ppo.yaml"
LOCAL = {"job_file": "job.yaml", "run_dir": "r", "sock_dir": "s"}


def _job(groups: int, threads: int, learners: int = 1):
    return load_job(JOB, [f"spec.topology.groups={groups}", f"spec.topology.learners={learners}",
                          f"spec.topology.buffers={learners}", f"spec.topology.actors={max(2, learners)}",
                          f"spec.resources.learner.cpu={threads}",
                          f"spec.resources.learner.threads={threads}"])


def test_passive_only_where_learner_threads_outnumber_cores():
    assert omp_wait_policy(_job(2, 2), 2) == "PASSIVE"  # 4 threads, 2 cores: 16x faster (bench/omp_wait.py)
    assert omp_wait_policy(_job(1, 2), 2) is None  # 2 threads, 2 cores: spinning is faster there
    assert omp_wait_policy(_job(2, 2), 4) is None
    assert omp_wait_policy(_job(1, 1, learners=3), 2) == "PASSIVE"  # one thread each, three learners
    assert omp_wait_policy(_job(1, 1), 1) is None


def test_the_policy_reaches_local_workers_of_every_role_and_no_pod():
    job = _job(2, 2)
    for role in ("learner", "actor", "buffer"):  # one zygote forks them all: it imports OpenMP once
        assert worker_launch(job, role, 0, 0, engine="local", host_cores=2, **LOCAL).env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in worker_launch(job, "learner", 0, 0, engine="local", host_cores=8, **LOCAL).env
    assert "OMP_WAIT_POLICY" not in worker_launch(job, "learner", 0, 0, engine="local", **LOCAL).env
    # a pod's CPU limit is its learner's threads: nothing else shares them
    assert "OMP_WAIT_POLICY" not in worker_launch(job, "learner", 0, 0, engine="pod", job_file="job.yaml").env


def test_the_users_own_policy_wins(monkeypatch):
    from tianji.local.launcher import _worker_env

    launch = worker_launch(_job(2, 2), "learner", 0, 0, engine="local", host_cores=2, **LOCAL)
    assert _worker_env(launch)["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _worker_env(launch)["OMP_WAIT_POLICY"] == "ACTIVE"
