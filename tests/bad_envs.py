"""User envs that misbehave, for tests/engine/test_custom_env.py. Workers import this module through
`env.imports` / an entry-point id (tests put tests/ and examples/custom-env on PYTHONPATH)."""
from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np
from reach_goal.envs import ReachGoalEnv

# Which processes imported this module: only those that build envs may (the test reads the file).
_IMPORT_LOG = os.environ.get("TIANJI_TEST_IMPORT_LOG")
if _IMPORT_LOG:
    with open(_IMPORT_LOG, "a") as f:
        f.write((sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else "launcher") + "\n")


class FailOnce(ReachGoalEnv):
    """Raises in `step` after `after` steps, once per job: the first env to get there creates
    `marker` (O_EXCL) and raises; every later one, in this or a restarted actor, carries on."""

    def __init__(self, marker: str, after: int = 100, **kw):
        super().__init__(**kw)
        self.marker, self.after, self.steps = marker, after, 0

    def step(self, action):
        self.steps += 1
        if self.steps >= self.after:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("bad_envs: simulated fault in step")
        return super().step(action)


class NaNSometimes(ReachGoalEnv):
    """Every `every` steps a NaN observation or an infinite reward (alternately)."""

    def __init__(self, every: int = 500, **kw):
        super().__init__(**kw)
        self.every, self.steps = every, 0

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        self.steps += 1
        if self.steps % self.every == 0:
            if (self.steps // self.every) % 2:
                obs = np.full_like(obs, np.nan)
            else:
                reward = float("inf")
        return obs, reward, term, trunc, info


class _Uncarried(gym.Env):
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


class DictObs(_Uncarried):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "goal": gym.spaces.Discrete(3)})


class TextObs(_Uncarried):
    observation_space = gym.spaces.Text(8)


def _attempt(fn) -> str:
    """"denied" (PermissionError), or what happened otherwise."""
    try:
        fn()
    except PermissionError:
        return "denied"
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return "allowed"


def _cpu_cgroup() -> str:
    """This process's cgroup in the cpu controller (v1) or the unified hierarchy (v2)."""
    lines = [line.split(":", 2) for line in open("/proc/self/cgroup").read().splitlines()]
    return next((p for _, c, p in lines if "cpu" in c.split(",")), next((p for h, _, p in lines if h == "0"), ""))


def _cpu_mount() -> str:
    for line in open("/proc/self/mounts"):
        _, mount, kind, opts = line.split()[:4]
        if kind == "cgroup" and "cpu" in opts.split(","):
            return mount
    return "/sys/fs/cgroup"


def _leave_cpu_cgroup() -> str:
    """Move this process to the root of the cpu hierarchy, out of its CPU bound."""
    def leave():
        with open(os.path.join(_cpu_mount(), "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return _attempt(leave)


def _raise_cpu_shares() -> str:
    def raise_():
        with open(os.path.join(_cpu_mount(), _cpu_cgroup().lstrip("/"), "cpu.shares"), "w") as f:
            f.write("262144")
    return _attempt(raise_)


def _learner_pid() -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--role\0learner\0" in f.read():
                    return int(pid)
        except OSError:
            pass
    return None


class RoleProbe(gym.Wrapper):
    """Hostile env code in an actor: the first actor's first env records, in the JSON file `out`,
    its credentials and what it could do to the rest of the run (test_isolation.py)."""

    def __init__(self, env, out: str, run_dir: str):
        super().__init__(env)
        if "--role" not in sys.argv or sys.argv[sys.argv.index("--role") + 1] != "actor" or os.path.exists(out):
            return
        import json
        import signal

        with open("/proc/self/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        learner = _learner_pid()
        sock = os.path.realpath(os.path.join(run_dir, "sock"))
        facts = {
            "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
            "cap_eff": status["CapEff"].strip(), "learner_pid": learner,
            "learner_environ": _attempt(lambda: open(f"/proc/{learner}/environ", "rb").read()),
            "learner_mem": _attempt(lambda: open(f"/proc/{learner}/mem", "rb").close()),
            "signal_learner": _attempt(lambda: os.kill(learner, signal.SIGSTOP)),
            "rewrite_job": _attempt(lambda: open(os.path.join(run_dir, "job.yaml"), "a").close()),
            "write_checkpoints": _attempt(lambda: open(os.path.join(run_dir, "checkpoints", "0-0", "x"), "w").close()),
            "remove_report_socket": _attempt(lambda: os.unlink(os.path.join(sock, "launcher-report"))),
            "cgroup": _cpu_cgroup(), "leave_cgroup": _leave_cpu_cgroup(), "raise_cpu_shares": _raise_cpu_shares(),
        }
        with open(out + ".tmp", "w") as f:
            json.dump(facts, f)
        os.replace(out + ".tmp", out)
