"""How long a pod takes from creation to Ready on each kind of local-cluster node: the process-mode
node agent against a real node (kubelet + containerd, the probe image already pulled), in
interleaved rounds on one cluster (cluster/localcluster; root and `make cluster`).

Per pod: seconds from `kubectl apply` to the Ready condition. Per kind: the median and the range.
This is what keeps TianJi's pods on the process-mode nodes in the cluster tier (docs/testing.md).

    python -m bench.node_startup [--rounds 5] [--out docs/results/node-startup.json]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, loadavg, stamp

sys.path.insert(0, str(ROOT / "cluster"))
from localcluster.cluster import LocalCluster  # noqa: E402
from localcluster.realnode import PROBE_IMAGE  # noqa: E402


def _pod(c: LocalCluster, name: str, node: str) -> dict:
    """The same program on both kinds, Ready once it serves TCP: the probe image on the real node,
    the probe binary from the cluster's programs on the process-mode one (which pulls no image)."""
    if node == "node-2":
        container = {"image": f"{c.registry_host}/{PROBE_IMAGE}", "args": ["serve", ":8080"]}
    else:
        container = {"image": PROBE_IMAGE, "command": [str(c.bin / "probe"), "serve", ":8080"]}
    container.update(name="main", readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 1}}


def _ready_after(c: LocalCluster, doc: dict, timeout: float = 120) -> float:
    t0 = time.monotonic()
    c.kubectl("apply", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]
    while time.monotonic() - t0 < timeout:
        res = c.kubectl("get", "pod", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                        check=False)
        if res.stdout.strip() == "True":
            return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"pod {name} not Ready within {timeout:g} s")


def summarize(runs: list[dict]) -> dict:
    """Per kind: median and range of seconds to Ready; per round: real over process."""
    by_kind = {}
    for kind in ("process", "real"):
        xs = [x["seconds_to_ready"] for x in runs if x["kind"] == kind]
        by_kind[kind] = {"median_s": round(statistics.median(xs), 3), "min_s": min(xs), "max_s": max(xs),
                         "pods": len(xs)}
    per = {}
    for x in runs:
        per.setdefault(x["round"], {})[x["kind"]] = x["seconds_to_ready"]
    ratios = [k["real"] / k["process"] for _, k in sorted(per.items()) if {"real", "process"} <= set(k)]
    return {"results": by_kind, "real_over_process": {"per_round": [round(x, 2) for x in ratios],
                                                      "median": round(statistics.median(ratios), 2)},
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--index", type=int, default=14, help="the local cluster's number (0-15)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/)")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tianji-bench-nodes-"))
    c = LocalCluster(1, index=a.index, root=root, real_nodes=1)
    runs: list[dict] = []
    try:
        c.up()
        _ready_after(c, _pod(c, "warm", "node-2"))  # the probe image pulled once, as a cached image
        for r in range(a.rounds):
            for node in (("node-1", "node-2") if r % 2 == 0 else ("node-2", "node-1")):
                load = loadavg()
                s = _ready_after(c, _pod(c, f"p{r}-{node}", node))
                runs.append({"round": r, "node": node, "kind": "real" if node == "node-2" else "process",
                             "seconds_to_ready": round(s, 3), "load1_before": load[0]})
    finally:
        c.down()
        shutil.rmtree(root, ignore_errors=True)  # (the registry and the nodes' images: gigabytes)
    out = {**stamp("node_startup", argv), **summarize(runs)}
    emit(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
