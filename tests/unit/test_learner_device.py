"""Local learners given GPUs get one each (cuda:<k mod visible GPUs>) through TIANJI_DEVICE."""
from __future__ import annotations

from pathlib import Path

import pytest

from tianji.control.contracts.launch import ENV_DEVICE, learner_device, worker_launch
from tianji.control.spec import load_job

JOB = Path(__file__).resolve().parents[2] / "examples" / "pong-ppo.yaml"


def _job(gpu: int):
    return load_job(JOB, [f"spec.resources.learner.gpu={gpu}", "spec.topology.groups=2", "spec.topology.learners=2",
                          "spec.topology.buffers=2"])


def test_each_learner_its_own_gpu_round_robin():
    job = _job(1)
    every = [(g, i) for g in range(2) for i in range(2)]
    assert [learner_device(job, g, i, 4) for g, i in every] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [learner_device(job, g, i, 3) for g, i in every] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0"]
    assert learner_device(job, 1, 1, 0) is None  # none visible: the learner falls back to the CPU
    assert learner_device(_job(0), 0, 0, 4) is None  # not given a GPU


def test_device_reaches_the_local_worker_only():
    job = _job(1)
    kw = {"job_file": "job.yaml", "run_dir": "r", "sock_dir": "s"}
    assert worker_launch(job, "learner", 0, 1, engine="local", device="cuda:1", **kw).env[ENV_DEVICE] == "cuda:1"
    assert ENV_DEVICE not in worker_launch(job, "learner", 0, 1, engine="local", **kw).env
    assert ENV_DEVICE not in worker_launch(job, "learner", 0, 1, engine="pod", job_file="job.yaml").env


def test_learner_reads_its_device():
    torch = pytest.importorskip("torch")
    from tianji.runtime.roles.learner import learner_cuda_device

    assert learner_cuda_device(None) == torch.device("cuda", 0)  # a pod: the device plugin's one GPU
    with pytest.raises(ValueError, match=ENV_DEVICE):
        learner_cuda_device("cpu")
    with pytest.raises(ValueError, match=ENV_DEVICE):
        learner_cuda_device(f"cuda:{torch.cuda.device_count()}")  # not visible
