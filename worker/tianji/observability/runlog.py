"""Where the launcher's per-second records go besides metrics.jsonl: TensorBoard event files in
the run dir (always), Weights & Biases (if `spec.wandb`), and, with `tianji run --tensorboard`, a
TensorBoard server on the run dir for as long as the run lasts.

A sink that fails (a full disk, W&B unreachable) is reported once and dropped: logging never
ends a run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from tianji.control.spec import TianJiJob

# TensorBoard dies with the launcher, even a SIGKILLed one (PR_SET_PDEATHSIG), as the workers do.
_TB_WITH_PARENT = (
    "import ctypes, os, runpy, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(0)  # the launcher is already gone\n"
    "sys.argv = ['tensorboard'] + sys.argv[2:]\n"
    "runpy.run_module('tensorboard.main', run_name='__main__')\n")


class RunLog:
    def __init__(self, job: TianJiJob, run_dir: Path, tensorboard_port: Optional[int] = None):
        from tianji.observability.tensorboard import RunBoard

        self.sinks: dict[str, object] = {"tensorboard": RunBoard(run_dir)}
        if job.spec.wandb is not None:
            from tianji.observability.wandb_log import WandbRun

            try:
                self.sinks["wandb"] = WandbRun(job.spec.wandb, job.name, run_dir,
                                               job.spec.model_dump(mode="json", by_alias=True))
            except Exception as e:  # noqa: BLE001 - W&B's own errors (network, login): run on without it
                print(f"tianji: W&B logging disabled: {type(e).__name__}: {e}", file=sys.stderr)
        self.server: Optional[subprocess.Popen] = None
        if tensorboard_port is not None:
            self.server = subprocess.Popen(
                [sys.executable, "-c", _TB_WITH_PARENT, str(os.getpid()), "--logdir", str(run_dir),
                 "--host", "127.0.0.1", "--port", str(tensorboard_port)], stdout=subprocess.DEVNULL,
                stderr=open(run_dir / "logs" / "tensorboard.log", "ab"), start_new_session=True)
            print(f"tianji: TensorBoard at http://127.0.0.1:{tensorboard_port}/", file=sys.stderr)

    def write(self, row: dict) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                sink.write(row)
            except Exception as e:  # noqa: BLE001 - see the module docstring
                print(f"tianji: {name} logging stopped: {type(e).__name__}: {e}", file=sys.stderr)
                self._close(name)

    def _close(self, name: str) -> None:
        sink = self.sinks.pop(name)
        try:
            sink.close()
        except Exception:  # noqa: BLE001 - already failing; nothing more to say
            pass

    def close(self) -> None:
        for name in list(self.sinks):
            self._close(name)
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(5)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
