"""`tianji dashboard --prometheus URL --job NAME --png out.png`: the chart's Grafana dashboard
rendered from a Prometheus without Grafana (the same queries, substituted as Grafana would)."""
from __future__ import annotations

import argparse
import sys
import time
import urllib.error


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://localhost:9090")
    p.add_argument("--job", required=True, help="the TianJiJob's name (the dashboard's job variable)")
    p.add_argument("--namespace", help="its namespace (default: All)")
    p.add_argument("--group", action="append", metavar="G", help="group(s) to show (default: All; repeatable)")
    p.add_argument("--png", required=True, help="where the PNG goes")
    p.add_argument("--range", default="10m", help="time range ending now, e.g. 10m, 1h (default 10m)")
    p.add_argument("--scrape-interval", default="15s",
                   help="the data source's scrape interval: $__rate_interval's floor (default 15s, Grafana's)")
    p.add_argument("--dashboard", help="dashboard JSON (default: charts/tianji-operator/dashboards/tianji.json)")


def dashboard_command(a: argparse.Namespace) -> int:
    from tianji.observability import dashboard as dboard
    from tianji.observability.dashboard_render import render, stamp
    from tianji.observability.grafana import parse_duration

    try:
        range_s, scrape_s = parse_duration(a.range), parse_duration(a.scrape_interval)
        dash = dboard.load(a.dashboard)
        prom = dboard.Prometheus(a.prometheus)
        chosen = {"namespace": a.namespace or "All", "job": a.job, "group": a.group or "All"}
        end = time.time()
        results = dboard.query(prom, dash, chosen, range_s, scrape_s, end=end)
    except (ValueError, OSError, urllib.error.URLError) as e:
        print(f"tianji dashboard: {e}", file=sys.stderr)
        return 1
    where = f"{a.namespace}/{a.job}" if a.namespace else a.job
    out = render(dash, results, a.png, subtitle=f"job {where}, {range_s / 60:.3g} min to {stamp(end)}",
                 start=end - range_s)
    empty = [pr.title for pr in results if not any(t.series for t in pr.targets)]
    print(f"wrote {out}: {len(results)} panels" + (f"; no data in {len(empty)}: {', '.join(empty)}" if empty else ""))
    return 0
