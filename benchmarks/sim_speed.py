"""How fast is the simulator? A paper-scale single-policy run, closed form against exact stepping.

Usage: python benchmarks/sim_speed.py [--scenario 16a16b8h] [--policy cadence] [--trajectories N]
       python benchmarks/sim_speed.py --every-scenario [--policy cadence]
       python benchmarks/sim_speed.py --scale 1,4,16,32 [--trajectories N] [--policy cadence]
`--trajectories N` scales the trainer batch with it, as `cadencerl compare` does; bad input is one
line `error: FIELD: ...` and exit code 2. Prints simulated decode tokens per wall second for both
modes, and as its last line one JSON
object with `trajectories`, `wall_time_s`, `exact_wall_time_s`, `speedup` and `max_rel_diff`.
`--every-scenario` runs each built-in scenario at a small size (96 trajectories, 48 for the
multi-turn ones; cpu-pair as it is) in both modes and prints the largest relative difference of
each, then one JSON object with the worst. `--scale K,...` runs the pool, workload and batch at K
times their size (runs/scale.py), each K in a fresh process: wall and CPU time, events/s, peak RSS,
and the growth exponent of CPU time in trajectories (figures: docs/simulator.md, "Speed and scale").
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's cadencerl

from cadencerl.cli.common import scenario_from_options  # noqa: E402
from cadencerl.config import ConfigError, builtin_scenario  # noqa: E402
from cadencerl.native import compiled  # noqa: E402
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
    ap.add_argument("--scale", default=None, help="comma-separated factors K: the pool, workload and batch K times")
    ap.add_argument("--one-scale", type=int, default=None, help=argparse.SUPPRESS)   # the child of --scale
    args = ap.parse_args()
    try:
        if args.one_scale is not None:
            one_scale(args, args.one_scale)
        elif args.scale is not None:
            scales(args)
        elif args.every_scenario:
            every_scenario(args.policy)
        else:
            measure(args, scenario_from_options(args))   # --trajectories scales the batch, as in `compare`
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def one_scale(args: argparse.Namespace, k: int) -> None:
    """One run at scale `k`, in this (fresh) process; one JSON line."""
    from cadencerl.runs.scale import scaled

    s = scaled(builtin_scenario(args.scenario), k, args.trajectories)
    cpu, wall = time.process_time(), time.perf_counter()
    r = simulate(s, make_policy(args.policy, s))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"scale": k, "compiled": compiled(), "devices": sum(g.devices for g in s.pool),
                      "trajectories": r["trajectories_completed"],
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "events": r["events"],
                      "events_per_cpu_s": round(r["events"] / cpu), "peak_rss_mb":
                      round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "steady_throughput_tok_s": r.get("steady_throughput_tok_s"),
                      "latency_p95_s": r["latency_p95_s"]}), flush=True)


def scales(args: argparse.Namespace) -> None:
    """Each K in its own process (so each peak RSS is its own); then the growth exponent."""
    ks = [int(k) for k in args.scale.split(",") if k.strip()]
    if not ks or min(ks) < 1:
        raise ConfigError(f"scale: expected comma-separated integers >= 1, got {args.scale!r}")
    rows = []
    for k in ks:
        cmd = [sys.executable, __file__, "--one-scale", str(k), "--scenario", args.scenario, "--policy", args.policy]
        if args.trajectories:
            cmd += ["--trajectories", str(args.trajectories)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        rows.append(json.loads(out))
        r = rows[-1]
        code = "compiled" if r["compiled"] else "plain Python"
        print(f"  K={k:3d} ({code}): {r['devices']:6,} devices, {r['trajectories']:>9,} trajectories, "
              f"wall {r['wall_s']:8.2f} s, CPU {r['cpu_s']:8.2f} s, {r['events_per_cpu_s']:>8,} events/CPU s, "
              f"peak RSS {r['peak_rss_mb']:,} MB",
              flush=True)
    if len(rows) > 1 and rows[-1]["trajectories"] != rows[0]["trajectories"]:
        a, b = rows[0], rows[-1]
        exponent = math.log(b["cpu_s"] / a["cpu_s"]) / math.log(b["trajectories"] / a["trajectories"])
        print(f"  CPU time grows as n^{exponent:.2f} in trajectories (K={a['scale']} to K={b['scale']})")
    print(json.dumps({"scenario": args.scenario, "policy": args.policy, "runs": rows}))


def measure(args: argparse.Namespace, scenario) -> None:
    """Closed form (and, unless --skip-exact, exact stepping) on one scenario; the JSON line last."""
    devices = sum(g.devices for g in scenario.pool)
    code = "compiled" if compiled() else "plain Python"
    print(f"{scenario.name} ({code}): {scenario.workload.trajectories} trajectories, "
          f"cap {scenario.workload.response.cap} tokens, {devices} devices, policy {args.policy}")
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
    out = {"scenario": scenario.name, "policy": args.policy, "compiled": compiled(),
           "trajectories": closed["trajectories_completed"],
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
