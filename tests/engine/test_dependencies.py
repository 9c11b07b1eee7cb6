"""spec.dependencies: strict, the paper's strictly ordered baseline on TianJi's own processes:
an actor waits for the policy trained on its rollout, the learner trains on exactly the last
rollout of every actor (policy lag 0, nothing dropped, nothing produced that is not trained on)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import yaml
import zmq

from helpers import EXAMPLES, read_summary, run_tianji
from tianji.control.spec import SpecError, parse_job

PPO = EXAMPLES / "cartpole-ppo.yaml"


def _doc(**spec) -> dict:
    doc = yaml.safe_load(PPO.read_text())
    for path, value in spec.items():
        node = doc["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return doc


def test_auto_is_the_default_relaxed_for_the_example_and_strict_has_lag_zero():
    assert parse_job(_doc()).spec.dependencies == "auto" and parse_job(_doc()).spec.dependency_mode == "relaxed"
    assert parse_job(_doc()).spec.max_policy_lag == 3  # the example's bound
    strict = parse_job(_doc(dependencies="strict")).spec
    assert strict.dependencies == "strict" and strict.max_policy_lag == 0


@pytest.mark.parametrize("bad, says", [
    ({"dependencies": "lockstep"}, "dependencies"),
    ({"dependencies": "strict", "algorithm": {"name": "dqn"}}, "ppo"),
    ({"dependencies": "strict", "topology": "auto"}, "topology: auto"),
    ({"dependencies": "strict", "staleness.publishEvery": 2}, "publishEvery"),
    ({"dependencies": "strict", "topology.actors": 3}, "split evenly"),  # a batch is 2 fragments
    ({"dependencies": "strict", "topology.actors": 2, "topology.buffers": 2}, "buffers == learners"),
    ({"dependencies": "strict", "topology.groups": 2, "topology.groupSync.mode": "average"}, "allreduce"),
])
def test_strict_refuses_what_cannot_close_a_round(bad, says):
    with pytest.raises(SpecError, match=says):
        parse_job(_doc(**bad), "job.yaml")


# ----------------------------------------------------------------- the actor waits
def _strict_actor(tmp_path):
    from tianji.control.contracts.addressing import Addresses
    from tianji.runtime.roles.actor import Actor

    doc = _doc(dependencies="strict")
    doc["spec"]["network"] = {"encryption": "none"}
    job = parse_job(doc)
    actor = Actor(job, 0, 0, Addresses(job.name, 5550, tmp_path))
    actor.setup()
    return job, actor


def _stopped_after(actor, seconds: float):
    """Run one actor.step(), with a stop signal after `seconds` (as SIGTERM would set it)."""
    timer = threading.Timer(seconds, lambda: setattr(actor, "stopping", True))
    timer.start()
    try:
        actor.step()
    finally:
        timer.cancel()
        actor.stopping = False


def test_a_strict_actor_rolls_out_once_per_new_policy(tmp_path):
    from tianji.algos.models import state_arrays
    from tianji.runtime.wire import decode, encode

    job, actor = _strict_actor(tmp_path)
    ctx = zmq.Context()
    pub, pull = ctx.socket(zmq.PUB), ctx.socket(zmq.PULL)
    (tmp_path / "sock").mkdir(exist_ok=True)
    pub.bind(actor.addrs.bind("params", 0, 0))
    pull.bind(actor.addrs.bind("fragments", 0, 0))
    arrays = state_arrays(actor.model)
    frame = actor.rollout.n * actor.rollout.T

    seq = iter(range(1, 10_000))  # a learner numbers its messages (a repeated number is a replay)

    def publish(version: int) -> None:
        pub.send_multipart(encode("params", job.name, "learner-0-0", next(seq), version, arrays, {"frames": 0}))

    def fragments() -> list:
        out = []
        while pull.poll(500):
            out.append(decode(pull.recv_multipart(copy=False), job=job.name))
        return out

    try:
        assert actor.rollout_fragments == 1  # a batch of 2 fragments over 2 actors
        _stopped_after(actor, 0.5)  # no policy from the learner yet: nothing rolled out
        assert actor.metrics.counts["env_frames_total"] == 0
        for _ in range(50):  # the learner's first publish (repeated until the subscription is up)
            publish(0)
            actor.probe_params()
            if actor.fresh_policy:
                break
            actor.sub.poll(100)
        actor.step()
        sent = fragments()
        assert [m.policy_version for m in sent] == [0] and actor.metrics.counts["env_frames_total"] == frame
        publish(0)  # the learner's periodic republish of the same version: not a new policy
        _stopped_after(actor, 0.8)
        assert actor.metrics.counts["env_frames_total"] == frame and not fragments()
        publish(1)  # the learner trained on the round: one more rollout, with version 1
        actor.step()
        assert [m.policy_version for m in fragments()] == [1]
        assert actor.metrics.counts["env_frames_total"] == 2 * frame
        assert actor.metrics.counts["policy_wait_seconds_total"] > 0
        assert actor.metrics.counts["strict_resends_total"] == 0
    finally:
        ctx.destroy(linger=0)
        actor.teardown()
        actor.ctx.destroy(linger=0)


# ----------------------------------------------------------------- a whole run
def test_a_strict_run_trains_on_every_rollout_at_lag_zero(tmp_path):
    run = tmp_path / "run"
    r = run_tianji("run", str(PPO), "--run-dir", str(run), "--quiet", "--set", "spec.dependencies=strict",
                   "--set", "spec.stop.envFrames=5120", "--set", "spec.stop.seconds=240", timeout=400)
    s = read_summary(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert s["exit_reason"] == "frames" and s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}
    hist = {k: v for k, v in s["policy_lag_hist"].items() if v}
    assert s["policy_lag"]["max"] == 0 and list(hist) == ["0"], s["policy_lag_hist"]
    assert not s["dropped_samples"]
    batch = 256
    # every round: 2 actors x 1 fragment of 128 samples = one batch, one version. A round in flight when
    # the run stopped may be produced but not yet trained on: at most one batch between the two counts.
    consumed = hist["0"]
    assert consumed == s["policy_version"] * batch and consumed >= 5120 - batch
    assert 0 <= s["env_frames"] - consumed <= batch
    assert np.isclose(s["replay_ratio"], 1.0, atol=0.1)


def test_auto_runs_a_job_of_heavy_versions_strict_and_says_so(tmp_path):
    """16 epochs of 16 minibatches: 256 optimizer steps a version, so `dependencies: auto` (the
    default) runs the example strict once its own lag bound is unset: the console says why,
    summary.json says what ran, and the learner trains at lag 0 on every rollout."""
    run = tmp_path / "run"
    r = run_tianji("run", str(PPO), "--run-dir", str(run), "--quiet", "--set", "spec.algorithm.epochs=16",
                   "--set", "spec.algorithm.minibatchSize=16", "--set", "spec.staleness.maxPolicyLag=null",
                   "--set", "spec.stop.envFrames=2048",
                   "--set", "spec.stop.seconds=240", timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tianji: note: dependencies: auto runs this job strict: a policy version is 256 optimizer steps" in r.stderr
    s = read_summary(run)
    assert s["dependencies"] == "strict" and s["exit_reason"] == "frames", s
    assert s["policy_lag"]["max"] == 0 and not s["dropped_samples"] and s["policy_version"] >= 7, s
    relaxed = tmp_path / "relaxed"
    r = run_tianji("run", str(PPO), "--run-dir", str(relaxed), "--quiet", "--set", "spec.stop.envFrames=2048",
                   "--set", "spec.stop.seconds=240", timeout=400)
    assert r.returncode == 0 and "dependencies: auto" not in r.stderr, r.stderr[-2000:]
    assert read_summary(relaxed)["dependencies"] == "relaxed"  # the example: 12 steps a version
