"""MISA-T and the tuned router under every weight update, on the whole run (issue 13).

`cadencerl compare` gives each side the weight update its sweep's second stage picked from an
8-batch tuning run (`runs/sweep.py`). Over 50 batches the order of the three can differ, so a
ratio taken at the tuned picks may flatter either side. This runs both systems under each weight
update (`when-idle`, `interrupt`, `in-place`; `policies/routers.py`) on the whole scenario, at the
router's tuned thresholds, and prints each side's best and the ratio of the bests.

Usage: python benchmarks/misa/weight_updates.py -c benchmarks/misa/mixed-h200-50.yaml [--jobs 2]
       python benchmarks/misa/weight_updates.py -s mixed-h100-235b --trajectories 102400 --batch-size 2048
       [--trainer-cluster h100]
       [--out FILE, default benchmarks/results/misa_weight_updates_<file stem or scenario>[-<trajectories>].json]

Set CADENCERL_CACHE_DIR to the folder a `compare` of the same scenario used, and the thresholds
come from its sweep instead of a new one.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cadencerl.cli.common import scenario_from_options as scenario_of  # noqa: E402
from cadencerl.config import ConfigError  # noqa: E402
from cadencerl.policies.routers import VERSION_SWITCHES  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.runs.sweep import tuned_thresholds  # noqa: E402

SYSTEMS = ("misa+cache-aware-tuned", "cache-aware-tuned")
FIGURES = ("throughput_tok_s", "steady_throughput_tok_s", "latency_p95_s", "prefix_hit_rate",
           "mixture_dtv_steady_pp", "preemptions")


def run_one(args: argparse.Namespace, system: str, update: str) -> dict:
    """One system with one weight update, at the router's tuned thresholds (the sweep's cache)."""
    scenario = scenario_of(args)
    r = simulate(scenario, make_policy(system, scenario, version_switch=update))
    return {"system": system, "version_switch": update, **{k: r.get(k) for k in FIGURES}}


def _figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(name: str, rows: list[dict]) -> Table:
    t = Table(title=f"{name}: each system under each weight update, whole run")
    for col in ("system", "weight update", "tok/s", "steady tok/s", "P95 s", "hit rate", "steady D_TV pp", "preemptions"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["system"], r["version_switch"], f"{r['throughput_tok_s']:,.0f}",
                  _figure(r["steady_throughput_tok_s"], ",.0f"), f"{r['latency_p95_s']:.1f}",
                  f"{100 * r['prefix_hit_rate']:.1f}%", _figure(r["mixture_dtv_steady_pp"], ".2f"),
                  f"{r['preemptions']:,}")
    return t


def best(rows: list[dict], system: str, figure: str) -> dict:
    """A system's best weight update by `figure` (the sweep's second stage ranks by steady throughput)."""
    return max((r for r in rows if r["system"] == system), key=lambda r: r[figure] or 0.0)


def ratio_of_bests(rows: list[dict], figure: str) -> tuple[float, str, str]:
    """MISA-T's best over the router's best by `figure`, and the weight update each one took."""
    misa, router = best(rows, SYSTEMS[0], figure), best(rows, SYSTEMS[1], figure)
    return (misa[figure] or 0.0) / (router[figure] or 1.0), misa["version_switch"], router["version_switch"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--config", help="a scenario file")
    source.add_argument("-s", "--scenario", help="a built-in scenario")
    parser.add_argument("--trajectories", type=int, help="sessions per run")
    parser.add_argument("--seed", type=int, help="workload seed (default: the scenario's)")
    parser.add_argument("--batch-size", type=int, help="trainer batch (with --trajectories)")
    parser.add_argument("--trainer-cluster", help="put the trainer in this cluster of the pool")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="JSON file (default benchmarks/results/misa_weight_updates_<scenario>.json)")
    args = parser.parse_args()
    try:
        scenario = scenario_of(args)
    except ConfigError as exc:
        parser.error(str(exc))
    # tuned here once (and cached on disk), so the runs below read the sweep instead of each repeating it
    thresholds = {k: v for k, v in tuned_thresholds(scenario).items() if k != "version_switch"}
    runs = [(system, update) for system in SYSTEMS for update in VERSION_SWITCHES]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_one, *zip(*[(args, s, u) for s, u in runs])))
    label = f"{scenario.name} ({scenario.workload.trajectories:,} sessions, batch {scenario.trainer.batch_size:,})"
    console = Console(width=None if sys.stdout.isatty() else 150)   # a log keeps every column
    console.print(table(label, rows))
    ratio, misa_whole, router_whole = ratio_of_bests(rows, "throughput_tok_s")
    steady, misa_steady, router_steady = ratio_of_bests(rows, "steady_throughput_tok_s")
    console.print(f"thresholds {thresholds}. MISA-T / router, each at its best: whole run {ratio:.3f}x "
                  f"(MISA-T {misa_whole}, router {router_whole}); steady window {steady:.3f}x "
                  f"(MISA-T {misa_steady}, router {router_steady})")
    stem = Path(args.config).stem if args.config else args.scenario
    stem += f"-{args.trajectories}" if args.trajectories else ""
    stem += f"-trainer-in-{args.trainer_cluster}" if args.trainer_cluster else ""
    out = Path(args.out or REPO / "benchmarks" / "results" / f"misa_weight_updates_{stem}.json")
    out.write_text(json.dumps({"scenario": label, "thresholds": thresholds, "rows": rows,
                               "ratio_of_bests": ratio, "steady_ratio_of_bests": steady}, indent=2) + "\n")
    console.print(f"written {out}")


if __name__ == "__main__":
    main()
