"""`python -m localcluster up|down|status`: the local cluster for people (`make cluster-up`).

`up` starts it in the background and prints the kubeconfig to use; `down` stops every process
it started (from the pid files under its folder) and removes its network. The cluster number comes
from --index, else TIANJI_CLUSTER_INDEX, else 0, for every command alike: `down` must stop the
cluster that `up` started, never cluster 0 by default while another one was meant."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from . import network, realnode
from .cluster import BIN, LocalCluster, missing_programs
from .crunruntime import sweep


def _kill_all(root: Path, grace: float = 10.0) -> int:
    pids = []
    for f in sorted((root / "logs").glob("*.pid")) if (root / "logs").is_dir() else []:
        try:
            pids.append(int(f.read_text()))
        except ValueError:
            continue
        f.unlink()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        alive = []
        for pid in pids:
            try:
                os.killpg(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if Path(f"/proc/{p}").exists()]
            time.sleep(0.2)
    return len(pids)


INDEX_ENV = "TIANJI_CLUSTER_INDEX"


def _cluster_index(text: str) -> int:
    """A cluster number 0-15 (the address plan has 16 ranges); argparse reports the error."""
    try:
        i = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cluster index must be a whole number 0-15, got {text!r}") from None
    if not 0 <= i <= 15:
        raise argparse.ArgumentTypeError(f"cluster index must be 0-15, got {i}")
    return i


def parse_args(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> argparse.Namespace:
    """The command line, with the cluster index defaulting to TIANJI_CLUSTER_INDEX (then 0)."""
    env = os.environ if environ is None else environ
    ap = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--index", type=_cluster_index, default=None,
                    help=f"cluster number 0-15 (separate addresses and folder; default ${INDEX_ENV}, else 0)")
    ap.add_argument("--dir", type=Path, default=None, help="state folder (default /tmp/tianji-cluster-INDEX)")
    ap.add_argument("--runtime", choices=["process", "crun"], default="process",
                    help="how the node agents run pods: processes (fast) or crun containers from local images")
    ap.add_argument("--node-kind", choices=["process", "real"], default="process",
                    help="process: the node agent; real: the kubelet with containerd, images from the "
                         "cluster's registry (docs/local-cluster.md)")
    a = ap.parse_args(argv)
    if a.index is None:
        raw = env.get(INDEX_ENV, "").strip()
        try:
            a.index = _cluster_index(raw) if raw else 0
        except argparse.ArgumentTypeError as e:
            ap.error(f"{INDEX_ENV}: {e}")
    return a


def cluster_of(a: argparse.Namespace, root: Path) -> LocalCluster:
    """The cluster `up` starts: `--nodes` process-mode nodes, or as many real ones (tainted,
    realnode.TAINT) beside one process-mode node for the operator's pod, as the tests have it."""
    real = a.node_kind == "real"
    return LocalCluster(1 if real else a.nodes, index=a.index, root=root, agent_args=(f"--runtime={a.runtime}",),
                        real_nodes=a.nodes if real else 0, real_taints=(realnode.TAINT,) if real else ())


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    root = a.dir or Path(f"/tmp/tianji-cluster-{a.index}")
    net = network.Addressing(a.index)
    if a.command == "down":
        n = _kill_all(root)
        for ns in network.namespaces():
            if ns.startswith(net.prefix + "-"):
                for pid in network.pids_in(ns):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        network.down_all(net)
        for node_root in sorted((root / "nodes").glob("*")):  # containers of a --runtime=crun cluster
            sweep(node_root)
        realnode.sweep_cgroups(net.prefix)  # real nodes' kubelet cgroups
        print(f"local cluster {a.index}: stopped {n} processes, network removed")
        return 0
    if a.command == "status":
        kc = root / "kubeconfig"
        print(f"kubeconfig: {kc if kc.exists() else '(none: not up)'}")
        if kc.exists() and (root / "network-policy").exists():  # real nodes
            print(f"NetworkPolicy: {(root / 'network-policy').read_text().strip()}")
        return 0 if kc.exists() else 1
    real = a.node_kind == "real"
    missing = missing_programs(real=real)
    if missing:
        print(f"missing {', '.join(missing)} in {BIN}: run `make cluster` first", file=sys.stderr)
        return 2
    if (root / "logs").is_dir():
        _kill_all(root)
    c = cluster_of(a, root)
    try:
        c.up()
    except Exception as e:
        print(f"local cluster failed to start: {e}\n{c.logs()}", file=sys.stderr)
        c.down()
        return 1
    extra = ""
    if real:
        try:
            image = c.checkout_image()
        except Exception as e:  # the cluster is up; only the image is missing
            image = f"(not pushed: {e})"
        defaults = json.dumps(realnode.WORKER_DEFAULTS, separators=(",", ":"))
        extra = (f"  images: {c.registry_host} (crane push --insecure); this checkout's worker image: {image}\n"
                 f"  NetworkPolicy {c.network_policy.status()}\n"
                 f"  node-1 runs the operator's pod from this checkout; the real nodes take the pods that "
                 f"tolerate {realnode.TAINT}:\n"
                 f"  helm install tianji charts/tianji-operator -n tianji-system --create-namespace "
                 f"--set-json 'operator.workerDefaults={defaults}'\n")
    kinds = f"{a.nodes} real nodes and a process-mode node" if real else f"{a.nodes} {a.node_kind} nodes"
    print(f"local cluster up: {kinds}, API server {c.cp.server}\n"
          f"  export KUBECONFIG={c.kubeconfig} PATH={BIN}:$PATH\n"
          f"  kubectl get nodes\n{extra}  logs: {root / 'logs'}; stop: "
          f"make cluster-down{'' if a.index == 0 else f' TIANJI_CLUSTER_INDEX={a.index}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
