"""How fast is the simulator? A paper-scale single-policy run, closed form against exact stepping.

Usage: python benchmarks/sim_speed.py [--scenario 16a16b8h] [--policy cadence] [--trajectories N]
Prints simulated decode tokens per wall second for both modes, and as its last line one JSON
object with `trajectories`, `wall_time_s`, `exact_wall_time_s` and `speedup`.
"""

from __future__ import annotations

import argparse
import json
import time

from cadencerl.config import builtin_scenario
from cadencerl.runs.registry import make_policy
from cadencerl.runs.simulate import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="16a16b8h")
    ap.add_argument("--policy", default="cadence")
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--skip-exact", action="store_true", help="closed form only (the exact run is slow)")
    args = ap.parse_args()
    scenario = builtin_scenario(args.scenario)
    if args.trajectories:
        scenario = scenario.with_overrides(workload={"trajectories": args.trajectories})
    devices = sum(g.devices for g in scenario.pool)
    print(f"{scenario.name}: {scenario.workload.trajectories} trajectories, cap {scenario.workload.response.cap} "
          f"tokens, {devices} devices, policy {args.policy}")
    runs = {}
    for mode in ("closed-form", "exact"):
        if mode == "exact" and args.skip_exact:
            continue
        t0 = time.perf_counter()
        r = simulate(scenario, make_policy(args.policy, scenario), exact=(mode == "exact"))
        wall = time.perf_counter() - t0
        runs[mode] = (r, wall)
        print(f"  {mode:11s}: wall {wall:8.2f} s, {r['events']:>9,} engine events, "
              f"{r['tokens_generated'] / wall:>14,.0f} simulated decode tokens per wall second "
              f"(sim throughput {r['throughput_tok_s']:,.0f} tok/s over {r['sim_time_s']:,.0f} s)")
    closed, wall = runs["closed-form"]
    out = {"scenario": scenario.name, "policy": args.policy, "trajectories": closed["trajectories_completed"],
           "devices": devices, "wall_time_s": round(wall, 3),
           "sim_tokens_per_wall_s": round(closed["tokens_generated"] / wall)}
    if "exact" in runs:
        exact, exact_wall = runs["exact"]
        out["exact_wall_time_s"] = round(exact_wall, 3)
        out["speedup"] = round(exact_wall / wall, 1)
        out["max_rel_diff"] = max(abs(closed[k] - exact[k]) / max(abs(exact[k]), 1e-9)
                                  for k in ("throughput_tok_s", "latency_p50_s", "latency_p95_s", "latency_p99_s",
                                            "sim_time_s", "tokens_generated", "preemptions"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
