"""Role isolation for a launcher that runs as root: each role's processes run under a uid of their
own, without any capability.

A worker otherwise runs as the launcher's user. Non-dumpable processes keep another process of
the same unprivileged user out of their memory, but root (CAP_SYS_PTRACE, CAP_DAC_OVERRIDE)
reads any process's memory and any file. So a launcher started as root (a container's default)
runs its workers as

    learner  BASE+0    buffer  BASE+1    actor  BASE+2    evaluator  BASE+3
    the confirming evaluation (tianji.local.targetcheck)  BASE+4

all in group BASE and no other, with umask 022 (ipc sockets are made 0660 as they are bound).
BASE is TIANJI_ROLE_UIDS (default 64200); TIANJI_ROLE_UIDS=off turns isolation off. The uids
need no account; a uid or the group that belongs to an account is not used (isolation is then
off, and the launcher says why).

What each role may write is its own: the socket folder is root's, group BASE, mode 1770
(sticky: nobody removes or replaces another's socket); `checkpoints/` belongs to the buffers
(their replay snapshots) and `checkpoints/G-I/` to learner G-I; `<run dir>/home/<role>` (its
HOME) to its role. Everything else of the run is root's, readable.

Before any worker starts, a probe forked with the actor's credentials checks that it reaches
what every worker reads: the run dir, the job file, the working directory, each sys.path entry
and each module the env imports. Where it cannot (a run dir under /root, mode 0700), the run
goes on without isolation and the launcher says which path failed.
"""
from __future__ import annotations

import grp
import importlib.util
import os
import pwd
import select
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ENV_ROLE_UIDS = "TIANJI_ROLE_UIDS"
DEFAULT_BASE = 64200
ROLES = ("learner", "buffer", "actor", "evaluator", "confirm")
UMASK = 0o022
HOME = "home"  # <run dir>/home/<role>
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Creds:
    uid: int
    gid: int

    def popen(self) -> dict:
        """subprocess.Popen's arguments that start a process with these credentials."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [self.gid], "umask": UMASK}


def drop(creds: Optional[Creds]) -> None:
    """This process becomes `creds` (a forked worker, before it runs anything else): one group, no
    capability left (setresuid away from uid 0 clears them all)."""
    if creds is None:
        return
    os.setgroups([creds.gid])
    os.setresgid(creds.gid, creds.gid, creds.gid)
    os.setresuid(creds.uid, creds.uid, creds.uid)
    os.umask(UMASK)


@dataclass(frozen=True)
class RoleUids:
    base: int

    def creds(self, role: str) -> Creds:
        return Creds(self.base + ROLES.index(role), self.base)

    def home(self, run_dir: Path, role: str) -> Path:
        return run_dir / HOME / role


def _base(env) -> tuple[Optional[int], Optional[str]]:
    text = (env.get(ENV_ROLE_UIDS) or "").strip().lower()
    if text in ("off", "0", "no", "false"):
        return None, f"{ENV_ROLE_UIDS}={text}"
    if not text:
        return DEFAULT_BASE, None
    if not text.isdigit() or not 1000 <= int(text) <= 2**31 - len(ROLES) - 1:
        return None, f"{ENV_ROLE_UIDS}={text!r} is not a uid from 1000 (or off)"
    return int(text), None


def _taken(base: int) -> Optional[str]:
    for uid in range(base, base + len(ROLES)):
        try:
            return f"uid {uid} is the account {pwd.getpwuid(uid).pw_name!r}"
        except KeyError:
            pass
    try:
        return f"gid {base} is the group {grp.getgrgid(base).gr_name!r}"
    except KeyError:
        return None


def _unreachable(paths: list[tuple[str, int]], modules: list[str]) -> Optional[str]:
    """What of `paths` (path, os.access mode) and `modules` this process cannot reach (None: all)."""
    uid = os.getuid()
    for path, mode in paths:  # each exists (for root: a path that does not is nobody's concern)
        if not os.access(path, mode):
            p = Path(path)
            blocked = next((a for a in reversed(p.parents) if not os.access(a, os.X_OK)), None)
            if blocked is not None:
                return f"{blocked} is not searchable by uid {uid} (a role's), so neither is {path}"
            what = "readable" if mode & os.R_OK else "searchable or executable"
            return f"{path} is not {what} by uid {uid} (a role's)"
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin and os.path.exists(spec.origin):
                with open(spec.origin, "rb") as f:
                    f.read(1)
        except (OSError, ImportError, ValueError) as e:
            return f"module {name!r} cannot be read by uid {os.getuid()} ({type(e).__name__}: {e})"
    return None


def _probe(creds: Creds, paths: list[tuple[str, int]], modules: list[str]) -> Optional[str]:
    """Fork, become `creds`, check what every worker reads; the child's answer (None: all)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        code = 0
        try:
            os.close(r)
            drop(creds)
            why = _unreachable(paths, modules)
            os.write(w, (why or "").encode()[:4000])
        except BaseException as e:  # noqa: BLE001 - say why in the parent
            os.write(w, f"cannot become uid {creds.uid} ({type(e).__name__}: {e})".encode()[:4000])
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        if not select.select([f], [], [], PROBE_TIMEOUT_S)[0]:  # a user module that hangs as it is found
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"the probe as uid {creds.uid} did not answer within {PROBE_TIMEOUT_S:g} s"
        answer = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return answer or None


def env_modules(job) -> list[str]:
    """The user's modules a worker imports: env and model imports, and the env's, its wrappers'
    and the model's entry points'."""
    env, model = job.spec.env, job.spec.model
    points = [env.id, *(w.entry_point for w in env.wrappers), model.entry_point or ""]
    return [*env.imports, *model.imports, *(p.split(":", 1)[0] for p in points if ":" in p)]


def decide(job, run_dir: Path, job_file: Path, environ=None) -> tuple[Optional[RoleUids], Optional[str]]:
    """(the role uids, None), or (None, why not) when this launcher is root but cannot isolate the
    roles; (None, None) when it is not root (nothing to isolate from)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None, None
    base, why = _base(os.environ if environ is None else environ)
    if base is None:
        return None, why
    why = _taken(base)
    if why:
        return None, f"{why} (set {ENV_ROLE_UIDS} to a free range)"
    x, rx = os.X_OK, os.R_OK | os.X_OK
    paths = [(str(p), x) for p in reversed(run_dir.resolve().parents)] + [(str(run_dir.resolve()), x)]
    paths += [(str(job_file), os.R_OK), (os.getcwd(), rx), (sys.executable, x)]
    paths += [(p, rx) for p in sys.path if p and os.path.isdir(p)]
    paths = [(os.path.realpath(p), mode) for p, mode in paths if os.path.exists(p)]
    why = _probe(RoleUids(base).creds("actor"), paths, env_modules(job))
    return (None, why) if why else (RoleUids(base), None)


def _own(path: Path, creds: Creds, mode: int) -> None:
    """`path` (made if missing) and everything under it owned by `creds`, the top at `mode`."""
    path.mkdir(parents=True, exist_ok=True)
    for p in [path, *path.rglob("*")]:
        os.lchown(p, creds.uid, creds.gid)
    path.chmod(mode)


def prepare(uids: RoleUids, run_dir: Path, sock_dir: Path, owned: list[tuple[str, Path]]) -> None:
    """The folders each role writes, its own (`owned`: (role, folder), in order: a folder inside
    an earlier one is given to its role after it), each role's HOME, and the socket folder,
    shared by group, sticky."""
    for role in ROLES:
        _own(uids.home(run_dir, role), uids.creds(role), 0o700)
    for role, path in owned:
        _own(path, uids.creds(role), 0o755)
    os.chown(sock_dir, 0, uids.base)
    sock_dir.chmod(0o1770)


def describe(uids: Optional[RoleUids], why: Optional[str]) -> Optional[dict]:
    """summary.json's `isolation`: the uid of each role, or why the roles run as root; None when
    the launcher is not root."""
    if uids is not None:
        return {"uids": {role: uids.creds(role).uid for role in ROLES}, "gid": uids.base}
    return {"off": why} if why else None


def share_socket(path: str, uids: Optional[RoleUids]) -> None:
    """A socket the launcher bound (ipc://PATH): connectable by the roles' group."""
    if uids is not None:
        os.chown(path, 0, uids.base)
        os.chmod(path, 0o660)
