"""What a plan says about itself on its first screen: which figures are measured and which assumed
(`provenance`), and why every core and GPU it leaves unused stays unused (`unused`), each with a
figure.

The unused resources are explained by what the next step up would have bought, predicted like
any candidate (prediction.py) and judged by the budget rule (objective.py):

    one more group          (same processes; its actors fed, search.fed): the batch penalty ρ of
                            g + 1 learners against g, from the batch curve it cites
    one more actor a group  more production: nothing when the actors already cover TR_L / r
    a bigger CPU learner    the next size, along the measured thread curve
    GPU learners instead    (a plan without GPUs, G > 0): the best candidate with GPU learners

A step either does not fit (cores, GPUs or nodes left), would exceed spec.maxPolicyLag, or buys
gain = E'/E − 1 for k = R'/R times the resources where minMarginalGain x asks k^x − 1.
`improve` takes any such step that the rule prefers (the search's grid misses some sizes), so a
plan's explanation never names a step it should have taken.
"""

from __future__ import annotations

from typing import Optional

from tianji.control.planner import costmodel, objective
from tianji.control.planner.batchcurve import MEASURED, CurveUse
from tianji.control.planner.placement import pack, process_items
from tianji.control.planner.prediction import Shape
from tianji.control.planner.profile import Profile
from tianji.control.planner.search import LEARNER_CORES, Budget, Candidate, fed, predict_shape
from tianji.control.spec import TianJiJob

_EPS = 1e-9
MAX_STEPS = 256  # improve(): steps up the search's grid missed (each one group, actor or learner size)


def provenance(job: TianJiJob, p: Profile, curve: CurveUse, gpus_given: int, gpus_used: int) -> tuple:
    """(assumed, measured): the figures behind a plan, each a phrase naming where it comes from;
    the GPU figure first (where GPUs are given, it moves a plan most), then the per-core figures,
    the batch curve and the lag cost."""
    assumed, measured = [], []
    if gpus_given or gpus_used:
        if p.learner_sps_per_gpu is None:
            assumed.append("no learner GPU figure: GPU learners not considered (run tianji profile on the GPU)")
        elif p.gpu_assumed:
            assumed.append(
                f"learner GPU samples/s (no measurement for {p.gpu_device or 'this GPU'}; run tianji "
                f"profile on it; {p.learner_sps_per_gpu:,.0f} built in)"
            )
        else:
            measured.append(
                f"learner GPU {p.learner_sps_per_gpu:,.0f} samples/s on {p.gpu_device or 'a GPU'} "
                f"({p.gpu_source or p.source or 'the profile given'})"
            )
    if p.cpu_assumed:
        assumed.append(
            "actor frames/s and learner samples/s per core (built-in, from a 2-core dev machine; "
            "run tianji profile here)"
        )
    else:
        measured.append(f"actor frames/s and learner samples/s per core ({p.source or 'the profile given'})")
    if curve.kind == MEASURED:
        measured.append(f"frames to target against batch size ({curve.source()})")
    else:
        assumed.append(curve.source())
    if job.spec.algorithm.name == "ppo":
        assumed.append(
            f"PPO lag cost {costmodel.LAG_COST:.0%} more frames per version of policy lag beyond one (stated)"
        )
    return tuple(assumed), tuple(measured)


def _fits(sh: Shape, budget: Budget) -> Optional[str]:
    """None if `sh` fits the budget and packs onto its nodes; else what is short, in figures."""
    if sh.cores > budget.cpus + _EPS or sh.gpus > budget.gpus:
        need = f"{sh.cores:g} cores" + (f" and {sh.gpus} GPUs" if sh.gpus else "")
        return f"does not fit: needs {need} of {budget.cpus:g} cores, {budget.gpus} GPUs"
    if pack(process_items(*sh), list(budget.node_cpus), list(budget.node_gpus)) is None:
        return f"does not pack onto {len(budget.node_cpus)} node(s) of {budget.node_cpus[0]:g} cores"
    return None


def _steps(job: TianJiJob, p: Profile, c: Candidate, budget: Budget, curve: CurveUse) -> list[tuple]:
    """(label, resource, Shape, Candidate or None) for each step up from `c` (module docstring)."""
    sh = c.shape
    out = []
    g2 = sh._replace(g=sh.g + 1)
    na_fit = int((budget.cpus - g2.g * (g2.cl + g2.nb * g2.cb) + _EPS) // (g2.g * g2.ca)) if g2.ca else g2.na
    res = ("cores", "gpus") if sh.gl else ("cores",)
    out.append(
        (
            f"a group more ({g2.g})",
            res,
            g2,
            None if _fits(g2, budget) else fed(job, p, g2, budget, max(na_fit, g2.na), curve),
        )
    )
    a2 = sh._replace(na=sh.na + 1)
    out.append(
        (
            "an actor more a group",
            ("cores",),
            a2,
            None if _fits(a2, budget) else Candidate(a2, predict_shape(job, p, a2, budget, curve)),
        )
    )
    bigger = [x for x in LEARNER_CORES if x > sh.cl + _EPS]
    if not sh.gl and bigger:
        l2 = sh._replace(cl=bigger[0])
        out.append(
            (
                f"a {bigger[0]:g}-core learner",
                ("cores",),
                l2,
                None if _fits(l2, budget) else Candidate(l2, predict_shape(job, p, l2, budget, curve)),
            )
        )
    return out


def improve(job: TianJiJob, p: Profile, c: Candidate, budget: Budget, curve: CurveUse, x: float, max_lag) -> Candidate:
    """Steps up from `c` while a step scores above it: the budget rule, to the last digit (objective)."""
    g = budget.gpus
    for _ in range(MAX_STEPS):
        best = c
        for _, _, _, alt in _steps(job, p, c, budget, curve):
            if alt is None or (
                max_lag is not None
                and alt.pred["expected_policy_lag"] > max_lag
                and c.pred["expected_policy_lag"] <= max_lag
            ):
                continue
            if objective.score(alt, budget.cpus, g, x) > objective.score(best, budget.cpus, g, x) * (1 + _EPS):
                best = alt
        if best is c:
            return c
        c = best
    return c


def _verdict(alt: Candidate, c: Candidate, budget: Budget, x: float, max_lag) -> tuple:
    """(gain, asks, why) of a step that fits."""
    lag = alt.pred["expected_policy_lag"]
    if max_lag is not None and lag > max_lag >= c.pred["expected_policy_lag"]:
        return None, None, f"expected policy lag {lag:.1f} > maxPolicyLag {max_lag:g}: its samples would be dropped"
    g = budget.gpus
    k = objective.resources(alt, budget.cpus, g) / objective.resources(c, budget.cpus, g)
    gain, asks = alt.effective / c.effective - 1, k**x - 1
    why = f"{gain:+.0%} progress for {k:.3g}x the resources; minMarginalGain {x:g} asks {asks:+.0%}"
    return gain, asks, why + objective.close_call(alt, c, budget.cpus, g, x)


def _detail(label: str, job: TianJiJob, p: Profile, alt: Candidate, c: Candidate, curve: CurveUse) -> str:
    """The measured figure behind a step's gain."""
    r = job.spec.replay_ratio
    if label.startswith("a group"):
        w, w2 = c.pred["batch_ranks"], alt.pred["batch_ranks"]
        b = job.spec.algorithm.batch_size
        return (
            f"frames to target x{curve.ratio(w2) / curve.ratio(w):.3f} at effective batch {w2 * b:,} "
            f"against {w * b:,} ({curve.source()})"
        )
    if label.startswith("an actor"):
        return (
            f"production {c.pred['tr_a']:,.0f} frames/s already covers the learners' "
            f"{c.pred['tr_l']:,.0f} samples/s at replay ratio {r:g}"
            if c.pred["tr_a"] * r >= c.pred["tr_l"] * (1 - 1e-6)
            else f"production {c.pred['tr_a']:,.0f} -> {alt.pred['tr_a']:,.0f} frames/s"
        )
    if label.startswith("GPU"):
        src = "assumed" if p.gpu_assumed else f"measured on {p.gpu_device or 'a GPU'}"
        return f"GPU learner {p.learner_sps_per_gpu:,.0f} samples/s ({src})"
    t = costmodel.thread_curve(p.learner_thread_scaling)[-1][0]
    return (
        f"learner {c.pred['tr_l'] / (c.shape.g * c.shape.nl):,.0f} -> "
        f"{alt.pred['tr_l'] / (alt.shape.g * alt.shape.nl):,.0f} samples/s (thread curve measured at 1..{t})"
    )


def unused(
    job: TianJiJob, p: Profile, c: Candidate, cands: list, budget: Budget, curve: CurveUse, x: float, max_lag
) -> tuple:
    """Why the cores and GPUs `c` leaves unused stay so: one dict per step up (module docstring):
    resources (the unused ones it would spend: "cores", "gpus"), what, uses ([cores, GPUs] of the
    plan after the step), gain, asks (None where it does not fit or exceeds maxPolicyLag), why."""
    if c.cores >= budget.cpus - _EPS and c.gpus >= budget.gpus:
        return ()
    steps = _steps(job, p, c, budget, curve)
    if budget.gpus and not c.shape.gl:
        gpu = [k for k in cands if k.shape.gl]
        best = max(gpu, key=lambda k: objective.score(k, budget.cpus, budget.gpus, x)) if gpu else None
        steps.append(("GPU learners instead", ("gpus",), best.shape if best else None, best))
    out = []
    for label, res, sh, alt in steps:
        if sh is None:
            why = (
                "no GPU plan: the profile has no learner GPU figure"
                if p.learner_sps_per_gpu is None
                else "no plan with GPU learners fits the budget"
            )
            out.append({"resources": list(res), "what": label, "uses": None, "gain": None, "asks": None, "why": why})
            continue
        short = _fits(sh, budget)
        if short or alt is None:
            out.append(
                {
                    "resources": list(res),
                    "what": label,
                    "uses": [sh.cores, sh.gpus],
                    "gain": None,
                    "asks": None,
                    "why": short,
                }
            )
            continue
        gain, asks, why = _verdict(alt, c, budget, x, max_lag)
        if gain is not None:
            why += "; " + _detail(label, job, p, alt, c, curve)
        out.append(
            {
                "resources": list(res),
                "what": label,
                "uses": [alt.cores, alt.gpus],
                "gain": gain,
                "asks": asks,
                "why": why,
            }
        )
    return tuple(out)
