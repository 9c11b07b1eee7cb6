"""`tianji worker`: run one role. The only way a role starts, locally and in pods.

Threads are set deliberately: torch gets `resources.<role>.threads` (default
floor(cpu), at least 1) intra-op threads and one inter-op thread, so that N
processes on an N-core machine do not oversubscribe it.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import signal
import sys

from tianji.control.contracts.addressing import ROLES, Addresses, auto_index
from tianji.control.contracts.fabric import FabricError, interface_ipv4
from tianji.control.contracts.launch import ENV_PARENT_PID, ENV_POD_IP, ENV_STATE_DIR, torch_threads
from tianji.control.spec import SpecError, load_job


def add_arguments(w: argparse.ArgumentParser) -> None:
    """`tianji worker`'s arguments (the CLI's sub-command and `main` here share them)."""
    w.add_argument("--role", required=True, choices=list(ROLES))
    w.add_argument("--group", type=int, default=0)
    w.add_argument("--index", default="0", help="index in the group, or 'auto' (from the StatefulSet hostname)")
    w.add_argument("--job", required=True, help="TianJiJob manifest (YAML)")
    w.add_argument("--run-dir", help="local engine: ipc sockets live here; absent: Kubernetes DNS + tcp")
    w.add_argument("--report", help="endpoint for heartbeats and metric reports (local launcher)")
    w.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")


def main(argv: list[str]) -> int:
    """`tianji worker ARGV` without the rest of the command line: what the local worker template
    (local/zygote.py) runs in each forked worker."""
    p = argparse.ArgumentParser(prog="tianji worker")
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        return run_worker(a)
    except SpecError as e:
        print(f"tianji: invalid job spec: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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
        # a learner also serves its checkpoints (the operator's confirming evaluation downloads one)
        pod_ip = os.environ.get(ENV_POD_IP)
        serve = functools.partial(role.metrics.serve, a.metrics_port, report=role.report_json, fabric=fabric,
                                  checkpoint=role.checkpoint_bytes if isinstance(role, Learner) else None)
        serve(pod_ip or "0.0.0.0")
        if pod_ip:  # and on loopback, where `kubectl port-forward` connects (nothing a pod IP does not offer)
            try:
                serve("127.0.0.1")
            except OSError as e:  # host networking: the node's loopback port may be another's
                logging.getLogger("tianji").warning("/metrics not on 127.0.0.1:%d (%s): port-forward will not "
                                                    "reach it", a.metrics_port, e)
    try:
        return role.run()
    except Exception:
        logging.getLogger("tianji").exception("%s failed", role.sender)
        return 1
