"""The confirming evaluation on Kubernetes: a job is Succeeded at its target only when the
saved policy meets it (tianji.control.contracts.confirm; the local engine's twin is
tianji.local.targetcheck).

The actors' returns are their own claims: when the stop rule's target holds (and the learners
back it, counting.learners_behind), the monitor asks for proof. It takes learner-0-0's newest
checkpoint at or past the version the learner had at the trigger (its live report names the
file and its SHA-256; learners checkpoint every checkpoint.intervalVersions) and starts the pod
`<job>-confirm` (builders.confirm_pod): `tianji confirm` fetches the file from the learner's
metrics port, refuses it unless its digest is the reported one, plays it (the contract's
episodes, seed and step cap) and leaves its answer as termination message. The job ends
TargetReached only when that answer's mean return meets stop.meanReturn; otherwise training
goes on and the next check waits RETRY_S and for a newer policy.

Everything the check needs survives the operator: status.targetCheck holds its stage, the
trigger's version, the checkpoint under evaluation and the last answer; the answer that
confirms is status.targetEvaluation (summary.json's target_evaluation).
"""

from __future__ import annotations

from typing import Any, Optional

import kopf

from tianji.control.contracts import confirm as contract
from tianji.control.contracts.addressing import pod_name

from .. import status as st
from ..children import builders as b
from ..context import Operator, adopt, update_status
from ..kube import ApiError
from .podreports import pod_port

LEARNER = ("learner", 0, 0)
LOST_POD_S = 60.0  # an evaluating stage whose pod is gone this long (deleted by someone) starts over


def confirm_pods(pods: list[dict]) -> tuple[list[dict], Optional[dict]]:
    """(the job's worker pods, its confirming evaluation's pod or None)."""
    mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(b.LABEL_ROLE) == b.CONFIRM_ROLE]
    rest = [p for p in pods if p not in mine]
    live = [p for p in mine if not p["metadata"].get("deletionTimestamp")]
    return rest, (live[0] if live else None)


async def confirm_target(
    op: Operator,
    body: Any,
    resolved: Any,
    pods: list[dict],
    pod: Optional[dict],
    acc: Any,
    live: list,
    now: float,
) -> tuple[Optional[dict], str]:
    """Advance the check: (the evaluation that confirms the target, or None and what the job
    waits for). Call only while the stop rule's target holds and the learners back it."""
    status = dict(body.get("status") or {})
    tc = dict(status.get("targetCheck") or {})
    if tc.get("stage") == "evaluating":
        return await _evaluating(op, body, resolved, pod, tc, now)
    if pod is not None:  # one no check holds (its stage was never written: an operator stopped between)
        await op.kube.delete("Pod", body["metadata"].get("namespace"), pod["metadata"]["name"])
        return None, "confirming the target: an earlier evaluation's pod is going away"
    if now < (st.parse_iso(tc.get("retryAt")) or 0.0):
        return None, f"confirming the target: the last check did not ({_last(tc)}); the next in a few seconds"
    rep = next((r for r in live if r.key == LEARNER and not r.final), None)
    version = int(rep.extra.get("version", 0) or 0) if rep is not None else 0
    tc.setdefault("version", version)  # the learner's version at the trigger
    need = max(int(tc["version"]), int(tc.get("retryVersion", -1)) + 1)
    name = rep.extra.get("checkpoint") if rep is not None else None
    sha = rep.extra.get("checkpoint_sha256") if rep is not None else None
    at = contract.checkpoint_version(name)
    learner = _pod_named(body, pods)
    if at is None or at < need or not isinstance(sha, str) or learner is None:
        await _write(op, body, tc)
        return None, f"confirming the target: waiting for learner-0-0's checkpoint at version >= {need}"
    port = pod_port(learner, "metrics", _metrics_port(resolved))
    url = f"http://{learner['status']['podIP']}:{port}/checkpoint/{name}"
    obj = adopt(
        b.confirm_pod(
            resolved,
            op.config.confirm_command,
            contract.confirm_args(url, sha, resolved.spec, acc.mean_episode_length()),
            op.config.worker_defaults,
        ),
        body,
    )  # owned by the job: it goes with it
    try:
        await op.kube.create(obj)
    except ApiError as e:
        if e.status != 409:  # 409: the last one is still being deleted; the next tick tries again
            raise
        return None, "confirming the target: the previous evaluation's pod is still going away"
    tc.update(stage="evaluating", since=st.iso(now), checkpoint=name, checkpointVersion=at, sha256=sha)
    await _write(op, body, tc)
    pod_name_ = obj["metadata"]["name"]
    kopf.info(body, reason="ConfirmingTarget", message=f"evaluating {name} (policy version {at}) in pod {pod_name_}")
    return None, f"confirming the target: evaluating {name}"


async def _evaluating(
    op: Operator, body: Any, resolved: Any, pod: Optional[dict], tc: dict, now: float
) -> tuple[Optional[dict], str]:
    since = st.parse_iso(tc.get("since")) or now
    ns = body["metadata"].get("namespace")
    if pod is None:
        if now - since > LOST_POD_S:
            return await _failed(op, body, tc, now, "its pod went away before it answered")
        return None, f"confirming the target: evaluating {tc.get('checkpoint')}"
    term = _terminated(pod)
    if term is None:
        if now - since > contract.EVAL_TIMEOUT_S:
            await op.kube.delete("Pod", ns, pod["metadata"]["name"])
            return await _failed(op, body, tc, now, f"it took over {contract.EVAL_TIMEOUT_S:g} s")
        return None, f"confirming the target: evaluating {tc.get('checkpoint')}"
    await op.kube.delete("Pod", ns, pod["metadata"]["name"])
    try:
        res = contract.parse_result(term.get("message") or "", int(term.get("exitCode") or 0))
    except ValueError as e:
        return await _failed(op, body, tc, now, f"the evaluation of {tc.get('checkpoint')} failed: {e}")
    check = {
        "checkpoint": tc.get("checkpoint"),
        "policy_version": res["policy_version"],
        "episodes": res["episodes"],
        "mean_return": res["mean_return"],
        "std_return": res["std_return"],
        "mean_length": res["mean_length"],
        "seed": contract.SEED,
        "t": round(now, 3),
    }
    target = float(resolved.spec.stop.mean_return)
    if check["mean_return"] >= target:
        return check, ""
    why = f"its {check['episodes']} episodes return {check['mean_return']:.4g} < stop.meanReturn {target:g}"
    return await _failed(op, body, tc, now, why, check)


async def _failed(
    op: Operator, body: Any, tc: dict, now: float, why: str, check: Optional[dict] = None
) -> tuple[None, str]:
    """Not the target yet: training goes on; the next check waits and needs a newer policy."""
    done = int(tc.get("checkpointVersion", tc.get("version", 0)) or 0)
    out = {
        "version": int(tc.get("version", 0) or 0),
        "retryVersion": max(done, int(tc.get("retryVersion", -1))),
        "retryAt": st.iso(now + contract.RETRY_S),
        "count": int(tc.get("count", 0)) + 1,
        "last": check or {"error": why[:300]},
    }
    await _write(op, body, out)
    kopf.warn(body, reason="TargetNotConfirmed", message=f"{tc.get('checkpoint')}: {why}; training goes on"[:900])
    return None, f"confirming the target: not yet ({why})"


def _last(tc: dict) -> str:
    last = tc.get("last") or {}
    if "mean_return" in last:
        return f"{last.get('checkpoint')} returned {last['mean_return']:.4g}"
    return str(last.get("error") or "no answer")


def _terminated(pod: dict) -> Optional[dict]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return dict(term)
    return None


def _pod_named(body: Any, pods: list[dict]) -> Optional[dict]:
    """learner-0-0's running pod with an IP (None: not there to fetch from)."""
    want = pod_name(body["metadata"]["name"], *LEARNER)
    for p in pods:
        if (
            p["metadata"]["name"] == want
            and st.pod_phase(p) == "Running"
            and (p.get("status") or {}).get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        ):
            return p
    return None


def _metrics_port(resolved: Any) -> int:
    return b.pod_metrics_port(resolved, "learner", 0, "0")


async def _write(op: Operator, body: Any, tc: dict) -> None:
    if (body.get("status") or {}).get("targetCheck") == tc:
        return
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]

    def compute(fresh: dict) -> Optional[dict]:
        if (fresh.get("status") or {}).get("phase") in st.TERMINAL:
            return None
        return {"targetCheck": tc}

    await update_status(op, ns, name, compute)


def describe(check: dict) -> str:
    """The TargetReached message's account of the confirming evaluation."""
    return (
        f"; confirmed: {check['checkpoint']} (policy version {check['policy_version']}) returns "
        f"{check['mean_return']:.4g} over {check['episodes']} episodes"
    )


def passed_fields(body: Any, check: dict) -> dict:
    """The status fields the end writes with the evaluation that confirmed the target."""
    tc = dict((body.get("status") or {}).get("targetCheck") or {})
    tc.update(stage="passed", count=int(tc.get("count", 0)) + 1, last=check)
    return {"targetCheck": tc, "targetEvaluation": check}
