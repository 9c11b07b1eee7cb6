"""`tianji worker`: run one role. The only way a role starts, locally and in pods.

Threads are set deliberately: torch gets `resources.<role>.threads` (default
floor(cpu), at least 1) intra-op threads and one inter-op thread, so that N
processes on an N-core machine do not oversubscribe it.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

from tianji.control.addressing import Addresses, auto_index
from tianji.control.fabric import FabricError, interface_ipv4
from tianji.control.launch import ENV_PARENT_PID, ENV_POD_IP, ENV_STATE_DIR, torch_threads
from tianji.control.spec import load_job


def die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the launcher dies (even by kill -9): no orphans."""
    parent = os.environ.get(ENV_PARENT_PID)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the launcher died before prctl took effect
        sys.exit(1)


def run_worker(a: argparse.Namespace) -> int:
    die_with_parent()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {a.role}-{a.group}-{a.index} %(levelname)s %(message)s")
    job = load_job(a.job)
    index = auto_index() if a.index == "auto" else int(a.index)
    threads = torch_threads(job, a.role)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set by an earlier parallel region
        pass
    from tianji.runtime.roles.actor import Actor
    from tianji.runtime.roles.buffer import Buffer
    from tianji.runtime.roles.evaluator import Evaluator
    from tianji.runtime.roles.learner import Learner

    cls = {"actor": Actor, "buffer": Buffer, "learner": Learner, "evaluator": Evaluator}[a.role]
    addrs = Addresses.from_env(job.name, job.spec.network.base_port, a.run_dir)
    fabric = None
    if job.spec.network.interface and not a.run_dir:  # pods: data sockets on that interface's address
        try:
            fabric = interface_ipv4(job.spec.network.interface)
        except FabricError as e:
            logging.getLogger("tianji").error("%s", e)
            return 1
        addrs = dataclasses.replace(addrs, bind_host=fabric, fabric_metrics_port=job.spec.network.metrics_port)
    role = cls(job, a.group, index, addrs, report=a.report, run_dir=a.run_dir or os.environ.get(ENV_STATE_DIR))
    if a.metrics_port:
        role.metrics.serve(a.metrics_port, os.environ.get(ENV_POD_IP) or "0.0.0.0", report=role.report_json,
                           fabric=fabric)
    try:
        return role.run()
    except Exception:
        logging.getLogger("tianji").exception("%s failed", role.sender)
        return 1
