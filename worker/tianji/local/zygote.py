"""A pre-imported worker template for local runs: torch is imported once, then forked.

Each `tianji worker` process spends 1.5-2 s of CPU importing torch, Gymnasium
and NumPy; `tianji run` starts four or more of them at once, on a 2-core
machine that is 4-5 s before the first frame. The zygote is one process
(`python -m tianji.local.zygote`) that imports all of that once, with no
thread running (OpenBLAS is held to one thread, torch's pools start at first
use), and then forks a worker per request. The forked worker runs the same
entry point as a spawned one, `tianji.runtime.worker.main(...)` (`tianji worker`): pods and
local processes still start the same way, only the imports are shared.

Each worker stays the launcher's own child, so supervision is unchanged: the
launcher is a child subreaper (PR_SET_CHILD_SUBREAPER), the zygote forks
twice and the intermediate exits, so the worker is re-parented to the launcher,
which waits for it, signals it and sees its exit status like any subprocess.
The worker then sets PR_SET_PDEATHSIG against the launcher (worker.die_with_parent),
calls setsid (its own session, as start_new_session) and writes its log file.
Its command line (/proc/PID/cmdline, what `ps` shows) is rewritten in place to
the worker's argv, in the room the zygote's padded argv leaves.

Jobs whose learner has a GPU spawn their workers: a driver initialised before
fork (torch may probe CUDA while importing) is unusable in the child.

Protocol, one JSON line each way: {"argv", "env", "log"[, "fd_env"]} -> {"pid"} or {"error"}.
With "fd_env" the launcher has first passed one descriptor (the worker's CurveZMQ keyring,
runtime/security.keyring_fd) over a Unix socket beside the pipe (SCM_RIGHTS): the worker
inherits it and learns its number from the variable `fd_env`; the zygote never reads it and
closes its copy once it has forked, and every worker closes the socket first thing, so no
worker can receive another's descriptor and no secret is ever in the zygote's memory (which
every worker it forks would share). The zygote exits at end of input (the launcher closed
the pipe) or with the launcher (PDEATHSIG).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

from tianji.local.cpulimits import join_self
from tianji.local.isolation import Creds, drop

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
TITLE_ROOM = 4096  # bytes of argv the zygote is started with: a forked worker's command line goes there
REPARENT_TIMEOUT_S = 5.0
ENV_DISABLE = "TIANJI_ZYGOTE"  # "0": spawn each worker as its own process (imports torch every time)
ENV_FD_CHANNEL = "TIANJI_ZYGOTE_FDS"  # the zygote's end of the socket descriptors come over
# Not torch._dynamo (~800 modules, 1.2 s of CPU before any worker forked): the learners' optimizer
# (tianji.algos.adam) never imports it.
PRELOAD = ("numpy", "zmq", "torch", "gymnasium", "msgpack", "tianji.runtime.worker",
           "tianji.runtime.roles.actor", "tianji.runtime.roles.buffer", "tianji.runtime.roles.learner")


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(ENV_DISABLE, "1").strip() not in ("0", "false", "no")


def set_subreaper(on: bool) -> None:
    _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


# ------------------------------------------------------------------ launcher side
class ForkedProc:
    """The launcher's handle on a forked worker (its re-parented child): the subset of
    subprocess.Popen the launcher uses (pid, poll, wait, kill, send_signal, returncode)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None

    def _reap(self, flags: int) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            self.returncode = -255
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: Optional[float] = None) -> int:
        if timeout is None:
            return self._reap(0)
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid that was already reaped (and may be reused)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """Starts the template process and asks it for workers. The caller must be a child
    subreaper (set_subreaper) for the workers to become its children."""

    def __init__(self, env: dict[str, str], log_path: str):
        self.fds, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**env, "OPENBLAS_NUM_THREADS": "1", ENV_FD_CHANNEL: str(theirs.fileno())}  # no BLAS pool at fork
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "tianji.local.zygote", "--title-room=" + "-" * TITLE_ROOM],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True,
                    pass_fds=(theirs.fileno(),))
        except BaseException:
            self.fds.close()
            raise
        finally:
            theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str,
              fd: Optional[tuple[str, int]] = None, creds=None, cgroup: Optional[str] = None) -> ForkedProc:
        """Fork a worker running `tianji worker` (argv: ["worker", ...]); blocks until the zygote has imported
        everything (first call only) and forked. `fd`: (variable, descriptor) the worker inherits, its
        number in the worker in that variable; `creds` (local/isolation.Creds): the uid and gid it
        runs as (None: the zygote's); `cgroup`: the cgroup.procs file it joins first (local/cpulimits.py).
        Raises OSError when the zygote is gone."""
        doc = {"argv": argv, "env": env, "log": log_path, "cgroup": cgroup}
        if creds is not None:
            doc["creds"] = [creds.uid, creds.gid]
        try:
            if fd is not None:
                doc["fd_env"] = fd[0]
                socket.send_fds(self.fds, [b"f"], [fd[1]])
            self.proc.stdin.write((json.dumps(doc) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, ConnectionError, ValueError) as e:
            raise OSError(f"zygote gone: {e}") from None
        if not line:
            raise OSError(f"zygote exited ({self.proc.poll()})")
        reply = json.loads(line)
        if "pid" not in reply:
            raise OSError(f"zygote: {reply.get('error')}")
        return ForkedProc(int(reply["pid"]))

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.fds.close()


# ------------------------------------------------------------------ the zygote process
def _set_cmdline(argv: list[str]) -> None:
    """Rewrite /proc/self/cmdline (NUL-separated, what ps and pgrep read) within the original argv area."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5) fields 48, 49)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    data = b"\0".join(a.encode() for a in argv)[:room - 1]
    ctypes.memmove(start, data + b"\0" * (room - len(data)), room)


def _child(req: dict, launcher: int, channel: Optional[int]) -> None:
    """The worker, after the second fork: never returns."""
    rc = 1
    try:
        if channel is not None:  # other workers' descriptors come over it: never this worker's to read
            os.close(channel)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        join_self(req.get("cgroup"))  # its CPU bound, while still root (local/cpulimits.py)
        if req.get("creds"):  # its role's uid, before anything else runs (local/isolation.py)
            drop(Creds(*req["creds"]))
        deadline = time.monotonic() + REPARENT_TIMEOUT_S
        while os.getppid() != launcher and time.monotonic() < deadline:  # the intermediate is exiting
            time.sleep(0.001)
        os.environ.clear()
        os.environ.update(req["env"])
        argv = [str(a) for a in req["argv"]]
        sys.argv = [sys.executable, "-m", "tianji.cli", *argv]
        _set_cmdline(sys.argv)
        if argv[:1] != ["worker"]:
            raise ValueError(f"the worker template runs `tianji worker` only, not {argv[:1]}")
        from tianji.runtime.worker import main

        rc = main(argv[1:])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - report it in the worker's log, exit non-zero
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def _fork_worker(req: dict, launcher: int, channel: Optional[int] = None) -> int:
    """Double fork; returns the worker's pid once the intermediate has exited (the worker
    is then the launcher's child)."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _child(req, launcher, channel)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(mid, 0)
    if not data:
        raise OSError("fork failed")
    return int(data)


def serve() -> int:
    launcher = int(os.environ.get("TIANJI_PARENT_PID") or os.getppid())
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    # Not inspectable: code injected into the template would run in every worker forked after
    # (a restarted learner's too). Its workers inherit it.
    _prctl(PR_SET_DUMPABLE, 0)
    if os.getppid() != launcher:
        return 1
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # fork copies only this thread: a pool alive now would be broken in the workers
        print(f"tianji zygote: {threads} threads alive after imports", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    channel = int(os.environ.pop(ENV_FD_CHANNEL)) if os.environ.get(ENV_FD_CHANNEL) else None
    for line in sys.stdin.buffer:
        fd = None
        try:
            req = json.loads(line)
            if req.get("fd_env"):
                fd = _receive_fd(channel)
                req["env"][str(req["fd_env"])] = str(fd)
            reply = {"pid": _fork_worker(req, launcher, channel)}
        except Exception as e:  # noqa: BLE001 - the launcher falls back to spawning
            reply = {"error": f"{type(e).__name__}: {e}"}
        finally:
            if fd is not None:  # the worker has its copy; the zygote keeps none
                os.close(fd)
        out.write((json.dumps(reply) + "\n").encode())
        out.flush()
    return 0


def _receive_fd(channel: Optional[int]) -> int:
    """The one descriptor the launcher sent ahead of a request (never read here)."""
    if channel is None:
        raise OSError("no descriptor channel")
    with socket.socket(fileno=os.dup(channel)) as s:
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
    if len(fds) != 1:
        raise OSError("the launcher's descriptor did not arrive")
    return fds[0]


if __name__ == "__main__":
    sys.exit(serve())
