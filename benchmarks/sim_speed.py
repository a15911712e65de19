"""How fast is the simulator? A paper-scale single-policy run, closed form against exact stepping.

Usage: python benchmarks/sim_speed.py [--scenario 16a16b8h] [--policy cadence] [--trajectories N]
       python benchmarks/sim_speed.py --every-scenario [--policy cadence]
`--trajectories N` scales the trainer batch with it, as `cadencerl compare` does; bad input is one
line `error: FIELD: ...` and exit code 2. Prints simulated decode tokens per wall second for both
modes, and as its last line one JSON
object with `trajectories`, `wall_time_s`, `exact_wall_time_s`, `speedup` and `max_rel_diff`.
`--every-scenario` runs each built-in scenario at a small size (96 trajectories, 48 for the
multi-turn ones; cpu-pair as it is) in both modes and prints the largest relative difference of
each, then one JSON object with the worst.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's cadencerl

from cadencerl.cli.common import scenario_from_options  # noqa: E402
from cadencerl.config import ConfigError, builtin_scenario  # noqa: E402
from cadencerl.runs.registry import make_policy  # noqa: E402
from cadencerl.runs.simulate import simulate  # noqa: E402

COMPARED = ("throughput_tok_s", "latency_p50_s", "latency_p95_s", "latency_p99_s", "sim_time_s",
            "tokens_generated", "preemptions")


def max_rel_diff(closed: dict, exact: dict) -> float:
    return max(abs(closed[k] - exact[k]) / max(abs(exact[k]), 1e-9) for k in COMPARED)


def every_scenario(policy: str) -> None:
    import cadencerl

    names = sorted(p.stem for p in (Path(cadencerl.__file__).parent / "scenarios").glob("*.yaml"))
    worst = {}
    for name in names:
        s = builtin_scenario(name)
        if name != "cpu-pair":
            n = 48 if name.startswith("mixed") else 96
            workload: dict = {"trajectories": n}
            if s.workload.classes is None:      # a mixed workload's classes keep their own shapes
                workload.update(group_size=4, response={"median": 768, "sigma": 1.0, "cap": 2048})
            s = s.with_overrides(workload=workload, trainer={"batch_size": n // 3, "train_time_s": 5.0})
        t0 = time.perf_counter()
        closed = simulate(s, make_policy(policy, s))
        t1 = time.perf_counter()
        exact = simulate(s, make_policy(policy, s), exact=True)
        t2 = time.perf_counter()
        worst[name] = max_rel_diff(closed, exact)
        print(f"  {name:12s}: closed form {t1 - t0:6.2f} s ({closed['events']:>7,} events), exact {t2 - t1:6.2f} s "
              f"({exact['events']:>9,} events), max rel diff {worst[name]:.2e}")
    print(json.dumps({"policy": policy, "max_rel_diff": max(worst.values()), "by_scenario": worst}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="16a16b8h")
    ap.add_argument("--policy", default="cadence")
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--skip-exact", action="store_true", help="closed form only (the exact run is slow)")
    ap.add_argument("--every-scenario", action="store_true", help="closed form vs exact on every built-in scenario")
    args = ap.parse_args()
    try:
        if args.every_scenario:
            every_scenario(args.policy)
        else:
            measure(args, scenario_from_options(args))   # --trajectories scales the batch, as in `compare`
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def measure(args: argparse.Namespace, scenario) -> None:
    """Closed form (and, unless --skip-exact, exact stepping) on one scenario; the JSON line last."""
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
        out["max_rel_diff"] = max_rel_diff(closed, exact)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
