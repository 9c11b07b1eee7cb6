"""The pre-imported worker template of local runs (local/zygote.py): forked workers are the launcher's own children."""
import os
import signal
import sys
import time

import pytest

from helpers import EXAMPLES, wait_for
from tianji.control.spec import dump_job, load_job
from tianji.local import zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl: Linux only")


def _stat(pid: int) -> list[str]:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()


def test_forked_worker_is_our_child_named_like_a_spawned_one(tmp_path):
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    env = {**os.environ, "TIANJI_PARENT_PID": str(os.getpid()), "TIANJI_SOCK_DIR": str(sock),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    job = tmp_path / "job.yaml"
    job.write_text(dump_job(load_job(EXAMPLES / "cartpole-ppo.yaml", ["spec.network.encryption=none"])))
    zygote.set_subreaper(True)
    z = zygote.Zygote(env, str(tmp_path / "zygote.log"))
    try:
        argv = ["worker", "--role", "buffer", "--group", "0", "--index", "0", "--job", str(job),
                "--run-dir", str(tmp_path)]
        p = z.spawn(argv, env, str(tmp_path / "buffer.log"))
        assert p.poll() is None
        assert int(_stat(p.pid)[1]) == os.getpid()  # re-parented to us: we wait for it, not the zygote

        def cmdline():  # rewritten by the worker as it starts
            cmd = open(f"/proc/{p.pid}/cmdline", "rb").read().split(b"\0")
            return b"--role" in cmd and cmd

        cmd = wait_for(cmdline, 60, "the worker's command line")
        assert cmd[cmd.index(b"--role") + 1] == b"buffer" and str(tmp_path).encode() in b" ".join(cmd)
        assert int(_stat(p.pid)[3]) == p.pid  # its own session (as start_new_session)
        time.sleep(1.0)
        assert p.poll() is None, (tmp_path / "buffer.log").read_text()
        p.send_signal(signal.SIGTERM)  # the role stops cleanly, as a spawned one does
        assert p.wait(timeout=30) == 0, (tmp_path / "buffer.log").read_text()
        q = z.spawn(argv, env, str(tmp_path / "buffer2.log"))
        q.kill()
        assert q.wait(timeout=10) == -signal.SIGKILL
        q.kill()  # a reaped worker is never signalled again (its pid may be reused)
    finally:
        z.close()
        zygote.set_subreaper(False)
    assert not z.alive()


def test_dead_template_is_reported_so_the_launcher_can_spawn(tmp_path):
    env = {**os.environ, "TIANJI_PARENT_PID": str(os.getpid()), "PYTHONPATH": os.pathsep.join(sys.path)}
    zygote.set_subreaper(True)
    z = zygote.Zygote(env, str(tmp_path / "zygote.log"))
    try:
        z.proc.kill()
        z.proc.wait()
        with pytest.raises(OSError):
            z.spawn(["crd"], env, str(tmp_path / "x.log"))
    finally:
        z.close()
        zygote.set_subreaper(False)
