"""Grafana's substitutions in a dashboard's PromQL, as its Prometheus data source makes them, so
that `tianji dashboard` and the live dashboard test ask Prometheus what Grafana would ask.

    $__interval       the panel's step: range / max data points (the panel's width in pixels),
                      rounded like Grafana's roundInterval, never below the scrape interval
                      (the data source's "scrape interval", Grafana's min interval)
    $__rate_interval  max($__interval + scrape interval, 4 x scrape interval)
    $__range          the dashboard's time range
    $var, ${var}      a template variable: its value; "All" gives the variable's allValue;
                      several values of a multi-value variable give (a|b), regex-escaped
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Union

# Grafana's rangeutil.roundInterval: (raw interval below this many ms, interval in ms).
_ROUND_MS = ((10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
             (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000),
             (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000),
             (1500000, 1200000), (2700000, 1800000), (5400000, 3600000), (9000000, 7200000),
             (16200000, 10800000), (24300000, 21600000), (32400000, 28800000), (86400000, 43200000),
             (604800000, 86400000), (1814400000, 604800000), (3628800000, 2592000000))
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
GRID_PIXELS_PER_COLUMN = 1920 / 24  # a panel's width in pixels on a 1920-pixel screen

Value = Union[str, Sequence[str]]


def parse_duration(text: str) -> float:
    """'10m', '1m30s', '500ms', '15s' -> seconds (a Prometheus/Grafana duration)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a duration: {text!r} (e.g. 15s, 10m, 1h)")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"not a positive duration: {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> a PromQL duration ('4s', '1m', '250ms')."""
    ms = int(round(seconds * 1000))
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    return f"{s // 60}m" if s % 60 == 0 and s >= 60 else f"{s}s"


def round_interval(seconds: float) -> float:
    ms = seconds * 1000
    for below, value in _ROUND_MS:
        if ms < below:
            return value / 1000
    return 31536000.0


def interval(range_s: float, max_points: int, scrape_s: float) -> float:
    """$__interval of a panel showing `range_s` seconds with `max_points` points."""
    return max(round_interval(range_s / max(1, max_points)), scrape_s)


def rate_interval(interval_s: float, scrape_s: float) -> float:
    """$__rate_interval: at least four scrapes in every rate window."""
    return max(interval_s + scrape_s, 4 * scrape_s)


def max_points(grid_w: int) -> int:
    """A panel's default max data points: its width in pixels."""
    return int(grid_w * GRID_PIXELS_PER_COLUMN)


def variable_values(templating: list[dict], chosen: Mapping[str, Value]) -> dict[str, str]:
    """The text each query variable stands for: the chosen value(s), or allValue ("All")."""
    out = {}
    for v in templating:
        if v.get("type") != "query":
            continue
        name, value = v["name"], chosen.get(v["name"])
        if value is None or value == "All" or value == ["All"]:
            if not v.get("includeAll"):
                raise ValueError(f"variable {name} needs a value (it has no All)")
            out[name] = v.get("allValue") or ".*"
        elif isinstance(value, str):
            out[name] = value
        elif len(value) == 1:
            out[name] = value[0]
        elif not v.get("multi"):
            raise ValueError(f"variable {name} takes one value, got {list(value)}")
        else:
            out[name] = "(" + "|".join(re.escape(x) for x in value) + ")"
    return out


def substitute(expr: str, values: Mapping[str, str], interval_s: float, rate_interval_s: float,
               range_s: float) -> str:
    """`expr` with Grafana's built-ins and the template variables filled in."""
    builtins = {"__rate_interval": format_duration(rate_interval_s), "__interval": format_duration(interval_s),
                "__range": format_duration(range_s), "__interval_ms": str(int(interval_s * 1000))}
    table = {**builtins, **values}

    def fill(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in table:
            raise ValueError(f"unknown variable ${name} in {expr}")
        return table[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", fill, expr)
