"""Rich tables of run figures, for people; the JSON is for programs."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def run_table(results: list[dict], title: str) -> Table:
    """One row per run; with several runs, a ratio column against the best baseline."""
    table = Table(title=title)
    for col in ("policy", "throughput tok/s", "P50 s", "P95 s", "P99 s", "preempt", "evict", "migr",
                "non-res P95", "sim s", "wall s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        table.add_row(r["policy"], f"{r['throughput_tok_s']:,.0f}", f"{r['latency_p50_s']:.1f}",
                      f"{r['latency_p95_s']:.1f}", f"{r['latency_p99_s']:.1f}", str(r["preemptions"]),
                      str(r.get("evictions", 0)), str(r.get("migrations", 0)),
                      f"{100 * r.get('non_resident_p95', 0):.0f}%", f"{r['sim_time_s']:.0f}",
                      f"{r['wall_time_s']:.2f}")
    return table


def per_accelerator_table(result: dict) -> Table:
    table = Table(title=f"{result['policy']}: per accelerator type")
    for col in ("accelerator", "workers", "throughput tok/s", "mean context", "preemptions"):
        table.add_column(col, justify="left" if col == "accelerator" else "right")
    for acc, f in result["per_accelerator"].items():
        table.add_row(acc, str(f["workers"]), f"{f['throughput_tok_s']:,.0f}", f"{f['mean_context']:,.0f}",
                      str(f["preemptions"]))
    return table


def comparison_table(results: list[dict], reference: str | None) -> Table:
    """Side by side, with throughput and P95 as ratios to the best baseline (not `reference`)."""
    baselines = [r for r in results if r["policy"] != reference]
    table = run_table(results, f"{results[0]['scenario']}: policies compared")
    if reference and baselines and any(r["policy"] == reference for r in results):
        ref = next(r for r in results if r["policy"] == reference)
        best_tp = max(baselines, key=lambda r: r["throughput_tok_s"])
        best_p95 = min(baselines, key=lambda r: r["latency_p95_s"])
        table.caption = (f"{reference}: throughput x{ref['throughput_tok_s'] / best_tp['throughput_tok_s']:.2f} vs best "
                         f"baseline ({best_tp['policy']}); P95 x{ref['latency_p95_s'] / best_p95['latency_p95_s']:.2f} "
                         f"vs best baseline ({best_p95['policy']})")
    return table


def console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when output is piped (rich assumes 80 columns then)."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


def print_tables(tables: list[Table], to_stderr: bool) -> None:
    console_ = console(to_stderr)
    for t in tables:
        console_.print(t)
