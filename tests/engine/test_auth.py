"""Only the job's own processes can talk to it: CurveZMQ with a key pair per process, ZAP refusing
every other key (and counting the refusals), on every socket (the launcher's report socket
included); a connecting socket pins its peer's key, so even an insider cannot take over a socket."""
import json
import os
import stat
import time
from pathlib import Path

import zmq

import hostile
from helpers import EXAMPLES, exported_keys, ipc, last_record, pid_of, wait_for
from tianji.control.contracts.rolereport import build_report
from tianji.runtime.security import Curve, Keyring, new_keys, read_keyring
from tianji.runtime.wire import encode

PPO = str(EXAMPLES / "cartpole-ppo.yaml")


def test_strangers_are_refused_by_zap_and_cannot_hijack_the_parameter_socket(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000", "--set", "spec.stop.seconds=300")
    run.wait_for_frames(0)
    rd = run.run_dir
    assert not (rd / "keys").exists()  # no keyring file: each worker inherits its own on a descriptor
    assert stat.S_IMODE(os.stat(os.path.realpath(rd / "sock")).st_mode) == 0o700
    peers = {n: k.encode() for n, k in json.loads((rd / "public-keys.json").read_text())["peers"].items()}
    ctx = zmq.Context()
    socks = []
    insider = None
    try:
        # 1. valid-looking messages from no key and from a wrong key: ZAP refuses the connection
        for keys in (None, new_keys()):
            for path, frames in (("buffer-0-0-fragments", hostile.frag_msg()),
                                 ("buffer-0-0-credits", encode("credit", hostile.JOB, "learner-0-0", 0, 10**9,
                                                               None, {"grant": 1})),
                                 ("learner-0-0-batches", hostile.batch_msg()),
                                 ("launcher-report", encode("report", hostile.JOB, "actor-0-0", 0, 0, None,
                                                            forged_report()))):
                s = ctx.socket(zmq.PUSH)
                socks.append(s)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDTIMEO, 500)
                if keys is not None:
                    Curve(None, Keyring("stranger", keys, peers)).client(s, path.rsplit("-", 1)[0])
                s.connect(ipc(rd, path))
                for _ in range(20):
                    try:
                        s.send_multipart(frames)
                    except zmq.Again:
                        break
        # 2. an insider (actor-0-1's keys) replaces the parameter socket file; a restarted actor-0-0
        # connects to it, but it pinned learner-0-0's key: the handshake fails, nothing arrives
        pub = ctx.socket(zmq.PUB)
        socks.append(pub)
        pub.setsockopt(zmq.LINGER, 0)
        insider = Curve(ctx, read_keyring(exported_keys(rd) / "actor-0-1.json"))  # what actor-0-1 holds
        insider.server(pub)
        params_path = Path(os.path.realpath(rd / "sock")) / "learner-0-0-params"
        wait_for(lambda: last_record(rd)["policy_version"] > 0, 120, "the learner to train")
        params_path.unlink()
        pub.bind(f"ipc://{params_path}")
        os.kill(pid_of(rd, "actor", 0), 9)
        wait_for(lambda: last_record(rd)["restarts"]["actor"] >= 1, 30, "the actor restart")
        forged = {k: v * 0 + 1e3 for k, v in learner_like_params().items()}
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            pub.send_multipart(encode("params", hostile.JOB, "learner-0-0", 0, 777_777_777, forged,
                                      {"capacity_sps": 6e8}))
            time.sleep(0.05)
        frames = run.frames()
        run.wait_for_frames(frames + 5000)
    finally:
        if insider is not None:
            insider.close()
        ctx.destroy(linger=0)
    assert run.interrupt() == 130
    s = run.summary()
    # nothing got as far as validation; each refused handshake was counted
    assert set(s["rejected_by_reason"]) == {"handshake", "launcher_handshake"}, s
    assert s["rejected_by_reason"]["handshake"] >= 3, s  # one per worker socket
    # the report socket's: the wrong key (no key fails before ZAP)
    assert s["rejected_by_reason"]["launcher_handshake"] >= 1, s
    assert not s["reached_target"] and s["policy_lag"]["min"] >= 0
    procs = json.loads((rd / "accounting.json").read_text())
    assert "777777777" not in json.dumps(procs)  # no actor ever took the forged version


def forged_report() -> dict:
    now = time.time()
    return build_report(job=hostile.JOB, role="actor", group=0, index=0, incarnation="x", pid=os.getpid(),
                        started=now, seq=1, time=now, final=False,
                        snapshot={"counts": {"episodes_total": 100}, "reasons": {}, "gauges": {}, "lag": {}},
                        episodes_total=100, recent=[(now, 500.0)] * 100, extra={})


def learner_like_params() -> dict:
    from tianji.algos.models import build_model, state_arrays
    from tianji.control.spec import load_job
    from tianji.envs import EnvInfo

    job = load_job(PPO)
    return state_arrays(build_model("ppo", job.spec.model, EnvInfo((4,), "float32", 2), 1))
