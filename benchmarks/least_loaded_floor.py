"""Does CadenceRL stay at or above the least-loaded floor when the pool is not KV-bound? (issue 12)

Usage: python benchmarks/least_loaded_floor.py [--pools 16a16b,...] [--seeds 0,1,...,9]
           [--policies cadence,benchmarks/variants/cadence-any-shed-drain.yaml,...]
           [--floor-twin] [--jobs J] [--out benchmarks/results/least_loaded_floor.json]

Runs `benchmarks/scenarios/POOL-b1024.yaml` (the built-in heterogeneous pools at batch 1,024,
16 iterations: eta binds, not KV) for every pool and seed, with each CadenceRL variant and
`least-loaded`, and prints each variant's steady-window throughput and P95 (from admission) as a
ratio to least-loaded's on the same workload. The goal: throughput >= 0.98x and P95 <= 1.00x
("ok"); a P95 within 0.5% is marked "tie". Seeds matter: one seed's hot spot can move a ratio by
30%, so the summary counts every pool and seed.

`--floor-twin` also runs the floor with its ties in load broken toward the highest worker id instead
of the lowest (`least-loaded-ties-last`): the same rule with another arbitrary choice. Its ratio to
the floor is the floor's own resolution on that pool and seed (on a mixed pool the ids order the
accelerator types, so the tie-break decides which type a tie goes to).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cadencerl.config import Scenario, load_scenario_file  # noqa: E402
from cadencerl.policies.least_loaded import LeastLoaded  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402
from cadencerl.runs.steady import steady_view  # noqa: E402

POOLS = "16a16b,16a16b8h,16a8h,16b8h,32a,32b,h800-16"
VARIANTS = "cadence,benchmarks/variants/cadence-any-shed-drain.yaml,benchmarks/variants/cadence-no-fair-share.yaml"
FLOOR = "least-loaded"
TWIN = "least-loaded-ties-last"
MIN_THROUGHPUT, TIE = 0.98, 1.005


def b1024_scenario(pool: str, seed: int) -> Scenario:
    """`benchmarks/scenarios/POOL-b1024.yaml` with the workload seed `seed`."""
    scenario = load_scenario_file(REPO / "benchmarks" / "scenarios" / f"{pool}-b1024.yaml")
    return scenario.model_copy(update={"seed": seed})


def run_one(pool: str, seed: int, policy: str) -> dict:
    scenario = b1024_scenario(pool, seed)
    r = steady_view(simulate(scenario, _policy(policy, scenario)))
    return {"pool": pool, "seed": seed, "policy": policy, "throughput_tok_s": r["throughput_tok_s"],
            "latency_p95_s": r["latency_p95_s"], "evictions": r["evictions"], "preemptions": r["preemptions"]}


def _policy(name: str, scenario: Scenario):
    return LeastLoaded(ties_to_last=True) if name == TWIN else make_policy(str(REPO / name) if name.endswith(".yaml") else name, scenario)


def verdict(throughput: float, p95: float) -> str:
    if throughput < MIN_THROUGHPUT:
        return "LOW"
    return "ok" if p95 <= 1.0 else "tie" if p95 <= TIE else "P95"


def ratios(runs: list[dict], variants: list[str]) -> list[dict]:
    """Each variant's throughput and P95 over the floor's, per pool and seed."""
    by = {(r["pool"], r["seed"], r["policy"]): r for r in runs}
    out = []
    for (pool, seed, policy), r in by.items():
        if policy not in variants:
            continue
        floor = by[(pool, seed, FLOOR)]
        t, p = r["throughput_tok_s"] / floor["throughput_tok_s"], r["latency_p95_s"] / floor["latency_p95_s"]
        out.append({"pool": pool, "seed": seed, "policy": policy, "throughput_x": t, "p95_x": p,
                    "verdict": verdict(t, p)})
    return out


def summary(rows: list[dict], variant: str) -> str:
    mine = [r for r in rows if r["policy"] == variant]
    counts = {v: sum(r["verdict"] == v for r in mine) for v in ("ok", "tie", "P95", "LOW")}
    geo = math.exp(sum(math.log(r["p95_x"]) for r in mine) / len(mine))
    return (f"{variant:26s} ok {counts['ok']}/{len(mine)}, tie {counts['tie']}, P95 worse {counts['P95']}, "
            f"throughput low {counts['LOW']}; P95 geo-mean {geo:.3f}x, worst {max(r['p95_x'] for r in mine):.3f}x, "
            f"lowest throughput {min(r['throughput_x'] for r in mine):.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", default=POOLS)
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--policies", default=VARIANTS)
    ap.add_argument("--floor-twin", action="store_true", help=f"also run {TWIN}: the floor's own resolution")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "least_loaded_floor.json")
    args = ap.parse_args()
    pools, variants = args.pools.split(","), args.policies.split(",") + ([TWIN] if args.floor_twin else [])
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(p, s, v) for p in pools for s in seeds for v in [*variants, FLOOR]]
    with ProcessPoolExecutor(args.jobs) as ex:
        futures = [ex.submit(run_one, *job) for job in jobs]
        runs = []
        for i, f in enumerate(futures, 1):
            runs.append(f.result())
            print(f"\r{i}/{len(jobs)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    rows = ratios(runs, variants)
    print(f"{'pool':10s} seed " + "".join(f"{v:>28s}" for v in variants))
    for pool in pools:
        for seed in seeds:
            cells = {r["policy"]: r for r in rows if r["pool"] == pool and r["seed"] == seed}
            print(f"{pool:10s} {seed:4d} " + "".join(
                f"{cells[v]['throughput_x']:>14.3f} / {cells[v]['p95_x']:.3f} {cells[v]['verdict']:>4s}" for v in variants))
    print("throughput x / P95 x least-loaded, steady window; ok: >= 0.98x and <= 1.00x; tie: P95 within 0.5%")
    for v in variants:
        print(summary(rows, v))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs, "ratios": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
