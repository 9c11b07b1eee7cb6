"""Render docs/benchmarks.md's result tables from the benchmark JSON kept in docs/results/.

    python -m bench.render_docs           # rewrite every generated block in docs/benchmarks.md
    python -m bench.render_docs --check   # exit 1, naming each block that differs from its JSON

A generated block sits between `<!-- report:NAME -->` and `<!-- /report:NAME -->`; the prose
around the markers is hand-written and left alone. Each JSON file carries the `command`, `date`
and `machine` (load) that produced it, and `plot` where a figure was drawn from it, so the file
is the single source of every figure in its block. One renderer per benchmark kind; BLOCKS
says which files each block renders.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from bench.harness import ROOT

DOC = ROOT / "docs" / "benchmarks.md"
MARKER = re.compile(r"<!-- report:([\w-]+) -->\n.*?<!-- /report:\1 -->", re.S)


def load(rel: str) -> dict:
    """A JSON file, or a JSONL file whose first line is {"meta": ...} and the rest rows."""
    text = (ROOT / rel).read_text()
    if rel.endswith(".jsonl"):
        meta, *rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {**meta["meta"], "rows": rows, "path": rel}
    return {**json.loads(text), "path": rel}


# --- formatting -------------------------------------------------------------------------

def num(x, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def pct(x, digits: int = 0) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def kilo(x) -> str:
    return "–" if x is None else f"{x / 1000:.1f}k"


def span(xs, fmt=num) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    lo, hi = fmt(min(xs)), fmt(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def provenance(d: dict) -> list[str]:
    """Where a figure comes from: file, command, date, machine and the load it recorded."""
    host = d.get("host", {})
    load_avg = host.get("loadavg") or host.get("loadavg_start") or d.get("loadavg_start")
    loads = [r.get("load1_before") for r in d.get("runs", d.get("rows", []))]
    load_txt = (f"; load average (1/5/15 min) {' / '.join(num(x, 1) for x in load_avg)}" if load_avg
                else f"; load before each run {span(loads, lambda x: num(x, 1))}" if any(loads) else "")
    commands = " then ".join(f"`{c}`" for c in d["command"].split("; "))  # one code span per command
    return [f"`{d['path']}`: {commands} ({d['date']}, {d['machine']}{load_txt})."]


def plot(d: dict, caption: str) -> list[str]:
    if not d.get("plot"):
        return []
    if not (ROOT / d["plot"]).is_file():
        raise FileNotFoundError(f"{d['path']}: plot {d['plot']} is missing")
    return ["", f"![{caption}]({Path(d['plot']).relative_to('docs')})"]


# --- one renderer per benchmark kind ----------------------------------------------------

def return_at(curve: list[dict], minutes: float):
    """The mean-100 return last recorded by `minutes` into the run."""
    return next((p["mean_return"] for p in reversed(curve) if p["t"] <= 60 * minutes
                 and p["mean_return"] is not None), None)


def render_pong(files: list[dict]) -> list[str]:
    d, = files
    at = {m: return_at(d["curve"], m) for m in (10, 20, 30, 40, 50, 60)}
    stale = d["dropped_samples"].get("stale", 0) / d["env_frames"]
    rows = [["agent steps in the run", f"{num(d['env_frames'])} in {num(d['wall_seconds'] / 60, 1)} min"],
            ["produced frames/s, consumed samples/s", f"{num(d['produced_fps'])}, {num(d['consumed_sps'])}"],
            ["policy lag mean / max", f"{num(d['policy_lag']['mean'], 1)} / {num(d['policy_lag']['max'])}"],
            ["dropped as stale", pct(stale, 1)],
            ["mean-100 return at " + ", ".join(f"{m}" for m in at) + " min",
             ", ".join(num(v, 1) for v in at.values())],
            ["return at the end; goal; random policy",
             f"**{num(d['return_last'], 1)}**; {num(d['goal_return'], 0)}; {num(d['random_policy_return'], 1)}"],
            ["device", f"{d['device']} ({d['name']}, {d['cpus']} cores)"]]
    if "seconds_to" in d:  # the goals' milestones (bench/pong.py since 2026-11-26)
        when = ["not reached" if v is None else f"{num(v / 60, 1)} min" for v in d["seconds_to"].values()]
        rows.insert(5, ["first reached mean-100 " + ", ".join(d["seconds_to"]), ", ".join(when)])
    ev = d.get("evaluation") or {}
    if ev.get("count"):
        rows.append(["in-run greedy evaluations; last, best mean return; evaluator restarts",
                     f"{ev['count']}; {num(ev['last']['return_mean'], 1)}, {num(ev['best_return_mean'], 1)}; "
                     f"{d['restarts'].get('evaluator', 0)}"])
    return provenance(d) + [""] + table(["Pong PPO", "result"], rows) + plot(d, "Pong PPO return against time")


def render_converge(files: list[dict]) -> list[str]:
    d, = files
    out = []
    for algo, r in d["results"].items():
        ms, runs = r["median_seconds"], r["runs"]
        rows = [[_label(d, k), f"{ms[k]['solved']} / {ms[k]['runs']}", num(ms[k]["300.0"], 1),
                 f"**{num(ms[k]['475.0'], 1)}**", ", ".join(num(x["seconds"].get("475.0"), 1) for x in runs[k])]
                for k in runs]
        pairs = [f"{_label(d, k.split('_over_')[0])} over {_label(d, k.split('_over_')[1])}: "
                 f"{', '.join(num(x, 2) for x in p['ratios'])} (median **{num(p['median'], 2)}**)"
                 for k, p in r["pairs"].items()]
        out += [f"CartPole {algo.upper()}, seeds {', '.join(map(str, next(iter(r['pairs'].values()))['seeds']))}; "
                "seconds from process launch:", ""] + table(
            ["system", "reached 475", "median s to 300", "median s to 475", "s to 475 per seed"], rows) + [
            "", "Time to 475, per seed pair: " + "; ".join(pairs) + "."]
    return provenance(d) + [""] + out


def render_flood(files: list[dict]) -> list[str]:
    return [line for d in files for line in _flood_table(d) + [""]][:-1]


def _flood_table(d: dict) -> list[str]:
    rows = [[str(r["round"]), "clean" if r["hostile"] == "off" else r["hostile"],
             "yes" if r["reached_target"] else "**no**", num(r["seconds_to_target"], 1),
             num(r["other_actor_sent_sps"]), num(r["dropped_over_share_by_sender"].get("actor-0-0")),
             num(r["load1_before"], 1)] for r in d["runs"]]
    lines = []
    for mode, median in d["median_time_to_target_ratio"].items():
        per = "; ".join(f"{num(p[mode]['time_to_target_ratio'], 2)} (actor-0-1's throughput "
                        f"{num(p[mode]['other_actor_throughput_ratio'], 2)})" for p in d["pairs"])
        missed = sum(1 for r in d["runs"] if r["hostile"] == mode and not r["reached_target"])
        note = (f" ({missed} of {len(d['pairs'])} missed the target within the budget: slower than any)"
                if missed else "")
        lines.append(f"- {mode} over clean, time to target per round: {per}; median **{num(median, 2)}**{note}.")
    return provenance(d) + [f"Each worker's CPU bound: `{d['cpu_limits']}`.", ""] + table(
        ["round", "run", "target confirmed", "s to target", "actor-0-1 samples/s sent",
         "actor-0-0 samples over its share", "load before"], rows) + [""] + lines


def render_cpu_limits(files: list[dict]) -> list[str]:
    d, = files
    rows = []
    for job, modes in d["summary"].items():
        for mode, m in modes.items():
            rows.append([job, mode, f"{m['reached']} / {m['runs']}", num(m["median_seconds_to_target"], 1),
                         ", ".join(num(x, 2) for x in m["over_off_per_round"]) or "–",
                         span([r["load1_before"] for r in d["runs"] if r["job"] == job and r["mode"] == mode],
                              lambda x: num(x, 1))])
    return provenance(d) + [""] + table(
        ["job", "TIANJI_CPU_LIMITS", "reached target", "median s to target", "over off, per round",
         "load before"], rows)


def render_omp_wait(files: list[dict]) -> list[str]:
    d, = files
    arms = list(next(iter(d["median_consumed_sps"].values())))
    rows = [[topo, *(num(med[arm]) for arm in arms),
             " / ".join(num(r["load1_before"], 1) for r in d["runs"] if r["topology"] == topo)]
            for topo, med in d["median_consumed_sps"].items()]
    return provenance(d) + [""] + table(
        ["CartPole PPO, 2-thread learners", *(f"{a}: samples/s (median)" for a in arms), "load before each run"], rows)


PEER_LABELS = {"tianji": "TianJi, examples/pong-ppo.yaml with bench/pong.py's CPU preset",
               "sample-factory": "Sample Factory 2.1.1 APPO", "cleanrl-envpool": "CleanRL-style PPO on EnvPool 0.8.4",
               "sb3": "Stable-Baselines3 2.9.2 PPO, rl-zoo's settings"}


def run_machine(d: dict, r: dict) -> str:
    """The machine run `r` of atari_peers result `d` ran on (a run kept before runs named it: its file's)."""
    return r.get("machine", d["machine"])


def newest_runs(d: dict) -> dict[str, dict]:
    """Each system's newest run with a result (the runs are in the order they ran)."""
    return {r["system"]: r for r in d["runs"] if "curve" in r}


def render_atari_peers(files: list[dict]) -> list[str]:
    d, = files
    marks = [m for m in ("10", "20", "60") if float(m) <= d["minutes"]]
    mixed = len({run_machine(d, r) for r in d["runs"]}) > 1  # then each row names its machine
    rows, notes = [], []
    for r in d["runs"]:
        name = (PEER_LABELS.get(r["system"], r["system"]) + (f", round {r['round']}" if d["rounds"] > 1 else "")
                + (f" ({r['note']})" if r.get("note") else ""))
        if "curve" not in r:
            why = (r.get("skipped") or r.get("failed") or "no result").splitlines()[0]
            notes.append(f"- {name}: did not run: {why}")
            continue
        at = r["return_at_minutes"]
        goal = r["seconds_to_goal"]
        rows.append([name, *[num(at.get(m), 1) for m in marks],
                     "not reached" if goal is None else f"{num(goal / 60, 1)} min", kilo(r["frames"]),
                     f"{num(r['frames_per_second'])} ({num(r['steady_frames_per_second'])})",
                     num(r["load1_before"], 2), " ".join(filter(None, (r.get("day"), r["started"]))),
                     *([run_machine(d, r)] if mixed else [])])
    header = ["system", *[f"return at {m} min" for m in marks], f"first mean-100 >= {num(d['goal_return'])}",
              "agent steps", "steps/s overall (2nd half)", "load before", "started", *(["machine"] if mixed else [])]
    return (provenance(d) + [""] + table(header, rows) + ([""] + notes if notes else [])
            + plot(d, "Pong: mean return of the last 100 games against time and agent steps, per system"))


def _zoo_arm(d: dict, arm: str) -> str:
    """A zoo_settings arm's name: the job, with its variant's --sets."""
    sets = d["variants"].get(arm[len("tianji_"):], [])
    return "the job" + (f" with {', '.join(f'`{x}`' for x in sets)}" if sets else "")


def _zoo_cell(r: dict | None) -> str:
    """One run: frames to the target (SB3's at its rollout's end too) and seconds from launch."""
    if not r:
        return "–"
    if not r.get("reached"):
        return "not reached"
    end = f" ({num(r['frames_rollout_end'])})" if r.get("frames_rollout_end") else ""
    return f"{num(r['frames'])}{end}, {num(r.get('seconds'), 1)} s"


def _zoo_staleness(d: dict, arm: str, runs: list[dict]) -> str:
    deps = sorted({r.get("dependencies") or "–" for r in runs})
    return (f"- TianJi, {_zoo_arm(d, arm)}: dependencies {', '.join(deps)}; dropped as stale "
            f"{span([r.get('dropped_stale') for r in runs], num)} samples per run, mean lag "
            f"{span([r.get('policy_lag_mean') for r in runs], lambda x: num(x, 2))}.")


def render_zoo_settings(files: list[dict]) -> list[str]:
    d, = files
    arms = list(dict.fromkeys(r["arm"] for r in d["runs"]))
    by = {(r["arm"], r["seed"]): r for r in d["runs"]}
    seeds = list(dict.fromkeys(r["seed"] for r in d["runs"]))
    names = {a: "SB3, rl-zoo's entry" if a == "sb3" else f"TianJi, {_zoo_arm(d, a)}" for a in arms}
    rows = [[seed, *(_zoo_cell(by.get((a, seed))) for a in arms)] for seed in seeds]
    lines = [_zoo_staleness(d, a, [r for r in d["runs"] if r["arm"] == a]) for a in arms if a != "sb3"]
    for what, label in (("frames", "frames over SB3's"),
                        ("frames_rollout_end", "frames over SB3's at the end of the rollout it crossed in"),
                        ("seconds", "seconds over SB3's")):
        per = [f"{_zoo_arm(d, key.partition('_over_sb3_')[0])} **{num(v['median'], 2)}**"
               + (f", geometric mean {num(v['geomean'], 2)}" if v.get("geomean") else "")
               + f" ({', '.join(num(x, 2) for x in v['ratios'])})"
               for key, v in d["pairs"].items() if key.endswith(f"_over_sb3_{what}")]
        if per:
            lines.append(f"- TianJi's {label}, median of the seed pairs (per seed): " + "; ".join(per) + ".")
    about = (f"Each cell: frames to the first mean-100 ≥ {num(d['target'])}, then seconds from launch; "
             "in parentheses, SB3's frames at the end of the rollout it crossed in.")
    return provenance(d) + ["", about, ""] + table(["seed", *(names[a] for a in arms)], rows) + [""] + lines


LABELS = {"tianji_hand": "TianJi, the example", "sb3": "SB3, rl-zoo's settings",
          "sb3_tianji_settings": "SB3, the example's settings"}


def _label(d: dict, key: str) -> str:
    """A converge run's row name: known systems by name, --variant runs by their overrides."""
    sets = d.get("variants", {}).get(key)
    return LABELS.get(key) or (f"TianJi, the example with {', '.join(f'`{x}`' for x in sets)}" if sets else key)


def render_learner_step(files: list[dict]) -> list[str]:
    d, = files
    u = d["update"]
    rows = [[p["threads"], num(p["samples_per_s"]["default"]), f"**{num(p['samples_per_s']['channels_last'])}**",
             f"{num(p['speedup'], 2)}x"] for p in d["points"]]
    return provenance(d) + ["", f"One PPO update of {num(u['batch'])} samples ({u['epochs']} epochs of minibatches of "
                                f"{u['minibatch']}) on the Nature CNN, samples/s:", ""] + table(
        ["torch threads", "default layout", "channels-last input (the default now)", "speed-up"], rows)


def render_actor_profile(files: list[dict]) -> list[str]:
    d, = files
    rows = [[p["num_envs"], num(p["env_step_us"]), num(p["policy_us"]), num(p["forward_fp32_us"]),
             num(p["forward_bf16_us"]), num(p["loop_us"]), f"**{num(p['ratio_per_cpu_second'], 2)}**"]
            for p in d["points"]]
    return provenance(d) + [""] + table(
        ["envs per actor", "env step µs", "policy µs", "fp32 forward µs", "bf16 forward µs", "whole loop µs",
         "actor/bare-env frames per CPU s"], rows) + [
        "", f"CPU µs per agent step. The Nature CNN is {num(d['nature_cnn_mflop_per_frame'], 1)} MFLOP per "
            f"frame; this core's float32 matmul peak measured {num(d['matmul_gflops_fp32'])} GFLOP/s (bfloat16: "
            f"{num(d['matmul_gflops_bf16'])}), so float32 inference costs at least "
            f"{num(d['inference_bound_fp32_us'])} µs per frame and the ratio is bounded by "
            f"**{num(d['ratio_bound_fp32'], 2)}**."]


_BF16_FORWARDS = (("forward_bf16_module_us", "bf16 module forward µs"), ("forward_bf16_us", "bf16 fused forward µs"))


def render_actor_series(files: list[dict]) -> list[str]:
    """Several bench.actor_profile runs of one command back to back: per run, the load before, the env
    step and each runtime's actor/bare-env ratio, timed in blocks and side by side; then the medians.
    Forwards: float32 torch's, and the bf16 copy's (a run of bf16) or each runtime's own."""
    d, = files
    runs = d["runs"]
    names = list(runs[0]["ratio_by_inference"])
    n = str(runs[0]["points"][0]["num_envs"])
    own = not any(k.endswith(":bfloat16") for k in names)

    def fwd(r: dict, key: str) -> str:
        return num(median([p[key] for ps in r["by_inference"].values() for p in ps]))

    synced = [k for k in names if runs[0]["by_inference"][k][0].get("policy_sync_us") is not None]

    def forwards(r: dict) -> list[str]:
        if own:
            return [*(num(r["by_inference"][k][0]["forward_runtime_us"]) for k in names),
                    *(num(r["by_inference"][k][0]["policy_sync_us"] / 1e3, 1) for k in synced)]
        return [fwd(r, key) for key, _ in _BF16_FORWARDS]

    def ratios(r: dict, k: str) -> str:
        return f"{num(r['ratio_by_inference'][k][n], 2)} / {num(r['ratio_side_by_side_by_inference'][k][n], 2)}"

    def medians(k: str) -> str:
        block, side = (median([r[key][k][n] for r in runs])
                       for key in ("ratio_by_inference", "ratio_side_by_side_by_inference"))
        return f"{num(block, 2)} / **{num(side, 2)}**"

    heads = ([f"{k} forward µs" for k in names] + [f"{k}: a new version, ms" for k in synced] if own
             else [h for _, h in _BF16_FORWARDS])
    rows = [[r["date"][11:], num(r["host"]["loadavg"][0], 1), num(r["points"][0]["env_step_us"]),
             *(ratios(r, k) for k in names), fwd(r, "forward_fp32_us"), *forwards(r)] for r in runs]
    rows.append(["median", "", "", *(medians(k) for k in names), "", *[""] * len(heads)])
    bound = span([r["ratio_bound_fp32"] for r in runs], lambda x: num(x, 2))
    over = "" if own else ", the median over the run's runtimes"
    return provenance(d) + ["", d["note"], ""] + table(
        ["run (UTC)", "load before", "env step µs", *(f"ratio, {k}" for k in names), "fp32 torch forward µs",
         *heads], rows) + [
        "", f"Actor/bare-env frames per CPU second at {n} envs: timed in blocks (the env alone, then the loop; "
            f"against the mean env step of the run's runtimes) / side by side (`ratio_side_by_side`: a "
            f"fragment's worth of env steps and one fragment in alternation). Forwards per frame{over}. "
            f"The float32 bound: {bound}."]


def render_actor_runtime(files: list[dict]) -> list[str]:
    d, = files
    ratio = d.get("ratio_if_onnxruntime", {})
    rows = [[p["batch"], num(p["torch_us"]), f"**{num(p['onnxruntime_us'])}**", f"{num(p['speedup'], 2)}x",
             f"{p['max_abs_logit_diff']:.0e}", num(ratio.get(str(p["batch"])), 2)] for p in d["points"]]
    return provenance(d) + [""] + table(
        ["envs per actor", "torch µs per frame", f"ONNX Runtime {d['onnxruntime']} µs per frame", "speed-up",
         "largest logit difference", "actor/bare-env ratio it would give"], rows) + [
        "", f"A new policy version would cost ONNX Runtime a session rebuilt with the new weights: "
            f"{num(d['rebuild_ms'], 1)} ms."] + _lower_precision(d.get("lower_precision"))


LOWER = {"onnxruntime_fp32": "ONNX Runtime, float32", "int8_all": "ONNX Runtime, int8 convolutions and matmuls",
         "int8_linear": "ONNX Runtime, int8 matmuls only", "bf16_torch": "torch, bfloat16 copy"}


def _lower_precision(points) -> list[str]:
    """actor_runtime --lower-precision: per batch, CPU µs per frame and the outputs' distance from float32."""
    if not points:
        return []
    rows = [[p["batch"], LOWER.get(k, k), num(v["us"]), f"{v['max_abs_logit_diff']:.0e}", f"{v['mean_abs_dlogp']:.0e}"]
            for p in points for k, v in p.items() if k != "batch"]
    return ["", "Lower precisions, timed interleaved with float32 ONNX Runtime (`--lower-precision`), "
                "against float32 torch's outputs:", ""] + table(
        ["envs per actor", "forward", "µs per frame", "largest logit difference", "mean |Δ log π|"], rows)


def render_groupsync(files: list[dict]) -> list[str]:
    out = []
    for d in files:
        runs = d["runs"]
        by = {m: [r for r in runs if r["mode"] == m] for m in ("average", "allreduce")}
        sps = {m: {r["seed"]: r["consumed_sps"] for r in rs} for m, rs in by.items()}
        ratios = [sps["average"][s] / sps["allreduce"][s] for s in sorted(sps["average"]) if s in sps["allreduce"]]
        rows = [[m, f"{sum(r['reached_target'] for r in rs)} / {len(rs)}",
                 num(median([r["seconds_to_target"] for r in rs]), 1),
                 span([r["seconds_to_target"] for r in rs], lambda x: num(x, 0)),
                 span([r["env_frames"] for r in rs if r["reached_target"]], kilo),
                 num(median([r["consumed_sps"] for r in rs]))] for m, rs in by.items()]
        out += provenance(d) + [""] + table(
            ["groupSync", "reached 475", "median s to 475", "s to 475", "frames to 475", "median consumed samples/s"],
            rows) + ["", "average/allreduce consumed samples/s per seed: " + ", ".join(num(x, 2) for x in ratios), ""]
    return out[:-1]


def load_label(d: dict) -> str:
    return f"load {span([r['load1_before'] for r in d['runs']], lambda x: num(x, 1))}"


def _ablation_columns(d: dict) -> list[tuple[str, dict, list[dict]]]:
    """(column label, the mode's summary, the mode's runs) for each mode of one ablation file."""
    (_, s), = d["summary"].items()
    return [(f"{mode}, {load_label(d)}", m, [r for r in d["runs"] if r["mode"] == mode])
            for mode, m in s["modes"].items()]


RATIO = {"time_to_target_strict_over_relaxed": "strict/relaxed time to target",
         "frames_to_target_strict_over_relaxed": "strict/relaxed frames to target",
         "consumed_sps_relaxed_over_strict": "relaxed/strict consumed samples/s",
         "produced_fps_relaxed_over_strict": "relaxed/strict produced frames/s"}


def render_ablation(files: list[dict]) -> list[str]:
    cols = [c for d in files for c in _ablation_columns(d)]
    rows = [["reached target"] + [f"{m['reached']} / {m['runs']}" for _, m, _ in cols],
            ["seconds to target (median)"] + [num(m["seconds_to_target_median"], 1) for _, m, _ in cols],
            ["frames to target (median)"] + [kilo(m["frames_to_target_median"]) for _, m, _ in cols],
            ["produced frames/s, whole run (median)"] + [num(m["produced_fps_median"]) for _, m, _ in cols],
            ["consumed samples/s, whole run (median)"] + [num(m["consumed_sps_median"]) for _, m, _ in cols],
            ["consumed samples/s, steady (median)"] + [num(m["steady_consumed_sps_median"]) for _, m, _ in cols],
            ["mean policy lag (median)"] + [num(m["policy_lag_mean_median"], 2) for _, m, _ in cols],
            ["dropped"] + [span([r["dropped_fraction"] for r in rs], pct) for _, _, rs in cols],
            ["policy versions"] + [span([r["policy_version"] for r in rs]) for _, _, rs in cols]]
    out = []
    for d in files:
        out += provenance(d)
    out += [""] + table([""] + [c for c, _, _ in cols], rows)
    for d in files:
        (_, s), = d["summary"].items()
        ratios = s["per_seed_ratios"]
        out += ["", f"Per seed pair, {load_label(d)}: " + "; ".join(
            f"{RATIO[k]} {', '.join(num(x, 2) for x in v)} (median **{num(s['median_ratios'][k], 2)}**)"
            for k, v in ratios.items() if v) + "."]
    for d in files:
        out += plot(d, f"{load_label(d)}: relaxed against strict")
    return out


def render_variants(files: list[dict]) -> list[str]:
    d, = files
    rows = [[r["variant"], r["seed"], num(r["seconds_to_target"], 1), kilo(r["frames"]), num(r["lag_mean"], 2),
             pct(r["dropped_fraction"]), num(r["consumed_sps"])] for r in d["rows"]]
    return provenance(d) + [""] + table(
        ["relaxed variant", "seed", "s to −100", "frames to −100", "mean lag", "dropped", "consumed samples/s"], rows)


def render_transport(files: list[dict]) -> list[str]:
    rows = []
    for d in files:
        for r in d["results"]:
            w, b = r["wire_cpu_us_per_msg"], r["base_wire_cpu_us_per_msg"]
            rows.append([f"{r['bytes'] // 1024} KB", d["encryption"], r["transport"],
                         f"{num(w['recv_best'], 1)} / {num(b['recv_best'], 1)}",
                         f"{num(w['send_best'], 1)} / {num(b['send_best'], 1)}",
                         f"{num(r['cpu_ratio'], 3)} / {num(r['base_cpu_ratio'], 3)}",
                         f"{num(r['wire_MBps'])} / {num(r['raw_MBps'])}"])
    out = [line for d in files for line in provenance(d)]
    return out + [""] + table(["size", "encryption", "transport", "receive µs: this / main", "send µs: this / main",
                               "CPU ratio to raw pyzmq: this / main", "MB/s: wire / raw pyzmq"], rows)


def _errors(p: dict) -> str:
    return " / ".join(f"{100 * e:+.0f}" for e in p["rel_error"].values()) + " %"


def render_scaling(files: list[dict]) -> list[str]:
    d, = files
    rows = []
    for p in d["points"]:
        m, pr = p.get("measured"), p["predicted"]
        rows.append([p["sweep"], p["point"], num(p.get("background"), 1),
                     " / ".join(num(m[k]) for k in pr if k != "bottleneck") if m else p.get("error", "–"),
                     " / ".join(num(pr[k]) for k in pr if k != "bottleneck"),
                     _errors(p) if m else "–", f"{m['bottleneck'] if m else '–'} / {pr['bottleneck']}"])
    g = d.get("given_measured_cpu")
    keys = [k for k in d["points"][0]["predicted"] if k != "bottleneck"]
    given = (f"; predicted from the CPU each role was measured to get: {pct(g['median_abs_error'], 1)} "
             f"(max {pct(g['max_abs_error'], 1)})" if g else "")
    return provenance(d) + [""] + table(
        ["sweep", "point", "background procs", f"measured {' / '.join(keys)}", "predicted", "error",
         "bottleneck measured / predicted"], rows) + [
        "", f"Median absolute error **{pct(d['median_abs_error'], 1)}** (max {pct(d['max_abs_error'], 1)}), "
            f"bottleneck kind right at {d['bottleneck_agreement']} points{given}."
    ] + plot(d, "measured against predicted")


def _random_errors(d: dict, keep) -> tuple[int, list[float], list[bool]]:
    done = [p for p in d["points"] if "measured" in p and keep(p)]
    errs = [abs(e) for p in done for e in p["rel_error"].values()]
    return len(done), errs, [p["measured"]["bottleneck"] == p["predicted"]["bottleneck"] for p in done]


def render_validation(files: list[dict]) -> list[str]:
    rows = []
    for d in files:
        done = [p for p in d["points"] if "measured" in p]
        kinds = d.get("bottleneck_agreement") or d["kind_accuracy"]
        rows.append([d["label"], f"{len(done)} of {len(d['points'])}", pct(d["median_abs_error"]),
                     pct(d["max_abs_error"]), kinds.replace("/", " of ")])
        if "kind_accuracy" in d:  # the random run: its one-thread learners apart
            n, errs, kinds1 = _random_errors(d, lambda p: p["topology"]["threads"] == 1)
            total = len([p for p in d["points"] if p["topology"]["threads"] == 1])
            rows.append([d["label"].split(".")[0] + ", one-thread learners only", f"{n} of {total}",
                         pct(median(errs)), pct(max(errs)), f"{sum(kinds1)} of {len(kinds1)}"])
    out = [line for d in files for line in provenance(d)]
    return out + [""] + table(["run", "points measured", "median abs. error", "max", "bottleneck kind right"],
                              rows) + [line for d in files for line in plot(d, f"planner validation: {d['label']}")]


def _topology(t: dict, planned: bool) -> str:
    g = t["groupSync"]["mode"]
    return ("**planned** (`topology: auto`)" if planned else "random") + (
        f": {t['groups']} group(s) ({g}), {t['actors']} actor(s), {t['buffers']} buffer(s), {t['learners']} learner(s)")


def _missed(r: dict, budget_s: float) -> str:
    """Why a time-to-target run has no time: out of the job's frames (its stop.envFrames), or of seconds."""
    if r.get("exit_reason") == "frames":
        return f"not in its {kilo(r['env_frames'])} frames ({num(r['wall_seconds'], 1)} s)"
    return f"not in {num(budget_s)} s"


def render_time_to_target(files: list[dict]) -> list[str]:
    d, = files
    rows = []
    for algo, res in d["results"].items():
        for r, planned in [(res["planned"], True)] + [(x, False) for x in res["random"]]:
            sets = [s.split("=", 1) for s in r["set"]]
            extra = ", ".join(f"{k.split('.')[-2]}.{k.split('.')[-1]}={v}" for k, v in sets
                              if k.startswith(("spec.env.numEnvs", "spec.resources.learner.threads")))
            secs = num(r["seconds_to_target"], 1) if r["reached_target"] else _missed(r, d["budget_s"])
            rows.append([algo, _topology(r["topology"], planned) + (f"; {extra}" if extra else ""),
                         f"**{secs}**" if planned else secs, kilo(r["env_frames"])])
    return provenance(d) + [""] + table(["algo", "topology", "seconds to target", "env frames"], rows)


def render_profiles(files: list[dict]) -> list[str]:
    rows = [[f"`{d['path']}`", d["job"], d["date"], " / ".join(num(x, 1) for x in d["host"]["loadavg"]),
             num(d["actor_fps_per_core"]), num(d["learner_sps_per_core"]), num(1e6 * d["message_seconds"]),
             num(d["learner_thread_scaling"].get("2"), 2)] for d in files]
    return ["Command, per file: " + "; ".join(f"`{d['command']}`" for d in files) + ".", ""] + table(
        ["profile", "job", "date", "load (1/5/15 min)", "actor frames/s per core", "learner samples/s per core",
         "µs per message", "2-thread learner speed-up"], rows)


def render_headline(files: list[dict]) -> list[str]:
    peers, conv, *ablations = files
    ppo = conv["results"]["ppo"]
    pair = ppo["pairs"]["tianji_hand_over_sb3"]
    speed = [f"{load_label(d)} **{num(median_ratio(d), 2)}**" for d in ablations]
    tj_machine = run_machine(peers, newest_runs(peers)["tianji"])
    rows = [[f"Pong PPO, {num(peers['minutes'])} minutes on {tj_machine}, beside its "
             "peers one after another ([peers](#pong-against-its-peers))", pong_hour(peers),
             peers["date"].split("; ")[-1][:10]],
            ["Relaxed vs strictly ordered (`spec.dependencies: strict`), PPO: strict's time to target over "
             "relaxed's, median of seed pairs (above 1: relaxed faster; [ablation](ablation.md))",
             "; ".join(f"{next(iter(d['summary']))} at {s}" for d, s in zip(ablations, speed)),
             ablations[0]["date"][:10]],
            [f"CartPole PPO to mean-100 ≥ 475 from launch, TianJi's time over SB3's (rl-zoo settings), "
             f"{len(pair['seeds'])} seed pairs", f"median **{num(pair['median'], 2)}** (TianJi "
             f"{num(ppo['median_seconds']['tianji_hand']['475.0'], 1)} s, "
             f"SB3 {num(ppo['median_seconds']['sb3']['475.0'], 1)} s)",
             conv["date"][:10]]]
    return table(["what", "result", "when"], rows) + [
        "", "From " + ", ".join(f"`{d['path']}`" for d in files) + "; commands and machines in the sections below."]


PEER_SHORT = {"sample-factory": "Sample Factory", "cleanrl-envpool": "CleanRL/EnvPool", "sb3": "SB3"}


def pong_hour(d: dict) -> str:
    """TianJi's newest run at the budget (return at the end and at 10 min, first -10, steps/s), then
    each peer's newest: its return at the end and its first -10."""
    newest = newest_runs(d)
    end = f"{d['minutes']:g}"

    def goal(r: dict) -> str:
        s = r["seconds_to_goal"]
        return "not reached" if s is None else f"{num(s / 60, 1)} min"

    tj = newest["tianji"]
    out = (f"TianJi: mean-100 return **{num(tj['return_at_minutes'].get(end), 1)}** at {end} min "
           f"({num(tj['return_at_minutes'].get('10'), 1)} at 10), {num(d['goal_return'])} first at {goal(tj)}, "
           f"{num(tj['frames_per_second'])} steps/s")
    def where(r: dict) -> str:  # a peer measured on another machine than TianJi's run says so
        m = run_machine(d, r)
        return "" if m == run_machine(d, tj) else f", on {m}"

    others = [f"{PEER_SHORT.get(s, s)} {num(r['return_at_minutes'].get(end), 1)} ({goal(r)}, "
              f"{num(r['frames_per_second'])} steps/s{where(r)})" for s, r in newest.items() if s != "tianji"]
    return out + ("; peers at the end (first -10, steps/s): " + ", ".join(others) if others else "")


def median_ratio(d: dict) -> float:
    (_, s), = d["summary"].items()
    return s["median_ratios"]["time_to_target_strict_over_relaxed"]


def device_provenance(files: list[dict]) -> list[str]:
    """One line per command: the files it wrote and its date; then each GPU machine and its files."""
    by: dict[tuple, list[str]] = {}
    machines: dict[str, list[str]] = {}
    for d in files:
        name = f"`{Path(d['path']).name}`"
        by.setdefault((d["command"], d["date"]), []).append(name)
        m = d["machine"]
        where = (f"{m['gpu']}, driver {m['driver']}, CUDA {m['cuda']}, torch {m['torch']}, {m['cores']} cores "
                 f"({m['cpu']})")
        machines.setdefault(where, []).append(name)
    return [f"{', '.join(names)}: `{cmd}` ({date})." for (cmd, date), names in by.items()] + [""] + [
        f"Device of {', '.join(names)}: {where}." for where, names in machines.items()]


def _gpu_learner(prof: list[dict]) -> list[str]:
    def update(d: dict) -> dict:
        return d["learner_gpu"]["candidates"][str(d["batch_size"])]

    rows = [[f"`{Path(d['path']).name}`", d["algorithm"], num(update(d)["samples_per_update"]),
             d["learner_gpu_precision"], f"**{num(d['learner_sps_per_gpu'])}**",
             num(1e3 * update(d)["seconds_per_update"], 1), num(d["learner"]["sps"])] for d in prof]
    fp32, bf16 = (next(d for d in prof if d["path"].endswith(f"-{p}.json")) for p in ("fp32", "bf16"))
    return table(["profile", "algo", "samples per update", "precision", "GPU learner samples/s", "ms per update",
                  "CPU learner samples/s (1 thread)"], rows) + [
        "", "bf16 over fp32, the two follow-up profiles: "
            f"**{num(bf16['learner_sps_per_gpu'] / fp32['learner_sps_per_gpu'], 2)}x**."]


def _gpu_scaling(d: dict) -> list[str]:
    rows = [[p["actors"], f"**{num(p['steady']['consumed_sps'])}**", num(p["steady"]["produced_fps"]),
             num(p["steady"]["to_t"] - p["steady"]["from_t"], 1),
             ", ".join(f"{k} {kilo(v)}" for k, v in sorted(p["dropped_samples"].items())) or "none",
             f"{num(p['policy_lag']['mean'], 1)} / {num(p['policy_lag']['max'])}"] for p in d["points"]]
    return table(["actors", "consumed samples/s", "produced frames/s", "steady window s", "dropped (whole run)",
                  "lag mean / max"], rows)


def _gpu_vs_sb3(tj: dict, sb3: dict) -> list[str]:
    r, t = tj["run"], tj["run"]["resolved"]["topology"]
    rows = [[f"TianJi, `topology: auto` ({t['groups']} group: {t['actors']} actors, {t['buffers']} buffer, "
             f"{t['learners']} GPU learner)", num(r["env_frames"]), num(r["max_seconds"], 1),
             f"**{num(r['env_frames'] / r['max_seconds'])}**", num(r["mean_return"], 2)],
            [f"SB3 PPO CnnPolicy, {sb3['settings']['n_envs']} {sb3['settings']['vec_env']} envs "
             f"(startup {num(sb3['startup_seconds'], 1)} s not counted)", num(sb3["env_frames"]),
             num(sb3["seconds"], 1), f"**{num(sb3['frames_per_second'])}**", num(sb3["mean_return"], 2)]]
    return table(["system", "frames", "seconds", "frames/s", "mean return (last 100 episodes)"], rows) + [
        "", f"TianJi over SB3, frames/s: **{num(r['env_frames'] / r['max_seconds'] / sb3['frames_per_second'], 2)}x**. "
            f"{num(sb3['seconds'])} s is far too short for Pong to learn: both returns are those of an untrained "
            "policy and compare nothing."]


def _gpu_ab(d: dict) -> list[str]:
    rows = []
    for arm, a in d.items():
        if not isinstance(a, dict) or "overrides" not in a:
            continue
        o = dict(s.split("=", 1) for s in a["overrides"])
        rows.append([arm, o["spec.topology.buffers"], o["spec.resources.learner.threads"],
                     f"**{num(a['steady_consumed_sps'])}**", num(a["steady_produced_fps"]),
                     num(a["steady_window_s"], 1),
                     ", ".join(f"{k} {kilo(v)}" for k, v in sorted(a["dropped_by_reason"].items())),
                     f"{num(a['lag']['mean'], 1)} / {num(a['lag']['max'])}"])
    return table(["arm", "buffers", "learner threads", "consumed samples/s", "produced frames/s", "steady window s",
                  "dropped", "lag mean / max"], rows)


def _gpu_pipeline(d: dict) -> list[str]:
    rows = []
    for p in d["points"]:
        if "steady" not in p:
            continue
        t, a = p["trace"].get("learner", {}), p["trace"].get("actors", {})
        med = lambda x: num((x or {}).get("median"), 2)  # noqa: E731
        lag, dropped = p["policy_lag"], sorted((p.get("dropped_samples") or {}).items())
        rows.append([p["actors"], p["arm"], f"**{num(p['steady']['consumed_sps'])}**",
                     num(p["steady"]["produced_fps"]), f"{num(lag['mean'], 1)} / {num(lag['max'])}",
                     num(t.get("busy_fraction"), 2), num(t.get("update_s"), 3), med(a.get("fragment_s")),
                     med(a.get("publish_to_actor_s")), ", ".join(f"{k} {kilo(v)}" for k, v in dropped) or "none"])
    return table(["actors", "arm", "consumed samples/s", "produced frames/s", "lag mean / max", "learner busy",
                  "update s", "fragment s", "publish to actor s", "dropped (whole run)"], rows)


def _gpu_ab_trees(d: dict) -> list[str]:
    rows = [[r["round"] + 1, r["arm"], f"**{num(r['consumed_sps'])}**", num(r["produced_fps"]),
             num(r["policy_lag_mean"], 2), ", ".join(f"{k} {kilo(v)}" for k, v in sorted((r["dropped"] or {}).items()))]
            for r in d["table"]]
    mean = lambda arm, k: sum(r[k] for r in d["table"] if r["arm"] == arm) / sum(  # noqa: E731
        r["arm"] == arm for r in d["table"])
    header = ["round", "arm", "consumed samples/s", "produced frames/s", "lag mean", "dropped (whole run)"]
    return table(header, rows) + [
        "", f"Base: {d['base']}; tree: {d['tree']}. Means over the rounds, tree over base: consumed "
            f"**{num(mean('tree', 'consumed_sps') / mean('base', 'consumed_sps'), 2)}x**, produced "
            f"{num(mean('tree', 'produced_fps') / mean('base', 'produced_fps'), 2)}x."]


def _learner_host(d: dict, scaling: dict) -> list[str]:
    ms = {k: v["median_ms"] for part in ("buffer", "learner_outside_update", "learner_inside_update")
          for k, v in d[part].items() if isinstance(v, dict)}
    tot, g = d["totals_ms"], d["gpu"]
    verdict = (f"above the update: the host work is the bound, most of it {d['biggest_outside_update']}"
               if d["host_bound"] else "below the update: not the bound")
    fed = [p for p in scaling["points"] if p["actors"] >= 4]
    return provenance(d) + ["", f"Host work per batch of {num(d['batch'])} (median ms of {d['reps']}): learner, "
                                f"outside the update, **{num(tot['learner_outside_update'], 1)}** (batch over ipc "
                                f"and decode {num(ms['batch_send_receive_decode'], 1)}, validation "
                                f"{num(ms['validate_batch'], 1)}, publishing the parameters "
                                f"{num(ms['publish_params'], 1)}), {verdict} ({num(g['update_ms'], 1)} ms on the "
                                f"{g['device']}); even run serially with the update, one learner takes "
                                f"{num(d['learner_bound_sps'])} samples/s. Inside the update (in the GPU figure "
                                f"already): staging {num(ms['stage_pack'], 1)}, GAE on the CPU "
                                f"{num(ms['gae_cpu'], 1)}. Buffer: {num(tot['buffer'], 1)} (two fragments decoded, "
                                f"validated and rebuilt {num(ms['fragments_decode_validate'], 1)}, assembled "
                                f"{num(ms['assemble_batch'], 1)}): {num(d['buffer_bound_sps'])} samples/s.",
                            "", f"What the learner consumes follows what reaches it: production stays at "
                                f"{span([p['steady']['produced_fps'] for p in fed])} frames/s from "
                                f"{fed[0]['actors']} to {fed[-1]['actors']} actors, and the consumed rate is that "
                                "less what is dropped as stale (lag over maxPolicyLag) or over its sender's share."]


def render_gpu(files: list[dict]) -> list[str]:
    ppo, dqn, fp32, bf16, scaling, planned, sb3, ab, pipeline, trees, host = files
    plan = host["plan"]
    at8 = next(p for p in scaling["points"] if p["actors"] == 8)["steady"]["consumed_sps"]
    ab_best = max(a["steady_consumed_sps"] for a in ab.values() if isinstance(a, dict) and "overrides" in a)
    return device_provenance([ppo, dqn, fp32, bf16, scaling, planned, sb3, ab, pipeline, trees]) + [
        "", "**The learner on the GPU** (`tianji profile`: the real update, wall clock, synchronised):", ""
    ] + _gpu_learner([ppo, dqn, fp32, bf16]) + [
        "", f"**Actor scaling**: Pong PPO, one GPU learner (1 core, 1 thread), one buffer, "
            f"{num(scaling['points'][0]['max_seconds'])} s per point; the mean of the per-second rates from "
            f"{num(scaling['warmup_seconds_after_first_update'])} s after the first update to the end:", ""
    ] + _gpu_scaling(scaling) + [
        "", "**TianJi at the plan against Stable-Baselines3**, same GPU, same seconds:", ""
    ] + _gpu_vs_sb3(planned, sb3) + [
        "", f"**The planner against the measurement**: `{plan['command']}` predicts {plan['groups']} group x "
            f"({plan['actors']} actors, {plan['buffers']} buffer, {plan['learners']} GPU learner), "
            f"**{num(plan['consumed_sps'])}** samples/s consumed, {plan['bottleneck']} (comm "
            f"{num(plan['comm_seconds'], 3)} s per update against train {num(plan['train_seconds'], 3)} s; "
            f"its per-message cost is {'the built-in' if plan['cpu_assumed'] else 'a measured'} "
            f"{num(1e3 * plan['message_seconds'], 1)} ms, the GPU machine's profile measured "
            f"{num(1e3 * ppo['message_seconds'], 1)} ms); measured at 8 actors: **{num(at8)}** (scaling), "
            f"**{num(ab_best)}** (A/B). Planned {host['date']}, from the code of that date.",
        "", "**A/B: buffers and learner threads**, 8 actors:", ""
    ] + _gpu_ab(ab) + [
        "", f"**Lock step against pipelined** (step e): Pong PPO, one GPU learner, one buffer, "
            f"{num(pipeline['points'][0]['max_seconds'])} s per run, each role traced (`bench/pipeline_trace.py`; "
            f"medians). Code: {pipeline.get('code', 'as committed with the file')}.", ""
    ] + _gpu_pipeline(pipeline) + [
        "", f"**The pacing changes against main before them**, {trees['actors']} actors, "
            f"{num(trees['points'][0]['max_seconds'])} s per run, alternating:", ""
    ] + _gpu_ab_trees(trees) + ["", "**The learner's host work per batch**, timed on a development machine's CPU "
                           "(not the GPU machine's):", ""] + _learner_host(host, scaling)


def _r(name: str) -> str:
    """A result kept in docs/results/, as the path recorded beside what it renders."""
    return f"docs/results/{name}"


def _d(name: str) -> str:
    """A result of a GPU machine's run, kept in docs/device/."""
    return f"docs/device/{name}"


def _v(name: str) -> str:
    """One of the planner's validation runs of 2026-11-25."""
    return _r(f"{name}-2026-11-25.json")


BLOCKS = {  # block name: (renderer, the files it renders)
    "headline": (render_headline, [_r("atari-peers-60min.json"), _r("converge-ppo.json"), _r("ablation.json"),
                                   _r("ablation-cartpole-loaded.json"), _r("ablation-acrobot.json")]),
    "pong": (render_pong, [_r("pong.json")]),
    "atari-peers": (render_atari_peers, [_r("atari-peers.json")]),
    "atari-peers-60min": (render_atari_peers, [_r("atari-peers-60min.json")]),
    "converge-ppo": (render_converge, [_r("converge-ppo.json")]),
    "converge-ppo-onnx": (render_converge, [_r("converge-ppo-onnx-seeds-26-30.json")]),
    "zoo-settings": (render_zoo_settings, [_r("zoo-settings-acrobot.json")]),
    "learner-step": (render_learner_step, [_r("learner-step.json")]),
    "actor-profile": (render_actor_profile, [_r("actor-profile.json")]),
    "actor-runtime": (render_actor_runtime, [_r("actor-runtime.json")]),
    "actor-profile-series-intel": (render_actor_series, [_r("actor-profile-series-intel.json")]),
    "actor-profile-int8-intel": (render_actor_series, [_r("actor-profile-int8-intel.json")]),
    "groupsync": (render_groupsync, [_r("groupsync.json"), _r("groupsync-quiet.json")]),
    "ablation-cartpole": (render_ablation, [_r("ablation.json"), _r("ablation-cartpole-loaded.json")]),
    "ablation-acrobot": (render_ablation, [_r("ablation-acrobot.json"), _r("ablation-acrobot-quiet.json")]),
    "ablation-pong": (render_ablation, [_r("ablation-pong.json")]),
    "ablation-variants": (render_variants, [_r("ablation-acrobot-variants.jsonl")]),
    "flood": (render_flood, [_r("flood.json"), _r("flood-quota.json"), _r("flood-unbounded.json")]),
    "omp-wait": (render_omp_wait, [_r("omp-wait.json")]),
    "cpu-limits": (render_cpu_limits, [_r("cpu-limits.json")]),
    "transport-trust": (render_transport, [_r("security-transport-none.json"), _r("security-transport-curve.json")]),
    "scaling": (render_scaling, [_r("scaling.json")]),
    "scaling-rescore": (render_scaling, [_r("scaling-rescore.json")]),
    "scaling-groups": (render_scaling, [_r("scaling-groups.json")]),
    "planner-validation": (render_validation, [_v("scaling-ppo"), _v("scaling-dqn-rr4"), _v("planner-validation")]),
    "planner-time-to-target": (render_time_to_target, [_v("planner-time-to-target")]),
    "planner-validation-quiet": (render_validation, [_d("planner-validation.json"),
                                                     _r("planner-validation-quiet-2core.json"),
                                                     _r("planner-validation-quiet-2core-seed2.json"),
                                                     _r("planner-validation-quiet-2core-seed3.json")]),
    "planner-time-to-target-device": (render_time_to_target, [_d("planner-time-to-target.json")]),
    "profiles": (render_profiles, ["bench/profiles/cartpole-dqn-2core.json", "bench/profiles/cartpole-ppo-2core.json",
                                   _v("profile-ppo"), _v("profile-dqn-rr4"), _v("profile-ppo-ttt")]),
    "gpu": (render_gpu, [_d("profile-pong-ppo.json"), _d("profile-pong-dqn.json"), _d("profile-pong-ppo-fp32.json"),
                         _d("profile-pong-ppo-bf16.json"), _d("scaling-pong-ppo.json"), _d("pong-ppo-planned.json"),
                         _d("pong-sb3.json"), _d("ab-buffers-threads.json"), _d("pipeline-pong-ppo.json"),
                         _d("ab-trees-pong-ppo.json"), _r("learner-host.json")]),
}


def render_block(name: str) -> str:
    fn, files = BLOCKS[name]
    data = [load(f) for f in files]
    body = fn(data)
    head = f"<!-- generated by python -m bench.render_docs from {', '.join(files)}: edit the JSON, not this block -->"
    return "\n".join([f"<!-- report:{name} -->", head, *body, f"<!-- /report:{name} -->"])


def render_doc(text: str) -> tuple[str, list[str]]:
    """The doc with every block regenerated, and the names of the blocks that changed."""
    changed = []

    def sub(m: re.Match) -> str:
        if m.group(1) not in BLOCKS:
            raise KeyError(f"docs/benchmarks.md: unknown block report:{m.group(1)}")
        new = render_block(m.group(1))
        if new != m.group(0):
            changed.append(m.group(1))
        return new

    return MARKER.sub(sub, text), changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md differs from its JSON")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    text = args.doc.read_text()
    new, changed = render_doc(text)
    missing = sorted(set(BLOCKS) - set(MARKER.findall(text)))
    if args.check:
        for name in changed:
            print(f"{args.doc}: block report:{name} differs from its JSON (run python -m bench.render_docs)")
        for name in missing:
            print(f"{args.doc}: block report:{name} is missing")
        return 1 if changed or missing else 0
    args.doc.write_text(new)
    print(f"{args.doc}: {len(changed)} block(s) rewritten" + (f"; missing: {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
