"""Live progress view of a local run: a rich table on a terminal, a line every few seconds otherwise."""
from __future__ import annotations

import sys
import time
from typing import Optional

from rich.console import Console
from rich.live import Live
from rich.table import Table


def _fmt(v: Optional[float], spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def status_fields(row: dict) -> list[tuple[str, str]]:
    lag = row["lag"]
    return [
        ("time", f"{row['elapsed']:.0f}s"),
        ("frames", _fmt(row["env_frames"])),
        ("produced fps", _fmt(row["produced_fps"])),
        ("received sps", _fmt(row["received_fps"])),
        ("consumed sps", _fmt(row["consumed_sps"])),
        ("policy version", _fmt(row["policy_version"])),
        ("policy lag mean/max", f"{_fmt(lag['mean'], '.1f')} / {_fmt(lag['max'])}"),
        ("episodes", _fmt(row["episodes"])),
        ("mean return (100)", _fmt(row["mean_return"], ".1f")),
        ("episode length", _fmt(row.get("mean_episode_length"), ".1f")),
        ("dropped / rejected", f"{_fmt(row['dropped'])} / {_fmt(row['rejected'])}"),
        ("restarts", ", ".join(f"{k} {v}" for k, v in row["restarts"].items() if v) or "0"),
        ("checkpoint", row.get("checkpoint") or "-"),
    ]


class Progress:
    def __init__(self, title: str, enabled: bool = True, line_every: float = 5.0, caption: str = ""):
        self.title, self.caption = title, caption
        self.enabled = enabled
        self.tty = enabled and sys.stdout.isatty()
        self.console = Console()
        self.live: Optional[Live] = None
        self.line_every = line_every
        self._last_line = 0.0

    def __enter__(self) -> Progress:
        if self.tty:
            self.live = Live(self._table(None), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _table(self, row: Optional[dict]) -> Table:
        t = Table(title=self.title, caption=self.caption, show_header=False, box=None, pad_edge=False,
                  min_width=44)
        t.add_column(style="bold cyan")
        t.add_column(justify="right")
        if row:
            for k, v in status_fields(row):
                t.add_row(k, v)
        return t

    def update(self, row: dict) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            self.live.update(self._table(row))
            return
        now = time.monotonic()
        if now - self._last_line >= self.line_every:
            self._last_line = now
            print("  ".join(f"{k}={v}" for k, v in status_fields(row)), file=sys.stderr, flush=True)
