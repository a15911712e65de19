"""How much KV-aware admission can be worth on a pool: its ceiling, measured (issue 13).

MISA-T's throughput gain over a router comes from what KV pressure costs the router: preemptions,
re-prefill of prefixes evicted across tool waits, a running batch cut short. Admission cannot add
KV; at best it removes those costs. So the router on the same pool with the pressure removed bounds
what any admission layer in front of it can reach. This runs both systems as `cadencerl compare`
runs them (each tuned by its own sweep) on three pools, and prints each one's ratio to the router
on the real pool:

* `real`: the pool as it is;
* `prefixes kept`: the real KV for the running set, but no cached prefix is ever evicted (each
  engine's prefix cache unbounded beside it). Re-prefill costs nothing beyond a first prompt and a
  weight update's reset, while the running batch is still what the real KV holds: the part of the
  ceiling that admission can hand back (it cannot make the KV hold a larger batch);
* `KV xN`: every worker's KV capacity multiplied by `--kv-scale`, a what-if no real pool has: the
  whole ceiling, re-prefill and the batch the KV cuts short together.

Usage: python benchmarks/misa/kv_headroom.py -c benchmarks/misa/mixed-h200-50.yaml --kv-scale 8 [--jobs 2]
       python benchmarks/misa/kv_headroom.py -s mixed-h100 --kv-scale 56
       [--trajectories N] [--batch-size N] [--eta N] [--trainer-cluster NAME] [--out FILE]

Each pool gets a private sweep cache (a temporary folder): the sweep's cache is keyed by the
scenario and the code, not by the KV a worker has, so a shared one would hand a what-if pool
thresholds tuned for the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
if __name__ == "__main__":   # it patches the prefix cache's eviction, which the compiled simulator (`make native`)
    os.environ["CADENCERL_PURE_PYTHON"] = "1"   # does not allow: plain Python, here and in its workers

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cadencerl.cli.common import scenario_from_options as scenario_of  # noqa: E402
from cadencerl.config import ConfigError  # noqa: E402
from cadencerl.hardware.perf import WorkerPerf  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.sim.prefix_cache import PrefixCache  # noqa: E402

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


@contextmanager
def prefixes_kept() -> Iterator[None]:
    """No engine evicts a cached prefix while inside: `trim`, the only eviction a running set's
    growth causes, does nothing (a weight update still resets the cache, as the real pool does)."""
    real = PrefixCache.trim
    PrefixCache.trim = lambda self, free_tokens: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        PrefixCache.trim = real  # type: ignore[method-assign]


def pools(scale: float) -> dict[str, Callable[[], AbstractContextManager]]:
    """The three pools, by label: the real one and the two what-ifs (see the module docstring)."""
    return {"real": nullcontext, "prefixes kept": prefixes_kept, f"KV x{scale:g}": lambda: scaled_kv(scale)}


def run_on(args: argparse.Namespace, pool: str, cache_root: str) -> list[dict]:
    """Both systems on one pool, in one process that owns that pool's sweep cache."""
    os.environ["CADENCERL_CACHE_DIR"] = str(Path(cache_root) / pool.replace(" ", "-"))
    scenario, rows = scenario_of(args), []
    with pools(args.kv_scale)[pool]():
        for system in reversed(SYSTEMS):   # the router first: MISA-T's stage reads its sweep
            r = simulate(scenario, make_policy(system, scenario))
            rows.append({"system": system, "pool": pool, **{k: r.get(k) for k in FIGURES}})
    return rows


def table(name: str, rows: list[dict]) -> Table:
    t = Table(title=f"{name}: each system on the real pool and with its KV pressure removed")
    for col in ("system", "pool", "tok/s", "steady tok/s", "hit rate", "preemptions", "prefill G tok",
                "steady D_TV pp", "P95 s"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(LABELS[r["system"]], r["pool"], f"{r['throughput_tok_s']:,.0f}",
                  f"{r['steady_throughput_tok_s'] or 0:,.0f}", f"{100 * r['prefix_hit_rate']:.1f}%",
                  f"{r['preemptions']:,}", f"{r['prefill_tokens'] / 1e9:.2f}",
                  f"{r['mixture_dtv_steady_pp'] or 0:.2f}", f"{r['latency_p95_s']:.0f}")
    return t


def ratios(rows: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Each system on each pool over the router on the real pool, whole run and steady:
    `{pool: {system: {figure: ratio}}}`; the router's what-if rows are the ceilings."""
    base = next(r for r in rows if r["system"] == SYSTEMS[1] and r["pool"] == "real")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for r in rows:
        out.setdefault(r["pool"], {})[r["system"]] = {
            f: r[f] / base[f] for f in ("throughput_tok_s", "steady_throughput_tok_s")}
    return out


def summary(r: dict[str, dict[str, dict[str, float]]]) -> str:
    misa, router = SYSTEMS

    def x(pool: str, system: str) -> str:
        f = r[pool][system]
        return f"{f['throughput_tok_s']:.3f}x ({f['steady_throughput_tok_s']:.3f}x steady)"
    ample = next(p for p in r if p.startswith("KV x"))
    return (f"over the router on the real pool: MISA-T {x('real', misa)}; ceilings: prefixes kept "
            f"{x('prefixes kept', router)}, {ample} {x(ample, router)}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-s", "--scenario")
    where.add_argument("-c", "--config")
    p.add_argument("--kv-scale", type=float, required=True, help="KV capacity multiplier for the ceiling (> 1)")
    p.add_argument("--trajectories", type=int)
    p.add_argument("--seed", type=int, help="workload seed (default: the scenario's)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--eta", type=int)
    p.add_argument("--trainer-cluster")
    p.add_argument("--jobs", type=int, default=2, help="processes (the three pools shared among them), 1 to 3")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not args.kv_scale > 1:
        p.error(f"--kv-scale: must be greater than 1 (got {args.kv_scale:g})")
    if args.jobs not in (1, 2, 3):
        p.error(f"--jobs: must be 1, 2 or 3 (got {args.jobs})")
    return args


def main(argv: list[str] | None = None) -> int:
    args, console = parse(argv), Console()
    try:
        scenario = scenario_of(args)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    labels = list(pools(args.kv_scale))
    with tempfile.TemporaryDirectory(prefix="cadencerl-kv-headroom-") as cache_root, \
            ProcessPoolExecutor(args.jobs) as executor:
        console.print(f"{scenario.name}: 2 systems on {len(labels)} pools ({', '.join(labels)}), "
                      f"{args.jobs} process(es)")
        futures = [executor.submit(run_on, args, pool, cache_root) for pool in labels]
        rows = [row for f in futures for row in f.result()]
    console.print(table(scenario.name, rows))
    r = ratios(rows)
    console.print(summary(r))
    stem = Path(args.config).stem if args.config else args.scenario
    out = args.out or REPO / "benchmarks" / "results" / f"misa_kv_headroom_{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"scenario": scenario.name, "seed": scenario.seed, "kv_scale": args.kv_scale,
                               "rows": rows, "over_router_real": r}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
