"""What the checkout's worker image costs a local cluster with real nodes
(cluster/localcluster/checkoutimage.py; root and `make cluster`): the push to a fresh registry,
a second push (nothing changed), and each real node's pull and unpack, both nodes at once.

Pull seconds are the kubelet's own (`Pulled` events: "Successfully pulled image ... in 30.9s").

    python -m bench.checkout_image [--out docs/results/checkout-image.json]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, emit, loadavg, stamp

sys.path.insert(0, str(ROOT / "cluster"))
from localcluster.cluster import LocalCluster  # noqa: E402

PULLED = re.compile(r"Successfully pulled image \"[^\"]+\" in ([0-9.]+)(ms|s) .*Image size: ([0-9]+) bytes")


def pulled(messages: list[str]) -> list[dict]:
    """The kubelet's `Pulled` event messages as seconds and bytes (a cached image says no time)."""
    out = []
    for m in messages:
        x = PULLED.search(m)
        if x:
            s = float(x.group(1)) / (1000 if x.group(2) == "ms" else 1)
            out.append({"seconds": round(s, 3), "bytes": int(x.group(3))})
    return out


def _run_everywhere(c: LocalCluster, ref: str, nodes: list[str], timeout: float = 600) -> list[str]:
    for node in nodes:
        c.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"v-{node}", "namespace": "default"},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": ref, "args": ["--version"]}]}}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phases = [c.kubectl("get", "pod", f"v-{n}", "-o", "jsonpath={.status.phase}", check=False).stdout
                  for n in nodes]
        if all(p == "Succeeded" for p in phases):
            break
        if "Failed" in phases:
            raise RuntimeError(f"a pod of the image failed: {phases}")
        time.sleep(0.5)
    else:
        raise TimeoutError(f"pods of {ref} did not finish within {timeout:g} s")
    events = json.loads(c.kubectl("get", "events", "-n", "default", "-o", "json").stdout)["items"]
    return [e["message"] for e in events if e["reason"] == "Pulled"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=int, default=14, help="the local cluster's number (0-15)")
    ap.add_argument("--out", help="also write the JSON here (docs/results/)")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tianji-bench-image-"))
    c = LocalCluster(0, index=a.index, root=root, real_nodes=2)
    try:
        c.up()
        load = loadavg()
        t = time.monotonic()
        ref = c.checkout_image()
        first = time.monotonic() - t
        t = time.monotonic()
        c.checkout_image()
        again = time.monotonic() - t
        pulls = pulled(_run_everywhere(c, ref, [n.name for n in c.real_nodes]))
    finally:
        c.down()
        shutil.rmtree(root, ignore_errors=True)  # (the registry and the nodes' images: gigabytes)
    out = {**stamp("checkout_image", argv), "load1_before": load[0], "image": ref.split("/", 1)[1],
           "push_fresh_registry_s": round(first, 2), "push_again_s": round(again, 2), "pulls": pulls}
    emit(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
