"""The dashboard as a PNG (matplotlib), laid out on its gridPos (24 columns; a height unit is
Grafana's 30 pixels): rows as headings, stat panels as their last value, time series as lines
named by their legendFormat, y axes in the panel's unit, time in minutes from the range's start."""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from tianji.observability.dashboard import PanelResult, Series, last_values, panels

PX_PER_COL, PX_PER_ROW, DPI = 80, 30, 100
UNITS = {"Bps": ("B/s", 1024), "bytes": ("B", 1024), "s": ("s", None), "percentunit": ("%", None)}


def legend(fmt: str, s: Series) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: s.labels.get(m.group(1), ""), fmt).strip()


def human(x: float, unit: str) -> str:
    """A value in the panel's unit: 1.2 K, 3.4 MB/s, 12.5%."""
    if not math.isfinite(x):
        return "-"
    if unit == "percentunit":
        return f"{100 * x:.1f}%"
    suffix, base = UNITS.get(unit, ("", 1000))
    prefix = ""
    for bigger in ("K", "M", "G", "T") if base else ():
        if abs(x) < base:
            break
        x, prefix = x / base, bigger
    return f"{x:.3g} {prefix}{suffix}".rstrip()


def _unit(panel: dict) -> str:
    return ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit") or "short"


def _stat(ax, pr: PanelResult) -> None:
    vals = [x for t in pr.targets for x in last_values(t) if math.isfinite(x)]
    text = human(sum(vals), _unit(pr.panel)) if vals else "No data"
    ax.text(0.5, 0.42, text, ha="center", va="center", fontsize=22, weight="bold",
            color="#1f77b4" if vals else "0.5", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _timeseries(ax, pr: PanelResult, t0: float) -> None:
    import matplotlib.ticker as mticker

    unit, drawn = _unit(pr.panel), 0
    for t in pr.targets:
        for s in t.series:
            ax.plot([(x - t0) / 60 for x in s.t], s.v, lw=1.2, marker="." if len(s.t) < 4 else None,
                    label=legend(t.legend, s)[:48])
            drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="0.5", transform=ax.transAxes)
    else:
        ax.legend(fontsize=6, loc="upper left", frameon=False, ncol=2 if drawn > 4 else 1)
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda y, _: human(y, unit)))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def render(dash: dict, results: list[PanelResult], out: Path, subtitle: str = "",
           start: Optional[float] = None) -> Path:
    """Write the PNG of `results` (dashboard.query) laid out like `dash`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = panels(dash)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in layout) + 2  # + the heading
    fig = plt.figure(figsize=(24 * PX_PER_COL / DPI, rows * PX_PER_ROW / DPI), dpi=DPI)
    by_id = {pr.panel.get("id"): pr for pr in results}
    t0 = start if start is not None else min((x for pr in results for t in pr.targets for s in t.series
                                              for x in s.t[:1]), default=0.0)
    fig.text(0.005, 1 - 0.6 / rows, f"{dash.get('title', 'dashboard')}  {subtitle}", fontsize=14, weight="bold",
             va="center")
    fig.text(0.995, 1 - 0.6 / rows, "time axes: minutes from the range's start", fontsize=9, ha="right",
             va="center")
    for p in layout:
        g = p["gridPos"]
        # figure coordinates: 2 grid rows for the heading, a small gap inside each cell
        left, width = g["x"] / 24 + 0.004, g["w"] / 24 - 0.008
        top = 1 - (g["y"] + 2) / rows
        if p.get("type") == "row":
            fig.text(left, top - 0.5 / rows, p.get("title", ""), fontsize=12, weight="bold", va="center")
            continue
        height = g["h"] / rows
        ax = fig.add_axes((left + 0.02 * (p.get("type") != "stat"), top - height + 0.9 / rows,
                           width - 0.02 * (p.get("type") != "stat"), height - 1.5 / rows))
        ax.set_title(p.get("title", ""), fontsize=9, loc="left")
        pr = by_id.get(p.get("id"))
        if pr is None:
            ax.text(0.5, 0.5, "not queried", ha="center", transform=ax.transAxes)
        elif p.get("type") == "stat":
            _stat(ax, pr)
        else:
            _timeseries(ax, pr, t0)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out


def stamp(end: float) -> str:
    return datetime.fromtimestamp(end, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
