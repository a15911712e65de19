"""Live progress of `cadencerl run` in the terminal: what every worker and the controller are doing.

Redrawn twice a second on stderr (stdout stays clean for `--json -`) from the controller the run
builds; a read that races the controller's thread shows the last good frame instead.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cadencerl.core.controller import Controller


class LiveStatus:
    """The renderable: one summary line and one row per worker."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.source: Callable[[], Controller | None] = lambda: None
        self.metrics_url: Callable[[], str | None] = lambda: None
        self._last: RenderableType = Text(f"{title}: starting...")

    def render(self) -> RenderableType:
        ctl = self.source()
        if ctl is None:
            return self._last
        try:
            self._last = self._frame(ctl)
        except RuntimeError:        # a dict changed size while read: keep the previous frame
            pass
        return self._last

    def _frame(self, ctl: Controller) -> RenderableType:
        tokens = sum(t.generated for t in list(ctl.trajectories.values()))
        pending = ", ".join(f"v{v}: {ctl.pending.count(v)}" for v in ctl.pending.versions()) or "none"
        c = ctl.counters
        summary = Text(f"{self.title}  {ctl.done}/{len(ctl.trajectories)} done  {ctl.now:6.1f} s  "
                       f"{tokens / ctl.now if ctl.now > 0 else 0:7.0f} tok/s  trainer v{ctl.trainer.version}  "
                       f"admitted {ctl.credits.admitted}  evictions {c.evictions}  migrations {c.migrations}  "
                       f"pending [{pending}]")
        table = Table(box=None, pad_edge=False)
        for column in ("worker", "accelerator", "version", "residents", "KV used", "KV %"):
            table.add_column(column, justify="left" if column == "accelerator" else "right")
        for w in ctl.workers:
            share = 100 * w.kv_used / w.kv_capacity if w.kv_capacity else 0
            table.add_row(str(w.id), w.accelerator, f"v{w.version}" if w.alive else "lost", str(len(w.residents)),
                          f"{w.kv_used:,}/{w.kv_capacity:,}", f"{share:.0f}")
        url = self.metrics_url()
        return Group(summary, table, Text(f"metrics: {url}")) if url else Group(summary, table)


@contextlib.contextmanager
def live_status(title: str, enabled: bool = True) -> Iterator[LiveStatus]:
    """Show a `LiveStatus` until the block ends; point its `source` at the run's controller."""
    status = LiveStatus(title)
    if not enabled:
        yield status
        return
    with Live(console=Console(stderr=True), get_renderable=status.render, refresh_per_second=2, transient=True):
        yield status


def announce_metrics(port: int | None, table_shown: bool) -> int | None:
    """The metrics port to serve on. Without the live table (which shows the URL) the URL is printed
    on stderr now, so `--metrics-port 0` (any free port) still says where Prometheus should scrape."""
    if port is None or table_shown:
        return port
    from cadencerl.engine.exporter import (
        HOST,  # prometheus_client: not for every command's start-up
    )

    if port == 0:
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
    Console(stderr=True).print(f"metrics: http://{HOST}:{port}/metrics", markup=False, highlight=False)
    return port
