"""Roles keep reporting through long waits of their own: a long update or a long pacing rest must
not read as a hung process. On a loaded 2-core box a Pong PPO update (4 epochs of a Nature CNN)
outlasted the launcher's 30 s heartbeat timeout, so the learner was killed before its first
version, again and again; once it trained, actors paced to it were killed while resting."""
import contextlib
import time

import numpy as np
import pytest
import zmq

from helpers import EXAMPLES
from tianji.algos.dqn import DQNLearner
from tianji.algos.models import build_model
from tianji.algos.ppo import PPOLearner
from tianji.control.contracts.addressing import Addresses
from tianji.control.contracts.rolereport import parse_report
from tianji.control.spec import DQNConfig, ModelConfig, load_job
from tianji.envs import EnvInfo
from tianji.runtime import security
from tianji.runtime.roles.learner import Learner
from tianji.runtime.wire import Message, decode

INFO = EnvInfo((4,), "float32", 2)
PROCESSES = ("learner-0-0", "buffer-0-0", "actor-0-0", "actor-0-1", security.LAUNCHER)


def own_keyring(tmp_path, monkeypatch, name: str) -> None:
    """This process's keyring among the example job's processes, as the launcher issues them."""
    rings = security.issue(PROCESSES)
    security.write_keyring(tmp_path / f"{name}.json", rings[name])
    monkeypatch.setenv("TIANJI_CURVE_KEYS", str(tmp_path / f"{name}.json"))


def ppo_batch(T=32, B=8):
    rng = np.random.default_rng(0)
    return {"obs": rng.standard_normal((T, B, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, (T, B)).astype(np.int64), "logp": np.full((T, B), -0.69, np.float32),
            "rewards": np.ones((T, B), np.float32), "dones": np.zeros((T, B), bool),
            "terminated": np.zeros((T, B), bool), "valid": np.ones((T, B), bool),
            "last_obs": rng.standard_normal((B, 4)).astype(np.float32), "versions": np.zeros(B, np.int64)}


def test_updates_tick_after_every_gradient_step():
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.algorithm.epochs=3", "spec.algorithm.minibatchSize=64"])
    ticks = []
    ppo = PPOLearner(build_model(job.spec.algorithm, job.spec.model, INFO, 0), job.spec.algorithm, 0)
    out = ppo.update(ppo_batch(), tick=lambda: ticks.append(1))
    assert len(ticks) == out["train_steps"] == 3 * (256 // 64)
    cfg = DQNConfig(batch_size=16, steps_per_batch=5)
    dqn = DQNLearner(build_model("dqn", ModelConfig(hidden=[16]), INFO, 0), cfg, 0)
    ticks.clear()
    rng = np.random.default_rng(1)
    out = dqn.update({"obs": rng.standard_normal((80, 4)).astype(np.float32),
                      "next_obs": rng.standard_normal((80, 4)).astype(np.float32),
                      "actions": rng.integers(0, 2, 80), "returns": np.ones(80, np.float32),
                      "discounts": np.full(80, 0.99, np.float32)}, tick=lambda: ticks.append(1))
    assert len(ticks) == out["train_steps"] == 5


def _report_to_test(role, tmp_path) -> tuple[zmq.Context, zmq.Socket]:
    """The role's reports go to a PULL socket of the test (plain: the launcher's socket is local)."""
    ctx = zmq.Context()
    reports = ctx.socket(zmq.PULL)
    addr = f"ipc://{tmp_path}/reports"
    reports.bind(addr)
    role._report_sock = role.ctx.socket(zmq.PUSH)
    role._report_sock.connect(addr)
    return ctx, reports


def test_a_learner_reports_during_a_long_update(tmp_path, monkeypatch):
    import tianji.algos.ppo as ppo_module

    real = ppo_module.apply_gradients

    def slow(*a, **kw):  # a gradient step on a very busy machine
        time.sleep(0.25)
        return real(*a, **kw)

    monkeypatch.setattr(ppo_module, "apply_gradients", slow)
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.algorithm.epochs=8"])
    own_keyring(tmp_path, monkeypatch, "learner-0-0")
    learner = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), report=None, run_dir=str(tmp_path))
    ctx, reports = _report_to_test(learner, tmp_path)
    try:
        learner.setup()
        while reports.poll(200):  # what setup sent
            reports.recv_multipart()
        learner._last_report = time.monotonic()
        learner._batch(Message("batch", "buffer-0-0", arrays=ppo_batch(), meta={"buffer": 0}))  # 8 steps, ~2 s
        seen = []
        while reports.poll(200):
            seen.append(parse_report(decode(reports.recv_multipart(), job=job.name).meta, job.name))
        during = [r for r in seen if r.extra["version"] == 0]  # sent before the update finished
        assert len(during) >= 2, [r.extra for r in seen]
        assert learner.version == 1
    finally:
        learner.teardown()
        learner.ctx.destroy(linger=0)
        ctx.destroy(linger=0)


@contextlib.contextmanager
def example_actor(tmp_path, monkeypatch):
    """actor-0-0 of the example job, set up, its reports to the test's socket: (job, actor, reports)."""
    from tianji.runtime.roles.actor import Actor

    job = load_job(EXAMPLES / "cartpole-ppo.yaml")
    own_keyring(tmp_path, monkeypatch, "actor-0-0")
    actor = Actor(job, 0, 0, Addresses(job.name, run_dir=tmp_path), report=None, run_dir=str(tmp_path))
    ctx, reports = _report_to_test(actor, tmp_path)
    try:
        actor.setup()
        yield job, actor, reports
    finally:
        actor.teardown()
        actor.ctx.destroy(linger=0)
        ctx.destroy(linger=0)


def test_an_actor_resting_for_pacing_keeps_reporting(tmp_path, monkeypatch):
    """Paced to a slow learner, an actor's rest after one fragment can be longer than the heartbeat
    timeout (Pong at load 10: actors were restarted as hung)."""
    with example_actor(tmp_path, monkeypatch) as (job, actor, reports):
        actor._last_report = time.monotonic()
        actor.pacer.set_rate(1.0)  # one frame a second: a fragment of 128 frames is owed for 128 s
        actor.pacer.add(128)
        actor._rest(min(actor.pacer.wait_time(), 1.6))
        seen = []
        while reports.poll(200):
            seen.append(parse_report(decode(reports.recv_multipart(), job=job.name).meta, job.name))
        assert len(seen) >= 2, seen


def test_the_lr_anneals_over_frames_trained_on_not_frames_received(tmp_path, monkeypatch):
    """A re-created learner pod without a checkpoint: its buffer's first batch counts every fragment
    received while no learner trained (here 500k frames, past lrAnnealFrames 400k), and under load
    buffers drop much of what they receive. The lr follows the frames trained on: full after that
    first batch, lower after each update, and a learner that resumes keeps its place."""
    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.algorithm.epochs=1"])
    own_keyring(tmp_path, monkeypatch, "learner-0-0")
    learner = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), report=None, run_dir=str(tmp_path))
    backlog = 500_000 // (job.spec.env.num_envs * job.spec.env.fragment_length)
    lr, anneal, batch = job.spec.algorithm.lr, job.spec.algorithm.lr_anneal_frames, job.spec.algorithm.batch_size
    try:
        learner.setup()
        learner._batch(Message("batch", "buffer-0-0", arrays=ppo_batch(), meta={"buffer": 0, "fragments": backlog}))
        learner._batch(Message("batch", "buffer-0-0", arrays=ppo_batch(), meta={"buffer": 0, "fragments": 2}))
        assert learner.frames > anneal  # received, and advertised to actors (DQN's epsilon follows it)
        assert learner.algo._lr() == pytest.approx(lr * (1 - 2 * batch / anneal))
        learner.save_checkpoint()
    finally:
        learner.teardown()
        learner.ctx.destroy(linger=0)
    again = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), report=None, run_dir=str(tmp_path))
    try:
        again.setup()  # resumes from the checkpoint just written
        assert again.frames == learner.frames and again.algo.samples_seen == 2 * batch
        assert again.algo._lr() == pytest.approx(learner.algo._lr())
    finally:
        again.teardown()
        again.ctx.destroy(linger=0)


def test_a_fragment_its_buffer_refused_spends_the_version_quota(tmp_path, monkeypatch):
    """A buffer pod re-created: every push is refused (the queue to the gone peer is full). What an
    actor produces is spent against its version's share all the same, so while no new version
    comes it rests instead of free-running at the token bucket's rate (3.4x the frames, all dropped,
    in a cluster test)."""
    with example_actor(tmp_path, monkeypatch) as (_, actor, _):
        actor.pacer.set_rate(None)  # no token bucket: only the quota holds the actor back
        frag = actor.rollout.n * actor.rollout.T
        for _ in range(64):  # fill the queue to the buffer that is not there
            actor._fragment()
        assert actor.metrics.reasons["samples_dropped_total"].get("hwm", 0) > 0
        actor.learner_paced, actor.capacity = True, 1.0  # a slow learner: its next version is minutes away
        actor.quota.new_version(time.monotonic())
        before = actor.metrics.counts["env_frames_total"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            actor.step()
        produced = actor.metrics.counts["env_frames_total"] - before
        assert produced == actor.quota.depth * actor.quota.share * frag, (produced, actor.quota.share, frag)


def test_a_learner_checkpoints_every_interval_versions_as_well_as_by_time(tmp_path, monkeypatch):
    """A force-deleted learner resumes from its last checkpoint: with checkpoints by versions as well
    as by time it loses at most intervalVersions of training, however fast versions come."""
    from tianji.runtime import checkpoint

    job = load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.algorithm.epochs=1", "spec.checkpoint.intervalVersions=3",
                                                    "spec.checkpoint.intervalSeconds=3600"])
    own_keyring(tmp_path, monkeypatch, "learner-0-0")
    learner = Learner(job, 0, 0, Addresses(job.name, run_dir=tmp_path), report=None, run_dir=str(tmp_path))
    try:
        learner.setup()
        saved = []
        for _ in range(7):
            batch = {**ppo_batch(), "versions": np.full(8, learner.version, np.int64)}  # fresh: never stale
            learner._batch(Message("batch", "buffer-0-0", arrays=batch, meta={"buffer": 0, "fragments": 2}))
            if learner._checkpoint_due(time.monotonic()):
                learner.save_checkpoint()
                saved.append(learner.version)
        assert saved == [3, 6], saved
        newest = checkpoint.list_checkpoints(learner.ckpt_dir)[-1]
        assert "6" in newest.name, newest
    finally:
        learner.ckpt_dir = None  # no checkpoint on teardown: the test looks at the interval's only
        learner.teardown()
        learner.ctx.destroy(linger=0)
