"""Zero trust inside a job (docs/security.md): each forgery an insider can try with another process's
key, against real roles over real CURVE sockets. Each must be refused and counted by its reason."""
import os
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

import hostile
from helpers import EXAMPLES, wait_for
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
def test_a_duplicate_a_regression_or_a_number_from_the_future_is_a_replay():
    g = SeqGuard()
    t = now_us()
    g.accept("actor-0-0", t)
    for bad in (t, t - 1):
        with pytest.raises(WireError, match="already accepted") as e:
            g.accept("actor-0-0", bad)
        assert e.value.reason == "replay"
    with pytest.raises(WireError, match="ahead of this clock"):
        g.accept("actor-0-0", now_us() + int(2 * MAX_AHEAD_S * 1e6))
    g.accept("actor-0-0", t + 1)  # refused numbers did not block the sender
    g.accept("actor-0-1", t - 5)  # each sender has its own numbering


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
    fresh = worker_report("j", "learner", 0, 0, incarnation="new", version=1)
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


def test_the_learner_trains_only_on_batches_its_buffer_sent_once(job_keys):
    from tianji.runtime.roles.learner import Learner

    job, rings, role, insider = job_keys
    learner = role(Learner, "learner-0-0")
    try:
        as_actor = insider("actor-0-0", "learner-0-0", "batches")
        as_buffer = insider("buffer-0-0", "learner-0-0", "batches")
        send(as_actor, hostile.batch_msg())  # an actor's key claiming buffer-0-0
        send(as_actor, hostile.batch_msg(sender="actor-0-0"))  # an actor as itself
        good = encode("batch", hostile.JOB, "buffer-0-0", now_us(), 0, hostile.batch(), {"buffer": 0})
        send(as_buffer, good, times=3)
        got = run_until(learner, {"sender": 1, "role": 1, "replay": 2}, timeout=120)
        assert got == {"sender": 1, "role": 1, "replay": 2}, got
        wait_for(lambda: learner.step() or learner.version >= 1, 60, "the one update")
        assert learner.version == 1 and learner.consumed == int(hostile.batch()["valid"].sum())
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
        Curve(None, security.read_keyring(la.keys_dir / "actor-0-0.json")).client(push, security.LAUNCHER)
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


def test_a_target_without_a_checkpoint_of_a_trained_policy_is_no_target(tmp_path):
    la = launcher_with_keys(tmp_path)
    la.acc.take(parse_report(worker_report(hostile.JOB, "learner", 0, 0, version=0), hostile.JOB))
    reason = la._verdict("target")
    s = la.summary(reason, 1.0)
    assert reason == "error" and s["exit_reason"] == "error" and s["reached_target"] is False
    assert "no checkpoint of a trained policy" in s["error"] and s["target_checkpoint"] is None
    la = launcher_with_keys(tmp_path / "b")
    rep = worker_report(hostile.JOB, "learner", 0, 0, version=7)
    rep["extra"]["checkpoint"] = "ckpt-000007.pt"
    la.acc.take(parse_report(rep, hostile.JOB))
    la.target_reached_at = 1.0
    la.acc.cross_target(475.0, 1.0, 1000, 476.0)  # what _drain records as the mean meets the rule
    s = la.summary(la._verdict("target"), 2.0)
    assert s["exit_reason"] == "target" and s["reached_target"] is True
    assert (s["target_checkpoint"], s["target_policy_version"]) == ("ckpt-000007.pt", 7)


def test_each_process_gets_its_own_key_file_readable_only_by_its_user(tmp_path):
    la = launcher_with_keys(tmp_path)
    files = sorted(p.name for p in la.keys_dir.iterdir())
    assert files == sorted(f"{c.name}.json" for c in la.children)  # the launcher's own stays in memory
    assert oct(os.stat(la.keys_dir).st_mode & 0o777) == "0o700"
    secrets = set()
    for p in la.keys_dir.iterdir():
        assert os.stat(p).st_mode & 0o077 == 0
        ring = security.read_keyring(p)
        assert ring.identity == p.stem and set(ring.peers) == {c.name for c in la.children} | {security.LAUNCHER}
        secrets.add(ring.keys.secret)
    assert len(secrets) == len(files)
    assert Path(la.run_dir / "curve.json").exists() is False  # no job-wide key any more


# ------------------------------------------------------------------ live runs (agent training: slow)
def _insider_sockets(ctx, rd, ring) -> dict:
    from helpers import ipc

    out = {}
    for name, peer, channel in (("reports", security.LAUNCHER, "report"), ("credits", "buffer-0-0", "credits"),
                                ("batches", "learner-0-0", "batches"), ("fragments", "buffer-0-0", "fragments")):
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 5000)
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
    ring = security.read_keyring(rd / "keys" / "actor-0-0.json")
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
    assert by["sender"] == 10 and by["launcher_report"] == 11, by
    assert 3999 <= by["replay"] <= 4000 and set(by) == {"sender", "launcher_report", "replay"}, by
    assert s["reached_target"] and s["exit_reason"] == "target" and s["mean_return_at_target"] >= 475, s
    assert 0 < s["target_policy_version"] < 10 ** 6 and s["target_checkpoint"], s
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
    assert first["reached_target"] and first["mean_return"] >= 150, first
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
