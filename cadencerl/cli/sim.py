"""Simulator commands: `sim`, `compare`, `sensitivity`, `sweep`, `scenarios`, `report`.

Each is a plain function with typer options; `main.py` registers them on the app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cadencerl.cli.common import (POLICY_HELP, BatchOpt, ConfigOpt, DeltaOpt, EtaOpt, JobsOpt, JsonOpt, RayOpt,
                                  ScenarioOpt, SeedOpt, TrainerClusterOpt, TrajectoriesOpt, bug, distinct, fail,
                                  fanout_from, int_list, load_scenario, write_json)
from cadencerl.cli.tables import (comparison_table, console, distance_note, per_accelerator_table, print_tables,
                                  run_table, scenarios_table, sensitivity_table, sweep_table, version_switch_table)
from cadencerl.config import ConfigError, Scenario
from cadencerl.report.runner import progress_bar

REFERENCE_HELP = ("also simulate the clairvoyant reference (an oracle that sees every length) and show each run's "
                  "throughput as a % of it")
# The clairvoyant reference is off unless asked for: it about doubles a run's wall time (one more
# simulation, of an oracle that measures every resident at every decision). Measured on 16a16b8h,
# 16,384 trajectories, on a shared 2-core machine: sim -p cadence 7.2 s -> 13.8 to 21.7 s with
# --reference, compare (4 policies) 12.8 s -> 27.2 s.
REFERENCE_BY_DEFAULT = False
MAX_JOBS = 256   # simulations in parallel: processes, so a bound keeps `report` from exhausting the machine
GroupedOpt = typer.Option(False, "--grouped", help="the baselines route a prompt's samples where its last one went "
                          "(the prefix-aware group routing of their real deployments)")
PolicyOpt = typer.Option("cadence", "--policy", "-p", help=POLICY_HELP)


def run_policies(scenario: Scenario, names: list[str], exact: bool, show_progress: bool,
                 grouped: bool = False) -> list[dict]:
    """Simulate each named policy on `scenario` (`grouped`: the baselines with group routing); an
    unknown name or a failing run is a one-line error."""
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.runs.registry import GROUPABLE
    from cadencerl.runs.registry import make_policy as make
    from cadencerl.runs.simulate import simulate

    def make_policy(name: str, s: Scenario):
        return make(name, s, grouped=grouped and name.rpartition("+")[2] in GROUPABLE)

    results = []
    with progress_bar(show_progress) as progress:
        for n in names:     # every name checked before any run; a tuned router tunes here (its sweep is cached)
            tuning = progress.add_task(f"{scenario.name} / {n}: tuning the router (a sweep, cached for later runs)",
                                       total=None) if n.endswith("cache-aware-tuned") else None
            try:
                make_policy(n, scenario)
            except ConfigError as exc:
                fail(str(exc))
            if tuning is not None:
                progress.remove_task(tuning)
        for n in names:
            task = progress.add_task(f"{scenario.name} / {n}", total=scenario.workload.trajectories)
            try:
                results.append(simulate(scenario, make_policy(n, scenario), exact=exact,
                                        progress=lambda done, total, t=task: progress.update(t, completed=done)))
            except ConfigError as exc:
                fail(str(exc))
            except StallError as exc:   # the knobs leave the policy no move: the message names them
                fail(f"policy {n}: {exc}")
            except ActionError as exc:  # a policy broke the rules: a bug, not bad input
                bug(exc)
    return results


def run_reference(scenario: Scenario, results: list[dict], show_progress: bool) -> dict:
    """One clairvoyant run of `scenario`; each of `results` gets its distance from it."""
    from cadencerl.core.controller import StallError
    from cadencerl.runs.reference import with_reference

    with progress_bar(show_progress) as progress:
        task = progress.add_task(f"{scenario.name} / clairvoyant reference", total=scenario.workload.trajectories)
        try:
            return with_reference(results, scenario, lambda done, total: progress.update(task, completed=done))
        except StallError as exc:   # the knobs leave even the oracle no move
            fail(f"clairvoyant reference: {exc}")


def captioned(table, results: list[dict], reference: dict | None):
    """`table` with what its '% bound' and '% ref' columns are measured against under its caption."""
    table.caption = "\n".join(c for c in (table.caption, distance_note(results, reference)) if c)
    return table


def sim(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
        policy: str = PolicyOpt,
        grouped: bool = GroupedOpt,
        json_out: Optional[str] = JsonOpt,
        exact: bool = typer.Option(False, "--exact", help="step every decode iteration instead of the closed form (to check it; not --reference)"),
        reference: bool = typer.Option(REFERENCE_BY_DEFAULT, "--reference/--no-reference", help=REFERENCE_HELP),
        seed: Optional[int] = SeedOpt, trajectories: Optional[int] = TrajectoriesOpt,
        batch_size: Optional[int] = BatchOpt, eta: Optional[int] = EtaOpt, delta: Optional[int] = DeltaOpt,
        trainer_cluster: Optional[str] = TrainerClusterOpt) -> None:
    """Simulate one policy on a scenario and print its figures."""
    s = load_scenario(scenario, config, dict(seed=seed, trajectories=trajectories, batch_size=batch_size, eta=eta,
                                             delta=delta, trainer_cluster=trainer_cluster), json_out)
    to_stderr = json_out == "-"
    result = run_policies(s, [policy], exact, show_progress=True, grouped=grouped)[0]
    ref = run_reference(s, [result], show_progress=True) if reference else None
    print_tables([captioned(run_table([result], f"{s.name}: {result['policy']}"), [result], ref),
                  per_accelerator_table(result)], to_stderr)
    write_json(json_out, result)


def compare(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
            policies: str = typer.Option("cadence,laminar,areal,least-loaded", "--policies",
                                         help="comma-separated, each given once: " + POLICY_HELP),
            grouped: bool = GroupedOpt,
            json_out: Optional[str] = JsonOpt,
            reference: bool = typer.Option(REFERENCE_BY_DEFAULT, "--reference/--no-reference", help=REFERENCE_HELP),
            seed: Optional[int] = SeedOpt, trajectories: Optional[int] = TrajectoriesOpt,
            batch_size: Optional[int] = BatchOpt, eta: Optional[int] = EtaOpt, delta: Optional[int] = DeltaOpt,
            trainer_cluster: Optional[str] = TrainerClusterOpt) -> None:
    """Run several policies on the same seeded workload, side by side."""
    knobs = dict(seed=seed, trajectories=trajectories, batch_size=batch_size, eta=eta, delta=delta,
                 trainer_cluster=trainer_cluster)
    s = load_scenario(scenario, config, knobs, json_out)
    names = distinct("policies", [p.strip() for p in policies.split(",") if p.strip()])
    if not names:
        fail("policies: give at least one policy name")
    results = run_policies(s, names, False, show_progress=True, grouped=grouped)
    ref = run_reference(s, results, show_progress=True) if reference else None
    print_tables([captioned(comparison_table(results, "cadence"), results, ref)], json_out == "-")
    write_json(json_out, results)


def sensitivity(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
                policy: str = PolicyOpt,
                etas: str = typer.Option("1,2,3,4,6", "--etas", help="staleness bounds to try (the rows): "
                                         "comma-separated distinct integers >= 0"),
                deltas: str = typer.Option("512,1024,2048,4096", "--deltas", help="decode reserves per trajectory "
                                           "to try, tokens (the columns): comma-separated distinct integers >= 0"),
                json_out: Optional[str] = JsonOpt, trajectories: Optional[int] = TrajectoriesOpt,
                batch_size: Optional[int] = BatchOpt, jobs: Optional[int] = JobsOpt, ray: Optional[str] = RayOpt) -> None:
    """Throughput and P95 latency over a grid of eta (admission budget) and delta (decode reserve)."""
    from cadencerl.report.runner import ReportError, simulate_one
    from cadencerl.runs.registry import make_policy

    s = load_scenario(scenario, config, dict(trajectories=trajectories, batch_size=batch_size), json_out)
    eta_values, delta_values = int_list("etas", etas), int_list("deltas", deltas)
    grid = [(eta, delta) for eta in eta_values for delta in delta_values]
    try:
        make_policy(policy, s)     # an unknown name fails before any run
        with progress_bar(True) as progress:
            task = progress.add_task(f"{s.name} / {policy} sensitivity", total=len(grid))
            runs = fanout_from(jobs, ray).map(simulate_one, [(s.with_knobs(eta=e, delta=d), policy) for e, d in grid],
                                              lambda done, _total: progress.update(task, completed=done))
    except ConfigError as exc:
        fail(str(exc))
    except ReportError as exc:     # the knobs leave the policy no move: the message names them
        fail(f"policy {exc}")
    for r, (eta, delta) in zip(runs, grid):
        r.update(eta=eta, delta=delta)
    print_tables([sensitivity_table(f"{s.name}: {policy}", runs, eta_values, delta_values)], json_out == "-")
    write_json(json_out, runs)


def sweep(scenario: Optional[str] = ScenarioOpt, config: Optional[Path] = ConfigOpt,
          grid: str = typer.Option("quick", "--grid", help="quick (16 points) or full (75 points)"),
          json_out: Optional[str] = JsonOpt, seed: Optional[int] = SeedOpt,
          trajectories: Optional[int] = TrajectoriesOpt, batch_size: Optional[int] = BatchOpt,
          eta: Optional[int] = EtaOpt, delta: Optional[int] = DeltaOpt,
          trainer_cluster: Optional[str] = TrainerClusterOpt, jobs: Optional[int] = JobsOpt,
          ray: Optional[str] = RayOpt) -> None:
    """Tune the cache-aware router's thresholds and weight update on a scenario; the quick grid's best is what
    `cache-aware-tuned` runs on it (a full grid's is shown and saved apart). The sizing options are
    `compare`'s, so a resized comparison can be swept ahead of it."""
    from cadencerl.runs import sweep as sw

    if grid not in ("quick", "full"):
        fail(f"grid: expected quick or full, got {grid!r}")
    s = load_scenario(scenario, config, dict(seed=seed, trajectories=trajectories, batch_size=batch_size, eta=eta,
                                             delta=delta, trainer_cluster=trainer_cluster), json_out)   # as compare
    points = sw.QUICK_GRID if grid == "quick" else sw.FULL_GRID
    try:
        with progress_bar(True) as progress:
            grid_task = progress.add_task(f"{s.name} / cache-aware sweep", total=None)
            update_task = progress.add_task(f"{s.name} / weight update, {sw.update_tune_batches(s)} batches", total=None)
            results, updates = sw.tune(
                s, points, lambda done, total: progress.update(grid_task, completed=done, total=total),
                lambda done, total: progress.update(update_task, completed=done, total=total), fanout_from(jobs, ray))
    except ConfigError as exc:    # Ray missing or unreachable
        fail(str(exc))
    best, path = sw.save(s, points, results, updates)
    table = sweep_table(s.name, results)
    used = "for cache-aware-tuned " if grid == "quick" else ""
    table.caption = f"best: {best} " + (f"(saved {used}in {path})" if path is not None else "(not saved: see the warning)")
    print_tables([table, version_switch_table(s.name, updates)], json_out == "-")
    write_json(json_out, {"best": best, "results": results, "weight_update_results": updates})


def scenarios(name: Optional[str] = typer.Argument(None, help="print this one's file (YAML), to start your own from")) -> None:
    """List the built-in scenarios, or print one's file."""
    if name is None:
        print_tables([scenarios_table()], False)
        return
    from cadencerl.config import builtin_text
    try:
        typer.echo(builtin_text(name), nl=False)
    except ConfigError as exc:
        fail(str(exc))


def report(out: Optional[Path] = typer.Option(None, "--out", "-o", help="directory for report.md, figures/, results.json (required)"),
           quick: bool = typer.Option(False, "--quick", help="every pool at a quarter of its devices, 16 iterations of batch 1024 per run, fewer sweep points, ablation on one pool"),
           trajectories: Optional[int] = typer.Option(None, min=16, help="trajectories per run, at least 16 (batch = a sixteenth, rounded down); overrides --quick's size"),
           seed: Optional[int] = typer.Option(None, min=0, help="workload seed for every run (default: the scenarios' own, 0)"),
           jobs: Optional[int] = typer.Option(None, min=1, max=MAX_JOBS, help="simulations run in parallel (default: the CPU count)"),
           ray: Optional[str] = RayOpt) -> None:
    """Run the evaluation matrix (the paper's section 6) and write a markdown report with tables and plots."""
    from cadencerl.report.build import OutputError, build_report, check_out_dir
    from cadencerl.report.runner import ReportError

    if out is None:
        fail("out: give --out DIR")
    try:
        check_out_dir(out)
        path, headline = build_report(out, quick=quick, trajectories=trajectories, seed=seed, processes=jobs,
                                      ray_address=ray)
    except (ConfigError, OutputError) as exc:
        fail(str(exc))
    except ReportError as exc:   # a run of the built-in matrix failed: not the user's input
        bug(exc)
    from rich.table import Table

    from cadencerl.report.sections.pools import RATIO_HEADERS

    kv_bound = quick and trajectories is None
    table = Table(title="CadenceRL vs the best baseline, heterogeneous pools, steady window (report.md, section 2)"
                  + (": each pool at a quarter of its devices and batch, the full report's KV pressure" if kv_bound else ""))
    for h in RATIO_HEADERS:
        table.add_column(h.replace("**", ""), justify="left" if h == "pool" else "right")
    for row in headline:
        table.add_row(*(str(c).replace("**", "") for c in row))
    print_tables([table], False)
    console().print(f"report written to {path}")
