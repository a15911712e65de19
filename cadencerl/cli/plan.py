"""`cadencerl plan`: which accelerators, how many and which eta for a workload and a budget
(runs/plan.py searches; this prints the frontier, the best pool and why, and plots the frontier)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from cadencerl.cli.common import (BatchOpt, ConfigOpt, JobsOpt, JsonOpt, RayOpt, ScenarioOpt, SeedOpt, TrajectoriesOpt,
                                  fail, fanout_from, int_list, load_scenario, write_json)
from cadencerl.cli.tables import console, print_tables
from cadencerl.config import ConfigError
from cadencerl.report.runner import progress_bar

def plan(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
         candidates: Optional[str] = typer.Option(None, "--candidates", help="TYPE[@TP]:N,N,...;... device counts "
                                                  "allowed per type (default: the scenario's types at 0, half, all)"),
         prices: Optional[Path] = typer.Option(None, "--prices", help="prices file (YAML/TOML): prices: {TYPE: "
                                               "{per_hour: X, source: TEXT}}; else the catalog's prices"),
         budget: Optional[float] = typer.Option(None, "--budget", min=0.0, help="dollars per hour the pool may cost"),
         etas: str = typer.Option("1,2", "--etas", help="staleness bounds to try, comma-separated"),
         deltas: Optional[str] = typer.Option(None, "--deltas", help="CadenceRL decode reserves to try (default: "
                                              "the scenario's)"),
         policy: str = typer.Option("cadence", "--policy", "-p", help="the policy the pools are planned for"),
         exhaustive: bool = typer.Option(False, "--exhaustive", help="run every pool within the budget, prune none"),
         monotone: bool = typer.Option(False, "--monotone", help="assume more devices never slow a run and run only "
                                       "the pools no other within the budget contains (unsafe: see docs/planner.md)"),
         plot: Optional[Path] = typer.Option(None, "--plot", help="write the frontier plot (PNG) here"),
         json_out: Optional[str] = JsonOpt, seed: Optional[int] = SeedOpt,
         trajectories: Optional[int] = TrajectoriesOpt, batch_size: Optional[int] = BatchOpt,
         jobs: Optional[int] = JobsOpt, ray: Optional[str] = RayOpt) -> None:
    """Plan a pool: search compositions of the candidates and eta in steady state; print the Pareto frontier
    of throughput, P95 and tokens per dollar, and the best pool under the budget with why."""
    from cadencerl.runs import plan as pl
    from cadencerl.runs.prices import load_prices, prices_for
    from cadencerl.runs.registry import make_policy

    base = load_scenario(scenario, config, dict(seed=seed, trajectories=trajectories, batch_size=batch_size), json_out)
    try:
        cands = pl.parse_candidates(candidates, base) if candidates else pl.default_candidates(base)
        table = prices_for([c.accelerator for c in cands], load_prices(prices) if prices else None)
        eta_values = tuple(int_list("etas", etas))
        delta_values = tuple(int_list("deltas", deltas)) if deltas else (None,)
        make_policy(policy, base)       # an unknown name fails here, before any run
        with progress_bar(True) as progress:
            task = progress.add_task(f"{base.name}: planning", total=None)
            result = pl.search(base, cands, table, budget, policy=policy, etas=eta_values, deltas=delta_values,
                               fanout=fanout_from(jobs, ray), exhaustive=exhaustive, monotone=monotone,
                               progress=lambda done, total: progress.update(task, completed=done, total=total))
    except ConfigError as exc:
        fail(str(exc))
    to_stderr = json_out == "-"
    print_tables([frontier_table(base.name, result), prices_table(result)], to_stderr)
    out = console(stderr=to_stderr)
    out.print(f"best: {result['why']}")
    out.print(pruning_note(result))
    if plot is not None:
        plot_frontier(result, plot)
        out.print(f"frontier plot written to {plot}")
    write_json(json_out, result)


def pruning_note(r: dict) -> str:
    ran = len({x["pool"] for x in r["runs"]})
    text = (f"searched {r['pools_total']} pools: {r['pools_over_budget']} over the budget, "
            f"{len(r['pools_infeasible'])} that cannot run the workload, {len(r['pools_pruned'])} pruned "
            f"({'assumed monotone' if r['monotone'] else 'peak-decode bound below the best found'}), {ran} run")
    if r["bound_violations"]:
        text += f"; WARNING: runs above their bound (pruning unsafe): {', '.join(r['bound_violations'])}"
    if r["monotonicity_violations"]:
        text += f"; {len(r['monotonicity_violations'])} pairs where a larger pool is slower (--monotone would mislead)"
    return text


def frontier_table(name: str, r: dict) -> Table:
    t = Table(title=f"{name}: Pareto frontier ({r['policy']}, steady state)")
    for h in ("pool", "eta", "delta", "$/h", "tok/s", "P95 s", "tokens/$"):
        t.add_column(h, justify="left" if h == "pool" else "right")
    for x in r["frontier"]:
        mark = " *" if x is r["best"] or x == r["best"] else ""
        t.add_row(x["pool"] + mark, str(x["eta"]), "-" if x["delta"] is None else str(x["delta"]),
                  f"{x['cost_per_hour']:,.2f}", f"{x['throughput_tok_s']:,.0f}", f"{x['latency_p95_s']:,.1f}",
                  f"{x['tokens_per_dollar']:,.0f}")
    t.caption = "* the best pool under the budget"
    return t


def prices_table(r: dict) -> Table:
    t = Table(title="prices used (per device-hour)")
    for h in ("accelerator", "$/h", "source"):
        t.add_column(h)
    for name, p in r["prices"].items():
        t.add_row(name, f"{p['per_hour']:,.2f}", p["source"])
    return t


def plot_frontier(r: dict, path: Path) -> None:
    """Throughput against tokens per dollar, every run grey, the frontier marked, P95 as colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [x for x in r["runs"] if "error" not in x]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([x["tokens_per_dollar"] for x in ok], [x["throughput_tok_s"] for x in ok], s=12, c="0.75", label="run")
    front = r["frontier"]
    sc = ax.scatter([x["tokens_per_dollar"] for x in front], [x["throughput_tok_s"] for x in front],
                    c=[x["latency_p95_s"] for x in front], cmap="viridis_r", s=40, label="frontier", zorder=3)
    fig.colorbar(sc, ax=ax, label="steady P95 latency (s)")
    for x in front[:8]:
        ax.annotate(f"{x['pool']}, eta {x['eta']}", (x["tokens_per_dollar"], x["throughput_tok_s"]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel("tokens per dollar")
    ax.set_ylabel("steady throughput (tok/s)")
    ax.set_title(f"pool plan ({r['policy']})")
    ax.legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except OSError as exc:
        fail(f"plot: cannot write {path}: {exc.strerror or exc}")
    finally:
        plt.close(fig)
