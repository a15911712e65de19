"""How much KV-aware admission can be worth on a pool: its ceiling, measured (issue 13).

MISA-T's throughput gain over a router comes from what KV pressure costs the router: preemptions,
re-prefill of prefixes evicted across tool waits, a running batch cut short. Admission cannot add
KV; at best it removes those costs. So the router on the same pool with the pressure removed (each
worker's KV capacity multiplied by `--kv-scale`, a what-if no real pool has) bounds what any
admission layer in front of it can reach. This runs both systems at the real KV and at the scaled
one, as `cadencerl compare` runs them (each tuned by its own sweep), and prints the ceiling: the
router with ample KV over the router at the real KV, beside MISA-T's ratio at the real KV.

Usage: python benchmarks/misa/kv_headroom.py -c benchmarks/misa/mixed-h200-50.yaml --kv-scale 8 [--jobs 2]
       python benchmarks/misa/kv_headroom.py -s mixed-h100 --kv-scale 56
       [--trajectories N] [--batch-size N] [--eta N] [--trainer-cluster NAME] [--out FILE]

Each KV size gets a private sweep cache (a temporary folder): the sweep's cache is keyed by the
scenario and the code, not by the KV a worker has, so a shared one would hand the scaled run
thresholds tuned for the real KV.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cadencerl.cli.common import scenario_from_options as scenario_of  # noqa: E402
from cadencerl.config import ConfigError  # noqa: E402
from cadencerl.hardware.perf import WorkerPerf  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402

SYSTEMS = ("misa+cache-aware-tuned", "cache-aware-tuned")
LABELS = {SYSTEMS[0]: "MISA-T", SYSTEMS[1]: "router"}
FIGURES = ("throughput_tok_s", "steady_throughput_tok_s", "prefix_hit_rate", "preemptions",
           "prefill_tokens", "mixture_dtv_steady_pp", "latency_p95_s")


@contextmanager
def scaled_kv(scale: float) -> Iterator[None]:
    """Every worker's KV capacity times `scale` while inside (a what-if for the bound)."""
    real = WorkerPerf.kv_capacity_tokens

    def scaled(self: WorkerPerf) -> int:
        return int(real(self) * scale)

    WorkerPerf.kv_capacity_tokens = scaled  # type: ignore[method-assign]
    try:
        yield
    finally:
        WorkerPerf.kv_capacity_tokens = real  # type: ignore[method-assign]


def run_at(args: argparse.Namespace, scale: float, cache_root: str) -> list[dict]:
    """Both systems at one KV scale, in one process that owns that scale's sweep cache."""
    os.environ["CADENCERL_CACHE_DIR"] = str(Path(cache_root) / f"kv{scale:g}")
    scenario, rows = scenario_of(args), []
    with scaled_kv(scale):
        for system in reversed(SYSTEMS):   # the router first: MISA-T's stage reads its sweep
            r = simulate(scenario, make_policy(system, scenario))
            rows.append({"system": system, "kv_scale": scale, **{k: r.get(k) for k in FIGURES}})
    return rows


def table(name: str, rows: list[dict]) -> Table:
    t = Table(title=f"{name}: each system at the real KV and with its pressure removed")
    for col in ("system", "KV x", "tok/s", "steady tok/s", "hit rate", "preemptions", "prefill G tok",
                "steady D_TV pp", "P95 s"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(LABELS[r["system"]], f"{r['kv_scale']:g}", f"{r['throughput_tok_s']:,.0f}",
                  f"{r['steady_throughput_tok_s'] or 0:,.0f}", f"{100 * r['prefix_hit_rate']:.1f}%",
                  f"{r['preemptions']:,}", f"{r['prefill_tokens'] / 1e9:.2f}",
                  f"{r['mixture_dtv_steady_pp'] or 0:.2f}", f"{r['latency_p95_s']:.0f}")
    return t


def ratios(rows: list[dict], scale: float) -> dict[str, float]:
    """The ceiling (router with ample KV over the router) and MISA-T's ratio at each KV size."""
    at = {(r["system"], r["kv_scale"]): r for r in rows}
    misa, router = SYSTEMS
    out = {}
    for figure in ("throughput_tok_s", "steady_throughput_tok_s"):
        base = at[(router, 1.0)][figure]
        out[f"ceiling_{figure}"] = at[(router, scale)][figure] / base
        out[f"misa_{figure}"] = at[(misa, 1.0)][figure] / base
        out[f"misa_ample_{figure}"] = at[(misa, scale)][figure] / at[(router, scale)][figure]
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-s", "--scenario")
    where.add_argument("-c", "--config")
    p.add_argument("--kv-scale", type=float, required=True, help="KV capacity multiplier for the ceiling (> 1)")
    p.add_argument("--trajectories", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--eta", type=int)
    p.add_argument("--trainer-cluster")
    p.add_argument("--jobs", type=int, default=2, help="processes (one per KV size), 1 or 2")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not args.kv_scale > 1:
        p.error(f"--kv-scale: must be greater than 1 (got {args.kv_scale:g})")
    if args.jobs not in (1, 2):
        p.error(f"--jobs: must be 1 or 2 (got {args.jobs})")
    return args


def main(argv: list[str] | None = None) -> int:
    args, console = parse(argv), Console()
    try:
        scenario = scenario_of(args)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    with tempfile.TemporaryDirectory(prefix="cadencerl-kv-headroom-") as cache_root, \
            ProcessPoolExecutor(args.jobs) as pool:
        console.print(f"{scenario.name}: 2 systems x KV x1 and x{args.kv_scale:g}, {args.jobs} process(es)")
        futures = [pool.submit(run_at, args, scale, cache_root) for scale in (1.0, args.kv_scale)]
        rows = [row for f in futures for row in f.result()]
    console.print(table(scenario.name, rows))
    r = ratios(rows, args.kv_scale)
    console.print(f"ceiling (router at KV x{args.kv_scale:g} / router): {r['ceiling_throughput_tok_s']:.3f}x "
                  f"({r['ceiling_steady_throughput_tok_s']:.3f}x steady); MISA-T / router at the real KV: "
                  f"{r['misa_throughput_tok_s']:.3f}x ({r['misa_steady_throughput_tok_s']:.3f}x); "
                  f"with ample KV: {r['misa_ample_throughput_tok_s']:.3f}x ({r['misa_ample_steady_throughput_tok_s']:.3f}x)")
    stem = Path(args.config).stem if args.config else args.scenario
    out = args.out or REPO / "benchmarks" / "results" / f"misa_kv_headroom_{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"scenario": scenario.name, "kv_scale": args.kv_scale, "rows": rows, **r}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
