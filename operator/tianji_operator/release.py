"""`python -m tianji_operator.release`: let go of every TianJiJob before the operator goes.

Kopf keeps a finalizer (`tianji.dev/finalizer`) on each job while the operator runs (its
timers require one). Without the operator, a job with that finalizer is never deleted, and
neither is its namespace nor the CRD. The chart's pre-delete hook runs this while the
operator still runs: it annotates every job `tianji.dev/released=true`, which no handler
matches, so the operator removes its own finalizer (no race with it re-adding one); jobs
whose finalizer is still there after `--wait` seconds (no operator running) lose it here.
With `--delete-jobs` the jobs are deleted too (their pods and children with them).

Re-adopting released jobs after a reinstall: `kubectl annotate tjj --all -A tianji.dev/released-`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Optional

from .context import FINALIZER, RELEASED
from .kube import ApiError, KubeClient, in_cluster_login

log = logging.getLogger("tianji.operator.release")


async def _jobs(kube: KubeClient, namespaces: list[str]) -> list[dict]:
    if not namespaces:
        return await kube.list("TianJiJob", None)
    out = []
    for ns in namespaces:
        out += await kube.list("TianJiJob", ns)
    return out


def _held(job: dict) -> bool:
    return FINALIZER in (job["metadata"].get("finalizers") or [])


async def release_jobs(
    kube: KubeClient,
    namespaces: list[str],
    *,
    delete: bool = False,
    wait: float = 60.0,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, list[str]]:
    """Release (and with `delete`, delete) every job; {"released": [...], "stripped": [...], "deleted": [...]}."""
    done: dict[str, list[str]] = {"released": [], "stripped": [], "deleted": []}
    for job in await _jobs(kube, namespaces):
        meta = job["metadata"]
        await kube.patch(
            "TianJiJob", meta.get("namespace"), meta["name"], {"metadata": {"annotations": {RELEASED: "true"}}}
        )
        done["released"].append(f"{meta.get('namespace')}/{meta['name']}")
    deadline = clock() + wait
    while True:
        held = [j for j in await _jobs(kube, namespaces) if _held(j)]
        if not held or clock() >= deadline:
            break
        await asyncio.sleep(poll)
    for job in held:  # no operator answered: take its finalizer off here
        meta = job["metadata"]
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        try:
            await kube.patch(
                "TianJiJob",
                meta.get("namespace"),
                meta["name"],
                {"metadata": {"finalizers": rest, "resourceVersion": meta["resourceVersion"]}},
            )
            done["stripped"].append(f"{meta.get('namespace')}/{meta['name']}")
        except ApiError as e:
            if e.status not in (404, 409):
                raise
            log.warning("%s/%s changed meanwhile (%s): run again", meta.get("namespace"), meta["name"], e.status)
    if delete:
        for job in await _jobs(kube, namespaces):
            meta = job["metadata"]
            if await kube.delete("TianJiJob", meta.get("namespace"), meta["name"]):
                done["deleted"].append(f"{meta.get('namespace')}/{meta['name']}")
    return done


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tianji_operator.release", description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", "-n", action="append", default=[], help="only this namespace (repeatable)")
    p.add_argument("--delete-jobs", action="store_true", help="also delete the jobs (and their pods)")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the operator to let go")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    import kopf

    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    def login():
        settings = kopf.OperatorSettings()
        return in_cluster_login(settings) or kopf.login_with_kubeconfig(settings=settings)

    async def run() -> dict:
        kube = KubeClient(login)
        try:
            return await release_jobs(kube, a.namespace, delete=a.delete_jobs, wait=a.wait)
        finally:
            await kube.close()

    done = asyncio.run(run())
    for k, v in done.items():
        log.info("%s: %d %s", k, len(v), " ".join(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
