"""A compromised actor can poison only itself (docs/security.md), on live `tianji run`s over real
CURVE sockets: what code inside one actor can reach (its own keyring, every file of the user
under the run dir, the other processes' command lines and environments) and what it can do with
it (false returns, a flood of valid fragments, numbering and version skew)."""
import contextlib
import json
import os
import re
import time
from pathlib import Path

import zmq

import hostile
from helpers import EXAMPLES, exported_keys, ipc, pid_of, wait_for
from kube.fakes import worker_report
from tianji.local.runfiles import last_record as last_complete_record
from tianji.runtime import security
from tianji.runtime.replayguard import now_us
from tianji.runtime.wire import encode

PPO = str(EXAMPLES / "cartpole-ppo.yaml")
Z85_TOKEN = re.compile(rb"(?<![0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#])[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}"
                       rb"(?![0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#])")


def _children(pid: int) -> list[int]:
    """The launcher's children: its workers (it is their subreaper) and the worker template."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _readable(run_dir: Path, pids: list[int]) -> list[tuple[str, bytes]]:
    """Everything an actor of the run can read without ptrace: every regular file under the run dir
    and its socket folder, and each process's command line, environment and open regular files."""
    paths = [p for root in (run_dir, Path(os.path.realpath(run_dir / "sock")))
             for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    for pid in pids:
        paths += [Path(f"/proc/{pid}/cmdline"), Path(f"/proc/{pid}/environ")]
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        paths += [fd for fd in fds if os.path.isfile(fd)]  # (pipes and sockets block or mean nothing)
    out = []
    for p in paths:
        try:
            out.append((str(p), p.read_bytes()))
        except OSError:
            continue
    return out


def _secrets_in(files, publics: set[bytes]) -> list[str]:
    """Where a CURVE secret key of one of `publics` appears."""
    found = []
    for name, data in files:
        for tok in set(Z85_TOKEN.findall(data)):
            try:
                if zmq.curve_public(tok) in publics:
                    found.append(name)
            except (zmq.ZMQError, ValueError):
                continue
    return found


def test_an_actor_can_read_no_other_process_secret_key_and_none_outlives_the_run(running_tianji):
    run = running_tianji(PPO, "--set", "spec.stop.meanReturn=100000", "--set", "spec.stop.seconds=300",
                         export_keys=False)
    run.wait_for_frames(0)
    rd = run.run_dir
    publics = {k.encode() for k in json.loads((rd / "public-keys.json").read_text())["peers"].values()}
    pids = _children(run.proc.pid) + [run.proc.pid]
    assert len(pids) >= 5  # learner, buffer, two actors, the worker template, the launcher
    files = _readable(rd, pids)
    assert not _secrets_in(files, publics)
    assert any(name.endswith("public-keys.json") for name, _ in files)  # the scan saw the run dir
    for pid in pids:  # each worker read its keyring descriptor and closed it; nobody else had one
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir() if os.path.islink(fd)]
        assert not [x for x in links if "tianji-keyring" in x], (pid, links)
    assert not exported_keys(rd).exists()
    assert run.interrupt() == 130
    assert not _secrets_in(_readable(rd, []), publics)  # nothing secret stayed on disk


def _sockets(ctx, rd, ring) -> dict:
    out = {}
    for name, peer, channel in (("reports", security.LAUNCHER, "report"), ("fragments", "buffer-0-0", "fragments")):
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 2000)
        s.setsockopt(zmq.SNDHWM, 1000)  # a deeper queue would hold the flood until it is stale
        s.setsockopt(zmq.SNDTIMEO, 20_000)  # a run that ended leaves a PUSH with no peer: fail, not hang
        security.Curve(None, ring).client(s, peer)
        s.connect(ipc(rd, f"{peer}-{channel}"))
        out[name] = s
    return out


def _claim(rd, length: int) -> list:
    """actor-0-0's report as a new incarnation of it (its real pid) claiming 100 episodes of 500."""
    rep = worker_report(hostile.JOB, "actor", 0, 0, episodes=[500.0] * 100, incarnation=f"forged-{length}")
    now = time.time()
    rep.update(pid=pid_of(rd, "actor", 0), started=now, time=now, recent=[[now, 500.0, length]] * 100)
    return encode("report", hostile.JOB, "actor-0-0", now_us(), 0, None, rep)


def _fragment(sender: str, pv: int, seq=None) -> list:
    return encode("fragment", hostile.JOB, sender, now_us() if seq is None else seq, pv, hostile.fragment(),
                  {"frames": hostile.T * hostile.N})


def last_record(rd) -> dict:
    """The newest complete metrics.jsonl record (the launcher may be writing the next one)."""
    return last_complete_record(Path(rd) / "metrics.jsonl") or {}


def _sent(rd, name: str) -> float:
    return last_record(rd).get("processes", {}).get(name, {}).get("sent", 0.0)


def test_a_hostile_actor_poisons_only_itself(running_tianji):
    """With actor-0-0's own keyring: impossible returns (refused), possible-looking false returns (they
    trigger an evaluation of the saved policy, which does not meet the target: training goes on), a
    flood of valid fresh fragments (only its own are dropped: over_share; actor-0-1's keep flowing),
    a fragment as actor-0-1 numbered a day ahead (refused), one tagged 1000 versions ahead (refused),
    a stranger's handshake at the launcher (counted). The run does not end at a target on the claim,
    and no consumed sample has a negative lag."""
    # The claim must be false for the whole test: at CartPole's own learning rate the honest actor-0-1
    # can solve it within the flood (~10 s), the evaluation the claim triggers then passes, the run
    # ends and the buffer's socket goes with it. A learning rate of 1e-7 keeps the policy near random
    # while versions still advance; the frame budget is out of reach, so only the interrupt ends it.
    run = running_tianji(PPO, "--set", "spec.stop.seconds=600", "--set", "spec.algorithm.lr=1e-7",
                         "--set", "spec.stop.envFrames=1000000000")
    rd = run.run_dir
    wait_for(lambda: last_record(rd).get("policy_version", 0) > 0, 120, "a trained policy")
    ring = security.read_keyring(exported_keys(rd) / "actor-0-0.json")
    ctx = zmq.Context()
    try:
        s = _sockets(ctx, rd, ring)
        s["reports"].send_multipart(_claim(rd, 10))  # 500 in 10 CartPole steps: impossible
        s["reports"].send_multipart(_claim(rd, 500))  # 500 in 500 steps: possible, and false
        version = last_record(rd)["policy_version"]
        s["fragments"].send_multipart(_fragment("actor-0-1", version, seq=now_us() + 86_400 * 10 ** 6))
        # Numbered 5 s ahead: the honest actor-0-0 sends a fragment every few milliseconds, and one it
        # numbered after this was made but delivered first would make this a replay, refused before
        # its version is looked at. Refused for its version, it advances nothing.
        s["fragments"].send_multipart(_fragment("actor-0-0", version + 1000, seq=now_us() + 5 * 10 ** 6))
        stranger = ctx.socket(zmq.PUSH)
        stranger.setsockopt(zmq.LINGER, 0)
        security.Curve(None, security.Keyring("stranger", security.new_keys(), ring.peers)).client(
            stranger, security.LAUNCHER)
        stranger.connect(ipc(rd, "launcher-report"))  # the handshake is what the launcher refuses and counts
        with contextlib.suppress(zmq.Again):  # refused before the send: the pipe is gone already
            stranger.send_multipart(_claim(rd, 500), zmq.NOBLOCK)
        other_before = _sent(rd, "actor-0-1")
        # Numbered an hour ahead: actor-0-0's key is its own, so the flood owns its numbering (the
        # honest process is locked out) and no flood fragment is a replay of one it sent meanwhile.
        seq = now_us() + 3600 * 10 ** 6
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:  # as fast as one socket goes, tagged with a current version
            # (+1: the record is up to a second old; the buffer admits versions up to 2 ahead)
            version = last_record(rd).get("policy_version", version)
            for _ in range(50):
                seq += 1
                s["fragments"].send_multipart(_fragment("actor-0-0", version + 1, seq=seq))
        wait_for(lambda: _sent(rd, "actor-0-1") > other_before + 4 * hostile.T * hostile.N, 60,
                 "actor-0-1's fragments during the flood")
    finally:
        ctx.destroy(linger=0)
    wait_for(lambda: "not the target yet" in run.output(), 300, "the evaluation the false claim triggered")
    assert run.interrupt() == 130, run.output()[-3000:]
    s = run.summary()
    assert s["exit_reason"] == "interrupted" and not s["reached_target"] and s["target_evaluation"] is None, s
    checks = s["target_checks"]
    assert checks["count"] >= 1 and checks["last"]["mean_return"] < 475, checks  # the claim only triggered it
    by = s["rejected_by_reason"]
    assert by["launcher_return"] >= 1 and by["sender"] >= 1 and by["version"] >= 1, by
    assert by["launcher_handshake"] >= 1, by
    over = s["dropped_over_share_by_sender"]
    assert set(over) == {"actor-0-0"} and over["actor-0-0"] > 0, (over, s["dropped_samples"], s["rejected_by_reason"])
    assert s["dropped_samples"]["over_share"] == over["actor-0-0"], s["dropped_samples"]
    assert s["policy_lag"]["min"] >= 0, s["policy_lag"]
