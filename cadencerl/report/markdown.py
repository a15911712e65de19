"""Markdown helpers for the report: tables, number formats, pool descriptions."""

from __future__ import annotations

from cadencerl.config import Scenario
from cadencerl.hardware.catalog import ACCELERATORS


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def tok(x: float) -> str:
    return f"{x:,.0f}"


def sec(x: float) -> str:
    return f"{x:,.1f}"


def change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f}%" if old else "n/a"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def best_of(results: dict[str, dict], metric: str, among, maximize: bool) -> tuple[str, dict] | None:
    """The best (policy, result) among policies in `among` that ran."""
    cands = [(p, r) for p, r in results.items() if p in among]
    if not cands:
        return None
    pick = max if maximize else min
    return pick(cands, key=lambda pr: pr[1][metric])


def describe_pool(s: Scenario) -> str:
    return " + ".join(f"{g.devices}x {g.accelerator} (TP={g.tp}, {g.workers} workers, cluster {g.cluster})"
                      for g in s.pool)


def pool_price(s: Scenario) -> float | None:
    """Dollars per hour for the whole pool, or None if any device type has no listed price."""
    prices = [ACCELERATORS[g.accelerator].price_per_hour for g in s.pool]
    if any(p is None for p in prices):
        return None
    return sum(p * g.devices for p, g in zip(prices, s.pool))
