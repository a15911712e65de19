"""The `cadencerl` command line. Bad input gets one line naming the field, and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cadencerl.config import ConfigError, Scenario, builtin_names, builtin_scenario, load_scenario_file
from cadencerl.cli.tables import comparison_table, console, per_accelerator_table, print_tables, run_table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="CadenceRL: rollout control plane for asynchronous RL post-training.")


def _fail(message: str) -> None:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _scenario(name: Optional[str], config: Optional[Path], overrides: dict) -> Scenario:
    if (name is None) == (config is None):
        _fail("give exactly one of --scenario NAME or --config FILE")
    try:
        s = builtin_scenario(name) if name else load_scenario_file(config)
        changes: dict = {}
        for section, key, value in (("workload", "trajectories", overrides.get("trajectories")),
                                    ("policy", "eta", overrides.get("eta")),
                                    ("policy", "delta", overrides.get("delta"))):
            if value is not None:
                changes.setdefault(section, {})[key] = value
        if overrides.get("seed") is not None:
            changes["seed"] = overrides["seed"]
        return s.with_overrides(**changes) if changes else s
    except ConfigError as exc:
        _fail(str(exc))


def _progress(enabled: bool):
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)


def _write_json(target: Optional[str], payload) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2)
    if target == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text + "\n")


def _run_policies(scenario: Scenario, names: list[str], exact: bool, show_progress: bool) -> list[dict]:
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.runs.registry import make_policy
    from cadencerl.runs.simulate import simulate

    for n in names:
        try:
            make_policy(n, scenario)
        except (ConfigError, ValueError) as exc:
            _fail(str(exc))
    results = []
    with _progress(show_progress) as progress:
        for n in names:
            task = progress.add_task(f"{scenario.name} / {n}", total=scenario.workload.trajectories)
            try:
                results.append(simulate(scenario, make_policy(n, scenario), exact=exact,
                                        progress=lambda done, total, t=task: progress.update(t, completed=done)))
            except ConfigError as exc:
                _fail(str(exc))
            except (StallError, ActionError) as exc:
                _fail(f"policy {n}: {exc}")
    return results


ScenarioOpt = typer.Option(None, "--scenario", "-s", help="built-in scenario name (see `cadencerl scenarios`)")
ConfigOpt = typer.Option(None, "--config", "-c", help="a scenario file (YAML or TOML)")
JsonOpt = typer.Option(None, "--json", help="write the figures as JSON to PATH, or '-' for stdout only")


AdmissionOpt = typer.Option(None, "--admission", help="an admission layer in front of the policy: misa or none")


@app.command()
def sim(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
        policy: str = typer.Option("cadence", "--policy", "-p", help="a policy, or ADMISSION+POLICY"),
        admission: Optional[str] = AdmissionOpt,
        json_out: Optional[str] = JsonOpt,
        exact: bool = typer.Option(False, "--exact", help="step every decode iteration (reference mode)"),
        seed: Optional[int] = typer.Option(None, min=0), trajectories: Optional[int] = typer.Option(None, min=1),
        eta: Optional[int] = typer.Option(None, min=0), delta: Optional[int] = typer.Option(None, min=0)) -> None:
    """Simulate one policy on a scenario and print its figures."""
    s = _scenario(scenario, config, dict(seed=seed, trajectories=trajectories, eta=eta, delta=delta))
    to_stderr = json_out == "-"
    if admission not in (None, "none"):
        if "+" in policy:
            _fail(f"policy: {policy!r} already names an admission layer; drop --admission")
        policy = f"{admission}+{policy}"
    result = _run_policies(s, [policy], exact, show_progress=True)[0]
    print_tables([run_table([result], f"{s.name}: {policy}"), per_accelerator_table(result)], to_stderr)
    _write_json(json_out, result)


@app.command()
def compare(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
            policies: str = typer.Option("cadence,laminar,areal,least-loaded", "--policies"),
            json_out: Optional[str] = JsonOpt,
            seed: Optional[int] = typer.Option(None, min=0), trajectories: Optional[int] = typer.Option(None, min=1),
            eta: Optional[int] = typer.Option(None, min=0), delta: Optional[int] = typer.Option(None, min=0)) -> None:
    """Run several policies on the same seeded workload, side by side."""
    s = _scenario(scenario, config, dict(seed=seed, trajectories=trajectories, eta=eta, delta=delta))
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        _fail("policies: give at least one policy name")
    results = _run_policies(s, names, False, show_progress=True)
    print_tables([comparison_table(results, "cadence")], json_out == "-")
    _write_json(json_out, results)


@app.command()
def sensitivity(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
                policy: str = typer.Option("cadence", "--policy", "-p"),
                etas: str = typer.Option("1,2,3,4,6", "--etas"), deltas: str = typer.Option("512,1024,2048,4096", "--deltas"),
                json_out: Optional[str] = JsonOpt, trajectories: Optional[int] = typer.Option(None, min=1)) -> None:
    """Throughput and P95 latency over a grid of eta (admission budget) and delta (decode reserve)."""
    from rich.table import Table

    s = _scenario(scenario, config, dict(trajectories=trajectories))
    eta_values, delta_values = _int_list("etas", etas), _int_list("deltas", deltas)
    runs = []
    with _progress(True) as progress:
        task = progress.add_task(f"{s.name} / {policy} sensitivity", total=len(eta_values) * len(delta_values))
        for eta in eta_values:
            for delta in delta_values:
                r = _run_policies(s.with_overrides(policy={"eta": eta, "delta": delta}), [policy], False, False)[0]
                r.update(eta=eta, delta=delta)
                runs.append(r)
                progress.advance(task)
    table = Table(title=f"{s.name}: {policy} throughput tok/s / P95 s by eta (rows) and delta (columns)")
    table.add_column("eta")
    for d in delta_values:
        table.add_column(f"delta {d}", justify="right")
    for eta in eta_values:
        cells = [next(r for r in runs if r["eta"] == eta and r["delta"] == d) for d in delta_values]
        table.add_row(str(eta), *(f"{r['throughput_tok_s']:,.0f} / {r['latency_p95_s']:.0f}" for r in cells))
    print_tables([table], json_out == "-")
    _write_json(json_out, runs)


def _int_list(name: str, text: str, minimum: int = 0) -> list[int]:
    """A comma-separated list of integers >= `minimum`, or a one-line error naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        _fail(f"{name}: expected comma-separated integers >= {minimum}, got {text!r}")
    return values


@app.command()
def sweep(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
          grid: str = typer.Option("quick", "--grid", help="quick (16 points) or full (75 points)"),
          json_out: Optional[str] = JsonOpt) -> None:
    """Tune the cache-aware router's thresholds on a scenario; the best becomes `cache-aware-tuned`."""
    from rich.table import Table

    from cadencerl.runs import sweep as sw

    if grid not in ("quick", "full"):
        _fail(f"grid: expected quick or full, got {grid!r}")
    s = _scenario(scenario, config, {})
    points = sw.QUICK_GRID if grid == "quick" else sw.FULL_GRID
    with _progress(True) as progress:
        task = progress.add_task(f"{s.name} / cache-aware sweep", total=None)
        results = sw.sweep(s, points, lambda done, total: progress.update(task, completed=done, total=total))
    best = {k: results[0][k] for k in points}
    path = sw.cache_dir() / f"{s.name}-{sw.scenario_key(s, points)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"scenario": s.name, "grid": points, "best": best, "results": results}, indent=1))
    table = Table(title=f"{s.name}: cache-aware router sweep (best first)")
    for col in ("cache_threshold", "balance_abs", "balance_rel", "throughput tok/s", "P95 s", "hit rate"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(f"{r['cache_threshold']}", f"{r['balance_abs_threshold']}", f"{r['balance_rel_threshold']}",
                      f"{r['throughput_tok_s']:,.0f}", f"{r['latency_p95_s']:.0f}", f"{100 * r['prefix_hit_rate']:.1f}%")
    table.caption = f"best: {best} (saved for cache-aware-tuned in {path})"
    print_tables([table], json_out == "-")
    _write_json(json_out, {"best": best, "results": results})


@app.command()
def scenarios() -> None:
    """List the built-in scenarios."""
    from rich.table import Table

    table = Table(title="built-in scenarios")
    for col in ("name", "workers", "devices", "model", "trajectories", "description"):
        table.add_column(col, overflow="fold")
    for name in builtin_names():
        s = builtin_scenario(name)
        table.add_row(name, str(sum(g.workers for g in s.pool)), str(sum(g.devices for g in s.pool)), s.model,
                      str(s.workload.trajectories), s.description)
    console().print(table)


@app.command()
def report(out: Optional[Path] = typer.Option(None, "--out", "-o", help="directory for report.md, figures/, results.json"),
           quick: bool = typer.Option(False, "--quick", help="8192 trajectories per run (batch kept), fewer sweep points"),
           trajectories: Optional[int] = typer.Option(None, help="trajectories per run (batch = a quarter); overrides --quick's size"),
           seed: Optional[int] = typer.Option(None, help="workload seed for every run (default: the scenarios' own, 0)"),
           jobs: Optional[int] = typer.Option(None, help="simulations run in parallel (default: the CPU count)")) -> None:
    """Run the evaluation matrix (the paper's section 6) and write a markdown report with tables and plots."""
    from cadencerl.report.build import ReportError, build_report

    if out is None:
        _fail("out: give --out DIR")
    if out.exists() and not out.is_dir():
        _fail(f"out: {str(out)!r} exists and is not a directory")
    if trajectories is not None and trajectories < 8:
        _fail(f"trajectories: must be at least 8, got {trajectories}")
    if seed is not None and seed < 0:
        _fail(f"seed: must be non-negative, got {seed}")
    if jobs is not None and jobs < 1:
        _fail(f"jobs: must be at least 1, got {jobs}")
    try:
        path = build_report(out, quick=quick, trajectories=trajectories, seed=seed, processes=jobs)
    except (ConfigError, ReportError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"out: cannot write to {str(out)!r}: {exc.strerror or exc}")
    console().print(f"report written to {path}")


from cadencerl.cli.engine import register as _register_engine  # noqa: E402  (pool, run, calibrate)

_register_engine(app)
from cadencerl.cli.router import router as router_cmd  # noqa: E402
app.command("router")(router_cmd)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
