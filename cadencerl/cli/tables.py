"""The CLI's rich tables of run figures, for people; the JSON is for programs."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

# Piped output has no width to fit: this is wide enough that no table is squeezed (rich's 80 would cut
# a comparison's policy names to `cadence-…`); tables never expand, so they keep their natural width.
PIPE_WIDTH = 1000


def _steady(r: dict, key: str) -> str:
    """A steady-window figure, or '-' when the run had fewer than three iterations."""
    v = r.get("steady_" + key) if r.get("steady_window_s") else None
    return "-" if v is None else (f"{v:,.0f}" if key.startswith("throughput") else f"{v:.1f}")


def _label_column(table: Table, header: str, labels: list[str]) -> None:
    """A column of names (policies, accelerators, URLs): never wrapped or cut, as three rows all
    reading `cadence-…` say nothing; the other columns give way instead."""
    table.add_column(header, no_wrap=True, min_width=max(len(str(x)) for x in (header, *labels)))


def _share(r: dict, key: str) -> str:
    """A fraction as a percentage, or '-' when the run has none (no reference run)."""
    v = r.get(key)
    return "-" if v is None else f"{100 * v:.0f}%"


def run_table(results: list[dict], title: str) -> Table:
    """One row per run: whole-run figures (throughput also as % of the bound and of the clairvoyant
    reference), then the steady window's (iterations 2..n-1)."""
    table = Table(title=title)
    _label_column(table, "policy", [r["policy"] for r in results])
    for col in ("throughput tok/s", "% bound", "% ref", "P50 s", "P95 s", "P99 s", "steady tok/s",
                "steady P95 s", "steady P95 from submit s", "preempt", "evict", "migr", "non-res P95", "sim s",
                "wall s"):
        table.add_column(col, justify="right")
    mixed = any(len(r.get("per_class", {})) > 1 for r in results)
    if mixed:       # a mixed workload: what the trainer got against its target, and the prefix cache
        for col in ("prefix hits", "mix D_TV pp (steady)"):
            table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["policy"], f"{r['throughput_tok_s']:,.0f}", _share(r, "throughput_fraction_of_bound"),
                      _share(r, "throughput_fraction_of_reference"), f"{r['latency_p50_s']:.1f}",
                      f"{r['latency_p95_s']:.1f}", f"{r['latency_p99_s']:.1f}", _steady(r, "throughput_tok_s"),
                      _steady(r, "latency_p95_s"), _steady(r, "latency_from_submit_p95_s"), str(r["preemptions"]),
                      str(r.get("evictions", 0)), str(r.get("migrations", 0)),
                      f"{100 * r.get('non_resident_p95', 0):.0f}%", f"{r['sim_time_s']:.0f}",
                      f"{r['wall_time_s']:.2f}", *(_mix_cells(r) if mixed else ()))
    return table


def _mix_cells(r: dict) -> tuple[str, str]:
    """Prefix hit rate, and the consumed batches' distance from the target mix (whole run, steady window)."""
    whole, steady = r.get("mixture_dtv_pp"), r.get("mixture_dtv_steady_pp")
    dtv = "-" if whole is None else f"{whole:.1f}" + ("" if steady is None else f" ({steady:.1f})")
    return _share(r, "prefix_hit_rate"), dtv


def distance_note(results: list[dict], reference: dict | None) -> str:
    """What '% bound' and '% ref' are measured against, or how to get '% ref' and why it is off."""
    r = results[0]
    bound = (f"% bound: whole-run throughput / the tightened bound, {r['bound_throughput_tok_s']:,.0f} tok/s "
             f"(bound by {r['bound_makespan_by']}; P95 bound {r['bound_latency_p95_s']:.1f} s)")
    if reference is None:
        return (f"{bound}. % ref: off by default, as it about doubles the wall time (one more simulation, of an "
                "oracle that measures every resident at every decision); --reference adds the clairvoyant reference")
    return (f"{bound}. % ref: / the clairvoyant reference (an oracle that sees every length), "
            f"{reference['throughput_tok_s']:,.0f} tok/s, P95 {reference['latency_p95_s']:.1f} s, "
            f"its run {reference['wall_time_s']:.1f} s wall")


def per_accelerator_table(result: dict) -> Table:
    table = Table(title=f"{result['policy']}: per accelerator type")
    _label_column(table, "accelerator", list(result["per_accelerator"]))
    for col in ("workers", "throughput tok/s", "mean context", "preemptions"):
        table.add_column(col, justify="right")
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
        steady = all(r.get("steady_window_s") for r in results)
        tp, p95 = ("steady_throughput_tok_s", "steady_latency_p95_s") if steady else ("throughput_tok_s", "latency_p95_s")
        best_tp = max(baselines, key=lambda r: r[tp])
        best_p95 = min(baselines, key=lambda r: r[p95])
        table.caption = (f"{reference}{' (steady window)' if steady else ''}: throughput x{ref[tp] / best_tp[tp]:.2f} "
                         f"vs best baseline ({best_tp['policy']}); P95 x{ref[p95] / best_p95[p95]:.2f} "
                         f"vs best baseline ({best_p95['policy']})")
    return table


def console(stderr: bool = False) -> Console:
    """A console that keeps tables whole when output is piped (rich assumes 80 columns then), unless
    $COLUMNS says how wide to be."""
    c = Console(stderr=stderr)
    return c if c.is_terminal or os.environ.get("COLUMNS", "").isdigit() else Console(stderr=stderr, width=PIPE_WIDTH)


def print_tables(tables: list[Table], to_stderr: bool) -> None:
    """Print whole words only: a narrow console wraps headers, but no column is squeezed below its
    longest word, where rich would cut names and figures (`cadence-…`, `2,1…`) or drop columns; a
    table wider than the terminal overflows it instead (the terminal wraps it)."""
    out = console(to_stderr)
    wide = out.options.update_width(PIPE_WIDTH)
    for table in tables:
        for col in table.columns:
            words = (Measurement.get(out, wide, cell).minimum for cell in (col.header, *col.cells))
            col.min_width = max(col.min_width or 0, *words)
        out.width = max(out.width, Measurement.get(out, wide, table).minimum)   # else rich drops columns
        out.print(table, crop=False)


def sensitivity_table(title: str, runs: list[dict], etas: list[int], deltas: list[int]) -> Table:
    """Throughput / P95 from admission / P95 from submission for each (eta, delta) run: eta down the
    rows, delta across the columns; the steady window's figures when every run has one. (Holding work
    back shows only in latency from submission.)"""
    steady = all(r.get("steady_window_s") for r in runs)
    keys = ("throughput_tok_s", "latency_p95_s", "latency_from_submit_p95_s")
    tp, p95, sub = (f"steady_{k}" for k in keys) if steady else keys
    table = Table(title=f"{title} {'steady-window ' if steady else ''}throughput tok/s / P95 s from admission / "
                        "P95 s from submission, by eta (rows) and delta (columns)")
    _label_column(table, "eta", [str(e) for e in etas])
    for d in deltas:
        table.add_column(f"delta {d}", justify="right")
    for eta in etas:
        cells = [next(r for r in runs if r["eta"] == eta and r["delta"] == d) for d in deltas]
        table.add_row(str(eta), *(f"{r[tp]:,.0f} / {r[p95]:.0f} / {r[sub]:.0f}" for r in cells))
    return table


def sweep_table(scenario: str, results: list[dict]) -> Table:
    """The cache-aware router's threshold sweep, best first."""
    table = Table(title=f"{scenario}: cache-aware router sweep (best first)")
    for col in ("cache_threshold", "balance_abs", "balance_rel", "throughput tok/s", "P95 s", "hit rate"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(f"{r['cache_threshold']}", f"{r['balance_abs_threshold']}", f"{r['balance_rel_threshold']}",
                      f"{r['throughput_tok_s']:,.0f}", f"{r['latency_p95_s']:.0f}", f"{100 * r['prefix_hit_rate']:.1f}%")
    return table


def version_switch_table(scenario: str, results: list[dict]) -> Table:
    """The sweep's second stage: the best thresholds under each version switch, best first."""
    table = Table(title=f"{scenario}: version switch at the best thresholds (best first)")
    _label_column(table, "version switch", [r["version_switch"] for r in results])
    for col in ("throughput tok/s", "steady tok/s", "hit rate"):
        table.add_column(col, justify="right")
    for r in results:
        steady = r["steady_throughput_tok_s"]
        table.add_row(r["version_switch"], f"{r['throughput_tok_s']:,.0f}", "-" if steady is None else f"{steady:,.0f}",
                      f"{100 * r['prefix_hit_rate']:.1f}%")
    return table


def scenarios_table() -> Table:
    """The built-in scenarios, one row each."""
    from cadencerl.config import builtin_names, builtin_scenario

    table = Table(title="built-in scenarios")
    _label_column(table, "name", builtin_names())
    for col in ("workers", "devices", "model", "trajectories"):
        table.add_column(col, overflow="fold")
    table.add_column("description", max_width=100)
    for name in builtin_names():
        s = builtin_scenario(name)
        table.add_row(name, str(sum(g.workers for g in s.pool)), str(sum(g.devices for g in s.pool)), s.model,
                      str(s.workload.trajectories), s.description)
    return table


def engine_table(result: dict) -> Table:
    """Per server: the controller's KV accounting next to what /metrics said."""
    table = Table(title=f"{result['policy']}: per server (controller vs /metrics)")
    table.add_column("worker", justify="right")
    _label_column(table, "url", [w["url"] for w in result["workers"]])
    _label_column(table, "label", [w["label"] for w in result["workers"]])
    for col in ("KV cap", "tokens", "max KV ctl", "max KV srv", "max gap", "max run", "max wait", "preempt", "alive"):
        table.add_column(col, justify="right")
    for w in result["workers"]:
        table.add_row(str(w["worker"]), w["url"], w["label"], f"{w['kv_capacity']:,}", f"{w['tokens_generated']:,}",
                      f"{w['max_committed']:,}", f"{w['max_server_kv_used']:,}", f"{w['max_kv_gap']:,}",
                      str(w["max_running"]), str(w["max_waiting"]), str(w["preemptions"]),
                      "yes" if w["alive"] else "LOST")
    table.caption = (f"makespan {result['makespan_wall_s']:.1f} s, set-up {result['setup_wall_s']:.1f} s; "
                     f"resumes {result['resumes']} (accepted {result['resumes_accepted']}), aborts {result['aborts']}, "
                     f"lost workers {result['lost_workers'] or 'none'}")
    for w, why in result.get("lost_why", {}).items():
        table.caption += f"\nworker {w} lost: {escape(why)}"    # as said: it ends with a [URL], not markup
    return table


def calibration_table(samples, predicted_s: list[float], servers: int, alone: bool) -> Table:
    """Measured vs fitted decode step time for each (batch, context) point."""
    table = Table(title=f"decode step time on {servers} server(s), {'one at a time' if alone else 'together'}")
    for col in ("batch", "context", "measured ms", "fitted ms", "error"):
        table.add_column(col, justify="right")
    for s, p in zip(samples, predicted_s):
        table.add_row(str(s.batch), f"{s.context:,}", f"{1000 * s.step_s:.2f}", f"{1000 * p:.2f}",
                      f"{100 * (p - s.step_s) / s.step_s:+.1f}%")
    return table
