"""bench/learner_host.py times the real host-side pieces around a Pong PPO update: its synthetic
fragments compress as Pong's do, the batch it assembles is one the learner accepts, and the GPU
section of docs/benchmarks.md names the bound from what the JSON says."""
import json

import numpy as np
import pytest

from bench import learner_host, render_docs
from bench.harness import ROOT

JOB = str(ROOT / "examples" / "pong-ppo.yaml")


@pytest.fixture(scope="module")
def pong():
    return learner_host.setup(JOB)


def test_fragments_are_real_frame_stacks_so_compression_sends_one_frame_per_step(pong):
    from tianji.runtime import framestack

    job, info, frags = pong
    assert len(frags) == 2  # 1024 samples of 8 envs x 64 steps
    f = frags[0]
    assert f["obs"].shape == (64, 8, 4, 84, 84) and f["obs"].dtype == np.uint8
    np.testing.assert_array_equal(f["obs"][1:, :, :-1], f["obs"][:-1, :, 1:])
    c = framestack.compress(f["obs"])
    assert c["key"][0].all() and not c["key"][1:].any()  # only the first step carries a whole stack
    np.testing.assert_array_equal(framestack.expand(c["frames"], c["key"], c["keystacks"], 4), f["obs"])


def test_the_assembled_batch_passes_the_learners_checks_and_every_piece_is_timed(pong):
    from tianji.algos.models import build_model
    from tianji.runtime.validate import check_batch
    from tianji.runtime.wire import Message

    job, info, frags = pong
    buf, batch = learner_host.buffer_pieces(job, info, frags, reps=1)
    assert batch["obs"].shape == (64, 16, 4, 84, 84) and batch["versions"].shape == (16,)
    check_batch(Message("batch", arrays=batch), job.spec, info)  # raises on anything the learner refuses
    model = build_model(job.spec.algorithm, job.spec.model, info, 0)
    outside = learner_host.learner_outside(job, info, batch, model, reps=1)
    inside = learner_host.learner_inside(job, batch, model, reps=1)
    assert outside["param_bytes"] > 6e6 and inside["staged_bytes"] >= sum(a.nbytes for a in batch.values())
    for part in (buf, outside, inside):
        for v in part.values():
            if isinstance(v, dict):
                assert 0 < v["best_ms"] <= v["median_ms"]


def _host_result(outside_ms: dict) -> dict:
    d = json.loads((ROOT / "docs" / "results" / "learner-host.json").read_text())
    d["learner_outside_update"] = {k: {"median_ms": v, "best_ms": v} for k, v in outside_ms.items()}
    d["totals_ms"]["learner_outside_update"] = sum(outside_ms.values())
    d["host_bound"] = sum(outside_ms.values()) > d["gpu"]["update_ms"]
    d["biggest_outside_update"] = max(outside_ms, key=outside_ms.get)
    return {**d, "path": "docs/results/learner-host.json"}


def test_the_doc_names_the_bound_and_its_biggest_piece_only_when_host_work_exceeds_the_update():
    scaling = render_docs.load("docs/device/scaling-pong-ppo.json")
    slow = _host_result({"batch_send_receive_decode": 20.0, "validate_batch": 0.1, "publish_params": 90.0})
    text = "\n".join(render_docs._learner_host(slow, scaling))
    assert "the host work is the bound, most of it publish_params" in text and "110.1" in text
    fast = _host_result({"batch_send_receive_decode": 20.0, "validate_batch": 0.1, "publish_params": 5.0})
    text = "\n".join(render_docs._learner_host(fast, scaling))
    assert "not the bound" in text and "the host work is the bound" not in text
