"""`tianji plan JOB.yaml [--cpus M] [--gpus G] [--nodes K --cpus-per-node C] [--profile FILE]
[--gpu-model NAME] [--json]`.

Loads the job and an optional profile (from `tianji profile`; otherwise the built-in
estimates); with GPUs, the learner GPU figure measured for the job (the profile's own, else
docs/device's, on a GPU named like --gpu-model when given; else the built-in speed-up, named as
assumed). Runs the balance planner and prints its first screen (what is assumed, on the first
line; what is measured; the plan; why every unused core and GPU stays unused, with figures),
then the tables and the runners-up (plans it considered and why they lost), or the plan as
JSON. Infeasible inputs print the planner's message on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from tianji.control.planner.plan import DEFAULT_PLAN_CPUS, Plan, PlanError, default_profile, load_profile, plan
from tianji.control.planner.profile import with_gpu_figure
from tianji.control.planner.sharedhost import plan_on_host
from tianji.control.spec import load_job


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.2f}"


def _fmt_times(x) -> str:
    return "never" if x is None else f"x{x:.2f}"


def _roles_table(name: str, p: Plan):
    from rich.table import Table

    t = Table(title=f"tianji plan: {name}")
    t.add_column("", style="bold")
    for role in ("actor", "buffer", "learner"):
        t.add_column(role, justify="right")
    t.add_row("processes per group", str(p.actors), str(p.buffers), str(p.learners))
    t.add_row("cores per process", f"{p.actor.cpu:g}", f"{p.buffer.cpu:g}", f"{p.learner.cpu:g}")
    t.add_row("GPUs per process", str(p.actor.gpu), str(p.buffer.gpu), str(p.learner.gpu))
    t.add_row("memory per process", p.actor.memory, p.buffer.memory, p.learner.memory)
    t.add_row("torch threads", str(p.actor.threads), str(p.buffer.threads), str(p.learner.threads))
    return t


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _count(x: float) -> str:
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _topology_line(p: Plan) -> str:
    learner = f"{p.learner.cpu:g} core" + ("s" if p.learner.cpu != 1 else "") + (
        f" + {p.learner.gpu} GPU" if p.learner.gpu else "")
    goal = (f"predicted time to target {_duration(p.time_to_target_s)}" if p.time_to_target_s is not None else
            "time to target relative only (no frames-to-target measured for this job's own target)")
    return (f"plan: {_n(p.groups, 'group')} x ({_n(p.actors, 'actor')}, {_n(p.buffers, 'buffer')}, "
            f"{_n(p.learners, 'learner')} of {learner}): {_count(p.cpus_used)} of {_count(p.cpus_given)} cores, "
            f"{p.gpus_used} of {p.gpus_given} GPUs; {goal}; frames x{p.frames_ratio:.2f} for the effective batch "
            f"{p.batch_size * p.groups * p.learners:,}, x{p.lag_cost:.2f} for policy lag")


def first_screen(p: Plan) -> list[str]:
    """What the plan assumes (first line), what it measured, the plan in one line, and why each
    unused core and GPU stays unused (explain.unused), each step up with its figure."""
    lines = ["assumed: " + ("; ".join(p.assumed) or "nothing: every figure is measured"),
             "measured: " + ("; ".join(p.measured) or "nothing: built-in estimates and stated rules only"),
             _topology_line(p)]
    if p.extrapolated:
        lines.append("extrapolated: " + "; ".join(p.extrapolated))
    left_c, left_g = max(0.0, p.cpus_given - p.cpus_used), max(0, p.gpus_given - p.gpus_used)
    if left_c < 1e-9 and not left_g:
        lines.append("unused: nothing: every core and GPU given is used")
        return lines
    what = [f"{_count(left_c)} of {_count(p.cpus_given)} cores"] if left_c >= 1e-9 else []
    what += [f"{left_g} of {p.gpus_given} GPUs"] if left_g else []
    lines.append(f"unused: {' and '.join(what)}; each step up, and why the plan does not take it"
                 + ("" if p.unused else " (explicit topology: yours to size)"))
    for u in p.unused:
        uses = f"{_count(u['uses'][0])} cores, {_n(u['uses'][1], 'GPU')}" if u["uses"] else "-"
        lines.append(f"  {u['what']:<24} ({uses}): {u['why']}")
    return lines


def _summary_rows(p: Plan, source: str, cpus: float, gpus: int, host: dict | None) -> list[tuple[str, str]]:
    rows = [
        ("given", f"{cpus:g} cores, {gpus} GPUs; profile: {source}"),
        ("groups", f"{p.groups} (links: within a group {p.group_link}, between groups {p.sync_link})"),
        ("cores / GPUs used", f"{p.cpus_used:g} / {p.gpus_used}"),
        ("batch size", str(p.batch_size)),
        ("produced (frames/s)", f"{_fmt_rate(p.produced_fps)} (actors could make {_fmt_rate(p.production_fps)})"),
        ("consumed (samples/s)", f"{_fmt_rate(p.consumed_sps)} (learners could take "
                                 f"{_fmt_rate(p.learner_capacity_sps)})"),
        ("replay ratio", f"{p.replay_ratio:.2f}"),
        ("expected policy lag", f"{p.expected_policy_lag:.1f} versions"),
        ("critical path (s/update)", f"sample {p.sample_seconds:.4g}  train {p.train_seconds:.4g}  "
                                     f"all-reduce {p.allreduce_seconds:.4g}  comm {p.comm_seconds:.4g}"),
        ("bottleneck", p.bottleneck + (f": the fragments' age (maxPolicyLag allows an update every "
                                       f"{p.lag_floor_seconds:.3g} s; shorter fragments or a looser bound lift it)"
                                       if p.lag_floor_seconds else "")),
        ("time to target", f"x{p.frames_ratio:.3g} frames for the batch ({p.batch_curve}), x{p.lag_cost:.3g} for "
                           f"lag: effective {_fmt_rate(p.effective_sps)} samples/s"
                           + (f", {_duration(p.time_to_target_s)}" if p.time_to_target_s is not None else "")),
        ("learner curve", f"measured at 1..{p.learner_threads_measured} threads; this learner: "
                          f"{p.learner.cpu:g} cores" + (" (GPU)" if p.learner.gpu else "")),
        ("extrapolated", "; ".join(p.extrapolated) or "nothing beyond the measured ranges (see assumed, above)"),
    ]
    if p.min_marginal_gain is not None:
        x = p.min_marginal_gain
        rows.append(("budget rule", f"minMarginalGain {x:g}: k x the resources must buy >= k^{x:g} x the "
                                    f"effective progress (2x: {2 ** x - 1:+.0%})"))
    if host:
        rows.append(("on one shared host", f"(tianji run: roles take turns, groupSync {host['group_sync']}) "
                                           f"produced {_fmt_rate(host['produced_fps'])} frames/s, consumed "
                                           f"{_fmt_rate(host['consumed_sps'])} samples/s, {host['bottleneck']}"))
    return rows


def _runners_up_table(p: Plan):
    from rich.table import Table

    t = Table(title="runners-up: plans considered and why they lost (time to target relative to the plan)")
    for col, just in (("groups x (actors, buffers, learners)", "left"), ("cores / GPUs", "right"),
                      ("effective /s", "right"), ("efficiency", "right"),
                      ("time to target", "right"), ("why it lost", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for r in p.runners_up:
        topo = r["topology"]
        t.add_row(f"{topo['groups']} x ({topo['actors']}, {topo['buffers']}, {topo['learners']}), "
                  f"{r['learner_cpu']:g}-core learner" + (" + GPU" if r["learner_gpu"] else ""),
                  f"{r['cpus_used']:g} / {r['gpus_used']}", _fmt_rate(r["effective_sps"]),
                  f"{r['efficiency']:.2f}", _fmt_times(r["time_to_target_vs_plan"]), r["lost"])
    return t


def _print_table(name: str, p: Plan, source: str, cpus: float, gpus: int, host: dict | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    s = Table(show_header=False, box=None)
    s.add_column(style="bold")
    s.add_column()
    for k, v in _summary_rows(p, source, cpus, gpus, host):
        s.add_row(k, v)
    c = Console(width=max(Console().width, 200))
    for line in first_screen(p):
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    c.print(_roles_table(name, p))
    c.print(s)
    if p.runners_up:
        c.print(_runners_up_table(p))


def budget(args: argparse.Namespace, job) -> tuple[float, int, int, Optional[float]]:
    """(cpus, gpus, nodes, cpus per node): each flag given, else the job's spec.resources, as
    `tianji run` and the operator plan it (cpus: resources.cpus, else DEFAULT_PLAN_CPUS)."""
    res = job.spec.resources
    cpus = args.cpus if args.cpus is not None else (res.cpus or DEFAULT_PLAN_CPUS)
    gpus = args.gpus if args.gpus is not None else res.gpus
    nodes = args.nodes if args.nodes is not None else res.nodes
    per_node = args.cpus_per_node if args.cpus_per_node is not None else res.cpus_per_node
    if args.cpus is None:
        origin = "spec.resources.cpus" if res.cpus else f"the default {DEFAULT_PLAN_CPUS:g} (no spec.resources.cpus)"
        print(f"tianji plan: budget {cpus:g} cores from {origin}, {gpus} GPUs; --cpus M plans for another",
              file=sys.stderr)
    return cpus, gpus, nodes, per_node


def plan_command(args: argparse.Namespace) -> int:
    job = load_job(args.job, getattr(args, "set", None) or [])
    cpus, gpus, nodes, cpus_per_node = budget(args, job)
    source = "built-in estimates"
    model = getattr(args, "gpu_model", None)
    try:
        if getattr(args, "profile", None):
            profile = load_profile(args.profile)
            source = args.profile
        else:
            profile = default_profile(job)
        if gpus or job.spec.resources.learner.gpu:  # the GPU figure: measured for the job where there is one
            profile = with_gpu_figure(job, profile, model)
        result = plan(job, cpus=cpus, gpus=gpus, nodes=nodes, cpus_per_node=cpus_per_node, profile=profile)
    except PlanError as e:
        print(f"tianji plan: infeasible: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # bad profile file
        print(f"tianji plan: bad profile: {e}", file=sys.stderr)
        return 2
    # One machine, no GPU learner: what `tianji run` would see, the roles sharing its cores.
    host = None
    if nodes == 1 and not result.learner.gpu:
        h = plan_on_host(job, result, profile, float(cpus))
        host = {k: h[k] for k in ("produced_fps", "consumed_sps", "bottleneck", "actor_share", "learner_share",
                                  "group_sync")}
    if args.json:
        out = result.to_json()
        out["profile"] = profile.to_json()
        if host:
            out["on_host"] = host
        print(json.dumps(out, indent=2))
    else:
        _print_table(job.name, result, source, cpus, gpus, host)
    return 0
