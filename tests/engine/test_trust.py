"""Zero trust inside a job (docs/security.md): each forgery an insider can try with another process's
key, against real roles over real CURVE sockets. Each must be refused and counted by its reason."""
import json
import os
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

import hostile
from helpers import EXAMPLES, exported_keys, wait_for
from kube.fakes import worker_report
from tianji.control.contracts.accounting import Accounting, StopRule
from tianji.control.contracts.addressing import Addresses
from tianji.control.contracts.rolereport import parse_report
from tianji.control.spec import StopConfig, load_job
from tianji.envs import check_env_spec, spaces_of
from tianji.runtime import security
from tianji.runtime.replayguard import MAX_AHEAD_S, SeqGuard, now_us
from tianji.runtime.validate import MAX_POLICY_VERSION
from tianji.runtime.wire import MAX_META_ITEMS, WireError, decode, encode

PPO = EXAMPLES / "cartpole-ppo.yaml"
NAMES = ["learner-0-0", "buffer-0-0", "actor-0-0", "actor-0-1", "actor-1-0", security.LAUNCHER]


# ------------------------------------------------------------------ units
def test_a_duplicate_or_a_regression_is_a_replay_and_only_a_shared_key_has_a_clock_bound():
    g = SeqGuard()
    t = now_us()
    g.accept("actor-0-0", t)
    for bad in (t, t - 1):
        with pytest.raises(WireError, match="already accepted") as e:
            g.accept("actor-0-0", bad)
        assert e.value.reason == "replay"
    with pytest.raises(WireError, match="ahead of this clock"):  # a name spoken with a role key
        g.accept("actor-0-0", now_us() + int(2 * MAX_AHEAD_S * 1e6))
    g.accept("actor-0-0", t + 1)  # refused numbers did not block the sender
    g.accept("actor-0-1", t - 5)  # each sender has its own numbering
    # a process with a key of its own: no window anyone could move; far ahead locks out only itself
    g.accept("actor-0-2", 2 ** 62, exclusive=True)
    with pytest.raises(WireError, match="already accepted"):
        g.accept("actor-0-2", now_us(), exclusive=True)
    g.accept("actor-0-1", now_us())


def test_a_key_covers_its_own_process_or_every_instance_of_its_role_and_nothing_else():
    assert security.covers("actor-0-1", "actor-0-1") and not security.covers("actor-0-1", "actor-0-0")
    assert security.covers("actor", "actor-3-7") and not security.covers("actor", "learner-0-0")
    assert not security.covers("actor", "actorx-0-0") and not security.covers(None, "actor-0-0")
    assert not security.covers("learner-0-0", "learner-0-00")


def test_unknown_header_fields_and_huge_meta_maps_are_refused():
    frames = encode("fragment", "j", "actor-0-0", 1, 0, None, {"frames": 1})
    h = msgpack.unpackb(frames[0])
    h["admin"] = True
    with pytest.raises(WireError, match="unknown header fields") as e:
        decode([msgpack.packb(h)], job="j")
    assert e.value.reason == "header"
    for meta in ({f"{i:x}": 1 for i in range(10_000)}, {"a": [[1] * 1000] * 3}):
        with pytest.raises(WireError, match=f"more than {MAX_META_ITEMS}") as e:
            decode(encode("report", "j", "actor-0-0", 1, 0, None, meta), job="j")
        assert e.value.reason == "meta"


def test_a_learner_that_starts_over_starts_the_episode_window_over():
    acc = Accounting()
    rule = StopRule(StopConfig(mean_return=475))
    acc.take(parse_report(worker_report("j", "learner", 0, 0, incarnation="old", version=50), "j"))
    acc.take(parse_report(worker_report("j", "actor", 0, 0, episodes=[500.0] * 100), "j"))
    assert rule.target_reached(acc)
    state = acc.state()
    # a new learner incarnation without a checkpoint: the 100 returns were not its policy's
    fresh = worker_report("j", "learner", 0, 0, incarnation="new", version=1, checkpoint="")
    fresh["started"] += 100.0
    acc.take(parse_report(fresh, "j"))
    assert acc.window == [] and not rule.target_reached(acc) and acc.episodes_total == 100
    late = worker_report("j", "actor", 0, 0, seq=2, episodes=[500.0] * 101)  # finished before the restart
    acc.take(parse_report(late, "j"))
    assert acc.window == []
    again = Accounting(acc.state())  # persisted (the operator keeps it in the status)
    assert again.window_since == acc.window_since > 0
    resumed = Accounting(state)  # a learner resumed from its checkpoint keeps the window
    ckpt = worker_report("j", "learner", 0, 0, incarnation="resumed", version=50)
    ckpt["extra"]["checkpoint"] = "ckpt-000050.pt"
    ckpt["started"] += 100.0
    resumed.take(parse_report(ckpt, "j"))
    assert len(resumed.window) == 100 and rule.target_reached(resumed)


# ------------------------------------------------------------------ real roles over real sockets
@pytest.fixture
def job_keys(tmp_path, monkeypatch):
    """The cartpole-ppo job, a keyring per process under tmp_path/keys, short socket folder."""
    job = load_job(PPO)
    job.spec.env.spaces = spaces_of(check_env_spec(job.spec.env, str(PPO), "ppo"))
    sock = tempfile.mkdtemp(prefix="tj-")
    monkeypatch.setenv("TIANJI_SOCK_DIR", sock)
    (tmp_path / "keys").mkdir()
    rings = security.issue(NAMES)
    for n, r in rings.items():
        security.write_keyring(tmp_path / "keys" / f"{n}.json", r)
    ctx = zmq.Context()
    socks = []

    def role(cls, name):
        monkeypatch.setenv("TIANJI_CURVE_KEYS", str(tmp_path / "keys" / f"{name}.json"))
        _, g, i = name.split("-")
        r = cls(job, int(g), int(i), Addresses(job.name, run_dir=tmp_path), run_dir=str(tmp_path))
        r.setup()
        return r

    def insider(identity, peer, channel, kind=zmq.PUSH):
        """A socket holding `identity`'s keyring (as a compromised process has), connected to peer's socket."""
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        security.Curve(None, rings[identity]).client(s, peer)
        s.connect(f"ipc://{sock}/{peer}-{channel}")
        socks.append(s)
        return s

    yield job, rings, role, insider
    ctx.destroy(linger=0)


def run_until(role, reasons: dict, timeout: float = 30.0) -> dict:
    """Step `role` until it counted at least `reasons` rejects; its reject counts."""
    def done():
        role.step()
        got = role.metrics.reasons.get("messages_rejected_total", {})
        return all(got.get(k, 0) >= v for k, v in reasons.items())
    wait_for(done, timeout, f"{reasons} rejected", interval=0)
    for _ in range(5):  # and nothing more arrives
        role.step()
    return dict(role.metrics.reasons["messages_rejected_total"])


def send(sock, frames, times: int = 1) -> None:
    for _ in range(times):
        wait_for(lambda: _try_send(sock, frames), 10, "the peer to take a message", interval=0.01)


def _try_send(sock, frames) -> bool:
    try:
        sock.send_multipart(frames, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def fragment(sender="actor-0-0", seq=None, pv=0):
    return encode("fragment", hostile.JOB, sender, now_us() if seq is None else seq, pv, hostile.fragment(),
                  {"frames": hostile.T * hostile.N})


def credit(sender="learner-0-0", pv=0, seq=None, **meta):
    return encode("credit", hostile.JOB, sender, now_us() if seq is None else seq, pv, None, {"grant": 1, **meta})


def test_the_buffer_takes_credits_only_from_its_learner_and_fragments_once(job_keys):
    """Forged 'learner' credits (10^12, stale), a credit from an actor as itself, a fragment from another
    group's actor, a replayed fragment."""
    from tianji.runtime.roles.buffer import Buffer

    job, rings, role, insider = job_keys
    buf = role(Buffer, "buffer-0-0")
    try:
        actor_credits = insider("actor-0-0", "buffer-0-0", "credits")
        learner_credits = insider("learner-0-0", "buffer-0-0", "credits")
        frags = insider("actor-0-0", "buffer-0-0", "fragments")
        send(actor_credits, credit(pv=10 ** 12))  # an actor's key speaking as the learner
        send(actor_credits, credit(sender="actor-0-0"))  # an actor as itself: no role to send credits
        send(learner_credits, credit(pv=5, reset=True))
        run_until(buf, {"sender": 1, "role": 1})
        send(insider("actor-1-0", "buffer-0-0", "fragments"), fragment(sender="actor-1-0"))  # another group's
        run_until(buf, {"sender": 2})
        assert buf.learner_version == 5 and buf.version_high == 5
        send(learner_credits, credit(pv=MAX_POLICY_VERSION + 1))  # even from the learner: out of bounds
        send(learner_credits, credit(pv=3))  # stale: a learner's versions only grow
        one = fragment(pv=5)
        send(frags, one, times=50)  # the same fragment again and again
        got = run_until(buf, {"version": 2, "replay": 49})
        assert got == {"sender": 2, "role": 1, "version": 2, "replay": 49}, got
        assert buf.learner_version == 5 and buf.version_high == 5
        assert buf.metrics.counts["samples_received_total"] == hostile.T * hostile.N  # counted once
        assert buf.feedback["fragments"] == 1
    finally:
        buf.ctx.destroy(linger=0)


def test_a_flooding_actor_drops_only_its_own_fragments_and_batches_take_turns(job_keys):
    """actor-0-0 floods 100 valid, fresh fragments; actor-0-1 sends 3. The flooder holds at most its
    share of the queue (64 / 2 senders), dropping its own oldest (over_share, counted as its own);
    the other's 3 all wait, and a batch takes the newest of each sender in turn."""
    from tianji.runtime.roles.buffer import Buffer

    job, rings, role, insider = job_keys
    buf = role(Buffer, "buffer-0-0")
    ctx = zmq.Context()
    try:
        learner = ctx.socket(zmq.PULL)  # where the buffer's batches go, as learner-0-0
        learner.setsockopt(zmq.LINGER, 0)
        security.Curve(ctx, rings["learner-0-0"]).server(learner)
        learner.bind(f"ipc://{os.environ['TIANJI_SOCK_DIR']}/learner-0-0-batches")
        flood, other = insider("actor-0-0", "buffer-0-0", "fragments"), insider("actor-0-1", "buffer-0-0", "fragments")
        for k in range(100):
            send(flood, fragment())
            if k % 30 == 0:
                send(other, fragment(sender="actor-0-1"))
        wait_for(lambda: buf.step() or buf.metrics.counts.get("samples_received_total", 0) >= 104 * 128, 60,
                 "every fragment")
        share = job.spec.staleness.queue_fragments // 2
        assert len(buf.queue.q["actor-0-0"]) == share and len(buf.queue.q["actor-0-1"]) == 4
        assert dict(buf.over_share) == {"actor-0-0": (100 - share) * hostile.T * hostile.N}
        assert buf.metrics.reasons["samples_dropped_total"] == {"over_share": (100 - share) * hostile.T * hostile.N}
        assert buf.report()["extra"]["over_share"] == {"actor-0-0": (100 - share) * hostile.T * hostile.N}
        send(insider("learner-0-0", "buffer-0-0", "credits"), credit(grant=1, reset=True))
        wait_for(lambda: buf.step() or learner.poll(0), 30, "a batch")
        assert len(buf.queue.q["actor-0-0"]) == share - 1 and len(buf.queue.q["actor-0-1"]) == 3  # one each
    finally:
        ctx.destroy(linger=0)
        buf.ctx.destroy(linger=0)


def test_sequence_and_version_skew_lock_out_no_one_else(job_keys):
    """actor-0-0's key: a fragment as actor-0-1 numbered a day ahead is refused (sender) and moves
    nothing; as itself numbered 2^61 it locks out only itself; actor-0-1 goes on. Versions: at
    most the learner's announced version + slack (2 updates); beyond that refused (version)."""
    from tianji.runtime.roles.buffer import Buffer

    job, rings, role, insider = job_keys
    buf = role(Buffer, "buffer-0-0")
    try:
        evil, honest = insider("actor-0-0", "buffer-0-0", "fragments"), insider("actor-0-1", "buffer-0-0", "fragments")
        send(insider("learner-0-0", "buffer-0-0", "credits"), credit(pv=5, grant=0, reset=True))  # no batch yet
        wait_for(lambda: buf.step() or buf.version_high == 5, 30, "the learner's version")
        send(evil, fragment(sender="actor-0-1", seq=now_us() + 86_400 * 10 ** 6, pv=5))
        send(evil, fragment(seq=2 ** 61, pv=5))
        send(evil, fragment(pv=5))  # its own honest numbering is now behind: its own loss
        got = run_until(buf, {"sender": 1, "replay": 1})
        for pv in (5, 7):  # the learner's version, and 2 updates ahead (parameters published after one)
            send(honest, fragment(sender="actor-0-1", pv=pv))
        send(honest, fragment(sender="actor-0-1", pv=8))
        send(honest, fragment(sender="actor-0-1", pv=1005))
        got = run_until(buf, {"sender": 1, "replay": 1, "version": 2})
        assert got == {"sender": 1, "replay": 1, "version": 2}, got
        assert len(buf.queue.q["actor-0-1"]) == 2 and len(buf.queue.q["actor-0-0"]) == 1
        assert buf.seqs.last["actor-0-0"] == 2 ** 61 and buf.seqs.last["actor-0-1"] < now_us()
    finally:
        buf.ctx.destroy(linger=0)


def test_the_learner_trains_only_on_batches_its_buffer_sent_once(job_keys):
    from tianji.runtime.roles.learner import Learner

    job, rings, role, insider = job_keys
    learner = role(Learner, "learner-0-0")
    try:
        as_actor = insider("actor-0-0", "learner-0-0", "batches")
        as_buffer = insider("buffer-0-0", "learner-0-0", "batches")
        send(as_actor, hostile.batch_msg())  # an actor's key claiming buffer-0-0
        send(as_actor, hostile.batch_msg(sender="actor-0-0"))  # an actor as itself
        ahead = hostile.batch()
        ahead["versions"][:3] = 1  # tagged with a version this learner (at 0) never published
        send(as_buffer, encode("batch", hostile.JOB, "buffer-0-0", now_us(), 0, ahead, {"buffer": 0}))
        good = encode("batch", hostile.JOB, "buffer-0-0", now_us(), 0, hostile.batch(), {"buffer": 0})
        send(as_buffer, good, times=3)
        got = run_until(learner, {"sender": 1, "role": 1, "replay": 2}, timeout=120)
        assert got == {"sender": 1, "role": 1, "replay": 2}, got
        wait_for(lambda: learner.step() or learner.version >= 2, 60, "the two updates")
        n = int(hostile.batch()["valid"].sum())
        assert learner.version == 2 and learner.consumed == n + n * 5 // 8
        assert learner.metrics.reasons["samples_dropped_total"] == {"ahead": n * 3 // 8}
        assert learner.metrics.lag["min"] >= 0  # no sample with a negative lag was counted
    finally:
        learner.ctx.destroy(linger=0)


def test_a_process_rebinding_the_parameter_socket_is_never_heard(job_keys, tmp_path):
    """An actor's key bound where learner-0-0 publishes: a follower pinned to the learner's key
    fails the handshake, so the forged parameters (version 900001) never reach it."""
    from tianji.algos.models import state_arrays
    from tianji.runtime.roles.actor import Actor

    job, rings, role, insider = job_keys
    ctx = zmq.Context()
    evil = ctx.socket(zmq.PUB)
    try:
        evil.setsockopt(zmq.LINGER, 0)
        curve = security.Curve(ctx, rings["actor-0-1"])
        curve.server(evil)
        evil.bind(f"ipc://{os.environ['TIANJI_SOCK_DIR']}/learner-0-0-params")
        actor = role(Actor, "actor-0-0")
        try:
            forged = {k: np.asarray(v) for k, v in state_arrays(actor.model).items()}
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                evil.send_multipart(encode("params", hostile.JOB, "learner-0-0", now_us(), 900_001, forged, {}))
                actor.probe_params()
                time.sleep(0.05)
            assert actor.version == 0 and not actor.metrics.reasons.get("messages_rejected_total")
            evil.close()  # the learner's own key at the same path is heard (the check above can fail)
            real = ctx.socket(zmq.PUB)
            real.setsockopt(zmq.LINGER, 0)
            learner = rings["learner-0-0"].keys  # (the context's ZAP handler admits every key of the job)
            real.curve_secretkey, real.curve_publickey, real.curve_server = learner.secret, learner.public, True
            real.bind(f"ipc://{os.environ['TIANJI_SOCK_DIR']}/learner-0-0-params")

            def heard():
                real.send_multipart(encode("params", hostile.JOB, "learner-0-0", now_us(), 7, forged, {}))
                actor.probe_params()
                return actor.version == 7
            wait_for(heard, 30, "the learner's parameters", interval=0.05)
        finally:
            actor.teardown()
            actor.ctx.destroy(linger=0)
    finally:
        curve.close()
        ctx.destroy(linger=0)


def launcher_with_keys(tmp_path):
    from tianji.local.launcher import Launcher

    job = load_job(PPO)
    return Launcher(job, tmp_path / "run", progress=False)


def test_the_launcher_takes_a_report_only_from_the_process_it_is_about(tmp_path):
    """A forged report (an actor's key, another actor's pid and name, mean 500) is refused, so is one
    with a pid that is none of the process's incarnations, and a replayed one."""
    from tianji.runtime.security import Curve

    la = launcher_with_keys(tmp_path)
    ctx = zmq.Context()
    try:
        server = Curve(ctx, la.rings[security.LAUNCHER])
        pull = ctx.socket(zmq.PULL)
        server.server(pull)
        pull.bind(la.report_addr)
        push = ctx.socket(zmq.PUSH)
        Curve(None, la.rings["actor-0-0"]).client(push, security.LAUNCHER)
        push.connect(la.report_addr)
        by = {c.name: c for c in la.children}
        by["actor-0-0"].pids.add(111)
        by["actor-0-1"].pids.add(222)

        def report(name, pid, seq):
            role, g, i = name.split("-")
            rep = worker_report(hostile.JOB, role, int(g), int(i), episodes=[500.0] * 100)
            rep["pid"] = pid
            return encode("report", hostile.JOB, name, seq, 0, None, rep)

        t = now_us()
        for frames, reason in ((report("actor-0-1", 222, t), "with another process's key"),
                               (report("actor-0-0", 333, t + 1), "report from pid 333"),
                               (report("actor-0-0", 111, t + 2), None),
                               (report("actor-0-0", 111, t + 2), "already accepted")):
            push.send_multipart(frames)
            got = pull.recv_multipart(copy=False)
            if reason is None:
                assert la._report(got).key == ("actor", 0, 0)
                continue
            with pytest.raises(WireError, match=reason):
                la._report(got)
    finally:
        server.close()
        ctx.destroy(linger=0)


def test_a_target_needs_the_saved_policys_evaluation(tmp_path):
    """Actor returns met the rule, but no evaluation of a checkpoint passed: an error, not a target.
    With a passing evaluation the summary names its checkpoint, version and evaluation."""
    la = launcher_with_keys(tmp_path)
    rep = worker_report(hostile.JOB, "learner", 0, 0, version=7)
    rep["extra"]["checkpoint"] = "ckpt-000000000007.pt"
    la.acc.take(parse_report(rep, hostile.JOB))
    reason = la._verdict("target")
    s = la.summary(reason, 1.0)
    assert reason == "error" and s["exit_reason"] == "error" and s["reached_target"] is False
    assert "no checkpoint of a trained policy" in s["error"] and s["target_checkpoint"] is None
    assert s["target_evaluation"] is None and s["target_checks"]["count"] == 0
    la = launcher_with_keys(tmp_path / "b")
    la.acc.take(parse_report(rep, hostile.JOB))
    passed = {"checkpoint": "ckpt-000000000006.pt", "policy_version": 6, "episodes": 100, "mean_return": 480.0}
    la.target_check.passed = passed
    la.target_check.checks.append(passed)
    la.target_reached_at = 1.0
    la.acc.cross_target(475.0, 1.0, 1000, 476.0)  # what _cross_target records as the evaluation passes
    s = la.summary(la._verdict("target"), 2.0)
    assert s["exit_reason"] == "target" and s["reached_target"] is True
    assert (s["target_checkpoint"], s["target_policy_version"]) == ("ckpt-000000000006.pt", 6)
    assert s["target_evaluation"] == passed and s["target_checks"]["count"] == 1


def test_no_secret_key_is_written_anywhere_and_each_process_has_its_own(tmp_path, monkeypatch):
    """The launcher keeps every keyring in memory; the run dir holds public keys only. A worker's
    keyring is an anonymous descriptor (memfd), read once and closed, its variable removed."""
    monkeypatch.delenv("TIANJI_TEST_EXPORT_KEYS", raising=False)
    (tmp_path / "run" / "keys").mkdir(parents=True)
    (tmp_path / "run" / "keys" / "actor-0-0.json").write_text("{}")  # an older version's key file
    la = launcher_with_keys(tmp_path)
    assert not (la.run_dir / "keys").exists()
    pub = json.loads((la.run_dir / "public-keys.json").read_text())["peers"]
    assert set(pub) == {c.name for c in la.children} | {security.LAUNCHER}
    assert len({r.keys.secret for r in la.rings.values()}) == len(la.rings)  # one key pair each
    secrets = {r.keys.secret.decode() for r in la.rings.values()}
    for p in la.run_dir.rglob("*"):
        if p.is_file():
            assert not any(x in p.read_text(errors="replace") for x in secrets), p
    fd = security.keyring_fd(la.rings["actor-0-1"])
    assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:tianji-keyring")  # no path to open
    monkeypatch.setenv("TIANJI_CURVE_KEYS_FD", str(fd))
    curve = security.from_env(zmq.Context.instance(), required=True)
    assert curve.ring == la.rings["actor-0-1"] and "TIANJI_CURVE_KEYS_FD" not in os.environ
    with pytest.raises(OSError):
        os.fstat(fd)  # read once, closed


def test_episodes_an_env_cannot_produce_are_refused():
    from tianji.runtime.validate import episode_bounds

    b = episode_bounds(load_job(PPO).spec.env)  # CartPole-v1: 500 steps, reward 0..1 a step
    assert (b.max_steps, b.reward_low, b.reward_high) == (500, 0.0, 1.0)
    assert b.problem(500.0, 500) is None and b.problem(37.0, 37) is None
    assert "10 steps" in b.problem(500.0, 10) and "outside 1..500" in b.problem(600.0, 600)
    assert b.problem(-1.0, 5) is not None and b.problem(float("nan"), 5) is not None
    from tianji.control.contracts import episodes

    assert episodes.without_gym(load_job(PPO).spec.env) == b  # the operator's bounds: the same
    declared = load_job(PPO, ["spec.env.episodeBounds.maxSteps=100"]).spec.env
    assert episode_bounds(declared).max_steps == 100 == episodes.without_gym(declared).max_steps


def test_the_launcher_refuses_a_report_with_impossible_returns(tmp_path):
    la = launcher_with_keys(tmp_path)
    ctx = zmq.Context()
    try:
        server = security.Curve(ctx, la.rings[security.LAUNCHER])
        pull = ctx.socket(zmq.PULL)
        server.server(pull)
        pull.bind(la.report_addr)
        push = ctx.socket(zmq.PUSH)
        security.Curve(None, la.rings["actor-0-0"]).client(push, security.LAUNCHER)
        push.connect(la.report_addr)
        la._by_key[("actor", 0, 0)].pids.add(111)
        rep = worker_report(hostile.JOB, "actor", 0, 0, episodes=[500.0] * 100)
        rep.update(pid=111, recent=[[time.time(), 500.0, 10]] * 100)  # 500 in 10 steps of CartPole
        push.send_multipart(encode("report", hostile.JOB, "actor-0-0", now_us(), 0, None, rep))
        with pytest.raises(WireError, match="10 steps") as e:
            la._report(pull.recv_multipart(copy=False))
        assert e.value.reason == "return"
    finally:
        server.close()
        ctx.destroy(linger=0)


# ------------------------------------------------------------------ live runs (agent training: slow)
def _insider_sockets(ctx, rd, ring) -> dict:
    from helpers import ipc

    out = {}
    for name, peer, channel in (("reports", security.LAUNCHER, "report"), ("credits", "buffer-0-0", "credits"),
                                ("batches", "learner-0-0", "batches"), ("fragments", "buffer-0-0", "fragments")):
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 5000)
        s.setsockopt(zmq.SNDTIMEO, 20_000)  # a run that ended leaves a PUSH with no peer: fail, not hang
        security.Curve(None, ring).client(s, peer)
        s.connect(ipc(rd, f"{peer}-{channel}"))
        out[name] = s
    return out


def _forged_report(rd, name: str, seq: int, **extra) -> list:
    from helpers import pid_of

    role, g, i = name.split("-")
    rep = worker_report(hostile.JOB, role, int(g), int(i), episodes=[500.0] * 100, incarnation="forged")
    rep.update(pid=pid_of(rd, role, int(i)), started=time.time(), time=time.time())
    rep["extra"].update(extra)
    return encode("report", hostile.JOB, name, seq, 0, None, rep)


@pytest.mark.slow
def test_an_insider_with_an_actors_key_forges_every_message_and_the_run_still_reaches_its_target(running_tianji):
    """The issue's forgeries, each with actor-0-0's keys: reports as another actor (mean 500) and as the
    learner, 'learner' credits at version 10^12, 'buffer' batches, one valid fragment sent 4,000 times.
    Each is refused and counted; the run reaches its real target with a finite model."""
    from test_hostile import finite_checkpoints

    run = running_tianji(str(PPO), "--set", "spec.checkpoint.intervalSeconds=5")
    run.wait_for_frames(0)
    rd = run.run_dir
    ring = security.read_keyring(exported_keys(rd) / "actor-0-0.json")  # what actor-0-0 holds
    ctx = zmq.Context()
    try:
        s = _insider_sockets(ctx, rd, ring)
        t = now_us()
        for k in range(10):
            s["reports"].send_multipart(_forged_report(rd, "actor-0-1", t + k))
        s["reports"].send_multipart(_forged_report(rd, "learner-0-0", t + 10, version=10 ** 6,
                                                   checkpoint="ckpt-1000000.pt"))
        for _ in range(5):
            s["credits"].send_multipart(credit(pv=10 ** 12))
            s["batches"].send_multipart(hostile.batch_msg())
        one = fragment()
        for _ in range(4000):
            s["fragments"].send_multipart(one)
        wait_for(lambda: (last_record_of(rd).get("rejected") or 0) >= 11 + 10 + 3999, 120,
                 "the forgeries to be counted")
    finally:
        ctx.destroy(linger=0)
    assert run.wait(timeout=900) == 0, run.output()[-3000:]
    s = run.summary()
    by = s["rejected_by_reason"]
    assert by["sender"] == 10 and by["launcher_sender"] == 11, by
    # 3999 or 4000 copies refused; and actor-0-0's own key moved its numbering (replayguard: a sender
    # with a key of its own can only lock itself out): the honest fragments it had numbered before the
    # first copy and that arrive after it are refused too, at most what the sockets hold (HWM 8 each side)
    assert 3999 <= by["replay"] <= 4000 + 2 * 8 and set(by) == {"sender", "launcher_sender", "replay"}, by
    assert s["reached_target"] and s["exit_reason"] == "target", s
    assert 0 < s["target_policy_version"] < 10 ** 6 and s["target_checkpoint"], s
    ev = s["target_evaluation"]  # the saved policy's own episodes met the target
    assert ev["mean_return"] >= 475 and ev["episodes"] == 100 and ev["checkpoint"] == s["target_checkpoint"], ev
    assert s["restarts"] == {"actor": 0, "buffer": 0, "learner": 0}
    assert "1000000000000" not in (rd / "accounting.json").read_text()
    finite_checkpoints(rd)


def last_record_of(rd) -> dict:
    from helpers import last_record

    return last_record(rd) or {}


@pytest.mark.slow
def test_a_resumed_run_whose_learner_starts_over_cannot_claim_the_previous_runs_target(running_tianji):
    """All checkpoints truncated, then --resume: the learner starts from scratch, so the previous
    launch's returns (mean >= 150) no longer count; the resumed run does not 'reach' 150 at once."""
    run = running_tianji(str(PPO), "--set", "spec.stop.meanReturn=150", "--set", "spec.checkpoint.intervalSeconds=5")
    assert run.wait(timeout=600) == 0, run.output()[-3000:]
    first = run.summary()
    # The saved policy's evaluation met it (the actors' own window may dip while it runs).
    assert first["reached_target"] and first["target_evaluation"]["mean_return"] >= 150, first
    ckpts = list((run.run_dir / "checkpoints" / "0-0").glob("ckpt-*.pt"))
    assert ckpts
    for p in ckpts:
        p.write_bytes(p.read_bytes()[:100])  # truncated: unusable
    from helpers import run_tianji

    # the resumed learner cannot learn (lr 1e-12): a target now could only be the previous launch's returns
    r = run_tianji("run", "--resume", str(run.run_dir), "--quiet", "--set", "spec.stop.seconds=25",
                   "--set", "spec.algorithm.lr=1e-12", timeout=300)
    s = json_summary(run.run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert s["exit_reason"] == "seconds" and s["reached_target"] is False, s
    assert any("starting from scratch" in w for w in s["warnings"]), s
    assert s["target_checkpoint"] is None and s["seconds_to_target"] is None


def json_summary(rd) -> dict:
    import json

    return json.loads((Path(rd) / "summary.json").read_text())


def test_the_target_check_evaluates_only_the_bytes_the_learner_reported(tmp_path, capsys):
    """A checkpoint file rewritten after the learner reported its digest is not evaluated (the check
    gives up and waits for a newer policy); an evaluation's output is data, checked field by field."""
    from types import SimpleNamespace

    from tianji.local.targetcheck import TargetCheck, _result

    job = load_job(PPO)
    (tmp_path / "checkpoints" / "0-0").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "checkpoints" / "0-0" / "ckpt-000000000003.pt").write_bytes(b"a policy someone else trained")
    rep = worker_report(hostile.JOB, "learner", 0, 0, version=3)
    rep["extra"].update(checkpoint="ckpt-000000000003.pt", checkpoint_sha256="0" * 64)
    acc = SimpleNamespace(procs={("learner", 0, 0): parse_report(rep, hostile.JOB)})
    tc = TargetCheck(job, tmp_path, dict(os.environ))
    try:
        assert tc.ready(0.0, 3)
        tc.trigger(0.0, 3, [])
        assert tc.poll(1.0, acc) is None and not tc.busy and tc.running is None and tc.checks == []
        assert "SHA-256 differs" in capsys.readouterr().err
        assert not tc.ready(5.0, 3) and not tc.ready(20.0, 3) and tc.ready(20.0, 4)  # a newer policy, RETRY_S later
    finally:
        tc.close()
    for out, code in ((b"", 0), (b"{}", 0), (b'{"mean_return": NaN}', 0), (b"x", 1)):
        with pytest.raises(ValueError):
            _result(out, code)
