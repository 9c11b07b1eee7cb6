"""`tianji` command line: run, check, worker, actor-key, plan, profile, eval, confirm, plot, dashboard, crd.

Each sub-command lives in its own module; this file only parses arguments
and maps SpecError (bad input) to exit code 2 with a one-line message.
"""
from __future__ import annotations

import argparse
import sys

from tianji.control.planner.plan import DEFAULT_PLAN_CPUS, PlanError
from tianji.control.spec import SpecError
from tianji.runtime.worker import add_arguments as worker_arguments


def _run(a: argparse.Namespace) -> int:
    from tianji.local.launcher import RunDirError, run_job

    if bool(a.job) == bool(a.resume):
        print("tianji run: give a JOB.yaml or --resume RUN_DIR (not both)", file=sys.stderr)
        return 2
    if a.max_seconds is not None and not (a.max_seconds > 0 and a.max_seconds != float("inf")):
        print(f"tianji run: --max-seconds must be a positive number of seconds, got {a.max_seconds:g}",
              file=sys.stderr)
        return 2
    profile = None
    if a.profile:
        from tianji.control.planner.plan import load_profile

        try:
            profile = load_profile(a.profile)
        except ValueError as e:
            print(f"tianji run: bad profile: {e}", file=sys.stderr)
            return 2
    try:
        return run_job(a.job, overrides=a.set, run_dir=a.run_dir, max_seconds=a.max_seconds,
                       progress=not a.quiet, resume=a.resume, metrics_port=a.metrics_port, profile=profile,
                       tensorboard_port=a.tensorboard)
    except RunDirError as e:
        print(f"tianji run: {e}", file=sys.stderr)
        return 2


def _check(a: argparse.Namespace) -> int:
    from tianji.cli.check import check_command

    return check_command(a)


def _eval(a: argparse.Namespace) -> int:
    from tianji.cli.evaluate import eval_command

    return eval_command(a)


def _confirm(a: argparse.Namespace) -> int:
    from tianji.cli.confirm import confirm_command

    return confirm_command(a)


def _plot(a: argparse.Namespace) -> int:
    from tianji.observability.plot import plot_command

    return plot_command(a)


def _dashboard(a: argparse.Namespace) -> int:
    from tianji.cli.dashboard import dashboard_command

    return dashboard_command(a)


def _worker(a: argparse.Namespace) -> int:
    from tianji.runtime.worker import run_worker

    return run_worker(a)


def _actor_key(a: argparse.Namespace) -> int:
    from tianji.cli.actorkey import actor_key_command

    return actor_key_command(a)


def _plan(a: argparse.Namespace) -> int:
    from tianji.cli.plan import plan_command

    return plan_command(a)


def _profile(a: argparse.Namespace) -> int:
    if a.link_serve or a.link_measure:  # no torch needed: a pod can serve this from a bare image
        from tianji.runtime.profiling.linkprobe import link_command

        return link_command(a)
    from tianji.runtime.profiling.profiler import profile_command

    return profile_command(a)


def _crd(a: argparse.Namespace) -> int:
    from tianji.control.spec.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, for an editable install)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tianji")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def spec_error_text(err: SpecError) -> str:
    """One line for one problem; a header and one line per field when there are several."""
    text = str(err)
    return f"tianji: invalid job spec: {text}" if "\n" not in text else f"tianji: invalid job spec\n{text}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tianji",
                                description="Highly parallel RL training with relaxed assignment dependencies.")
    p.add_argument("--version", action="version", version=f"tianji {package_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a TianJiJob locally, one process per role")
    r.add_argument("job", nargs="?", help="TianJiJob manifest (YAML)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue an earlier run from its newest good checkpoints")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. spec.algorithm.lr=3e-4 (repeatable)")
    r.add_argument("--run-dir",
                   help="where sockets, logs, metrics.jsonl and summary.json go (default runs/<job>-<time>)")
    r.add_argument("--max-seconds", type=float, help="wall-clock cap on top of spec.stop")
    r.add_argument("--quiet", action="store_true", help="no live progress view")
    r.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve every role's Prometheus metrics on 127.0.0.1:N/metrics")
    r.add_argument("--profile", help="profile JSON from `tianji profile` for the planner (default: built-in estimates)")
    r.add_argument("--tensorboard", type=int, nargs="?", const=6006, metavar="PORT",
                   help="also serve the run's TensorBoard on 127.0.0.1:PORT (default 6006) while it runs "
                        "(event files are written into the run dir either way)")
    r.set_defaults(fn=_run)

    from tianji.cli.check import add_arguments as check_arguments

    ck = sub.add_parser("check", help="check a TianJiJob as `tianji run` does before it starts (the spec, and the "
                                      "env, wrappers and model built against the env's spaces), running nothing")
    check_arguments(ck)
    ck.set_defaults(fn=_check)

    w = sub.add_parser("worker", help="run one role (what `tianji run` and Kubernetes pods start)")
    worker_arguments(w)
    w.set_defaults(fn=_worker)

    from tianji.cli.actorkey import add_arguments as actor_key_arguments

    ak = sub.add_parser("actor-key", help="(Kubernetes actor pods' init container) write the pod's own CurveZMQ "
                                          "keyring, derived from the job's actor seed")
    actor_key_arguments(ak)
    ak.set_defaults(fn=_actor_key)

    pl = sub.add_parser("plan", help="size a job with the balance planner")
    pl.add_argument("job")
    pl.add_argument("--cpus", type=float, help="total cores M (default: the job's spec.resources.cpus, else "
                                               f"{DEFAULT_PLAN_CPUS:g}, as tianji run plans)")
    pl.add_argument("--gpus", type=int, help="default: spec.resources.gpus")
    pl.add_argument("--nodes", type=int, help="default: spec.resources.nodes")
    pl.add_argument("--cpus-per-node", type=float, help="default: spec.resources.cpusPerNode")
    pl.add_argument("--profile", help="profile JSON from `tianji profile` (default: built-in estimates); "
                                      "a learner GPU figure measured for the job in docs/device fills one it lacks")
    pl.add_argument("--gpu-model", help="the GPUs' model (e.g. H100): use a GPU figure measured on it")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pl.set_defaults(fn=_plan)

    pr = sub.add_parser("profile", help="measure actor and learner throughput on this machine")
    pr.add_argument("job", nargs="?", help="TianJiJob manifest (not with --link-serve / --link-measure)")
    pr.add_argument("--link-serve", metavar="[HOST:]PORT",
                    help="answer a --link-measure peer on tcp HOST:PORT (default host 0.0.0.0; plaintext, "
                         "zeros only) until --link-serve-seconds or Ctrl-C")
    pr.add_argument("--link-serve-seconds", type=float, help="stop serving after this long")
    pr.add_argument("--link-measure", metavar="HOST:PORT",
                    help="measure bandwidth and latency to a --link-serve peer over ZeroMQ tcp for --seconds; "
                         "with --out, write them into that profile file (kept otherwise)")
    pr.add_argument("--link-bytes", type=int, default=4 << 20, help="payload of a bandwidth round trip")
    pr.add_argument("--seconds", type=float, default=3.0, help="measuring time per component")
    pr.add_argument("--out", help="write the profile JSON here (default: stdout)")
    pr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pr.set_defaults(fn=_profile)

    e = sub.add_parser("eval", help="mean/std return and mean length of a checkpoint's policy's episodes, the "
                                    "same count from each env")
    e.add_argument("checkpoint", help="a ckpt-*.pt file, or a run dir (its newest learner checkpoint)")
    e.add_argument("--episodes", type=int, default=10,
                   help="played on the most envs (at most 8, or 128 for a native vector env such as CartPole's) "
                        "that divide it evenly: 20 is 4 from each of 5 envs")
    e.add_argument("--seed", type=int, default=12345)
    e.add_argument("--epsilon", type=float, default=None,
                   help="DQN: probability of a random action (default 0.05, Mnih et al. 2015); PPO: default 0")
    e.add_argument("--json", action="store_true")
    e.set_defaults(fn=_eval)

    from tianji.cli.confirm import add_arguments as confirm_arguments

    cf = sub.add_parser("confirm", help="download a learner's checkpoint, check its SHA-256 and evaluate it as "
                                        "`tianji run` confirms a target (the operator's confirming evaluation pod)")
    confirm_arguments(cf)
    cf.set_defaults(fn=_confirm)

    pt = sub.add_parser("plot", help="PNG of a run: return vs time and frames, throughput by role")
    pt.add_argument("run_dir")
    pt.add_argument("--out", help="PNG path (default RUN_DIR/plot.png)")
    pt.set_defaults(fn=_plot)

    from tianji.cli.dashboard import add_arguments as dashboard_arguments

    d = sub.add_parser("dashboard", help="PNG of the chart's Grafana dashboard for a job, from Prometheus (no Grafana)")
    dashboard_arguments(d)
    d.set_defaults(fn=_dashboard)

    c = sub.add_parser("crd", help="print the TianJiJob CustomResourceDefinition (generated from the spec)")
    c.set_defaults(fn=_crd)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except SpecError as e:
        print(spec_error_text(e), file=sys.stderr)
        return 2
    except PlanError as e:
        print(f"tianji: the job cannot be planned\n{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
