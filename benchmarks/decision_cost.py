"""What the router's decisions cost a request, without HTTP: admission, placement and release.

Each request is a new session (no session key, as the capacity benchmark sends): it arrives, a
decision pass admits and places it, its reply ends and it is released, with `--in-flight`
requests open on the servers all along. A pass handles `--per-pass` arrivals, as one loop turn of
a loaded router gathers several (`RouterService.decide_soon`). The servers report 10% KV use, so
nothing binds. Rows: the default `misa+cache-aware` and `cache-aware` (no admission), one class
(clients that name none) and three (the default mix's), on 1 and 64 servers.
`--compare-tree PATH` runs another source tree (e.g. a `git archive` of main) in the same rounds,
alternated; each figure is the median over `--rounds`. The last line is one JSON object.

    .venv/bin/python benchmarks/decision_cost.py [--rounds 5] [--compare-tree PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tree_child import run_child

ROWS = [(policy, classes, servers) for servers in (1, 64) for policy in ("misa+cache-aware", "cache-aware")
        for classes in (1, 3)]


def one_row(policy: str, classes: int, servers: int, in_flight: int, per_pass: int, requests: int) -> float:
    """Microseconds a request of one row, in this process (this tree's `cadencerl`)."""
    from cadencerl.core.trajectory import State
    from cadencerl.engine.server_metrics import EngineMetrics
    from cadencerl.router.service import RouterService
    from cadencerl.router.settings import make_settings

    svc = RouterService(make_settings(workers=[f"http://127.0.0.1:{9000 + i}" for i in range(servers)], policy=policy))
    svc.decide_soon = lambda: None          # one pass per loop turn: `step` makes it
    state = svc.state
    for i, w in enumerate(state.workers):
        w.alive = True
        state.set_figures(i, EngineMetrics(0.1, 8, 0, 0, 0, 0, kv_capacity_tokens=500_000))
    names = list(svc.settings.target_mix)[:classes]
    open_: list = []
    clock = {"now": 0.0, "n": 0}

    def step() -> None:
        clock["now"] += 0.001
        for _ in range(per_pass):
            n = clock["n"] = clock["n"] + 1
            open_.append(state.new_session(None, names[n % len(names)], 8, group=n % 97, now=clock["now"],
                                           max_new_tokens=16))
        svc.decide(clock["now"])
        placed = [s for s in open_ if s.traj.state is State.RESIDENT]
        for s in placed[:max(0, len(open_) - in_flight)]:
            open_.remove(s)
            svc.release(s, 16, last=True)

    for _ in range(200 + in_flight // per_pass):      # to steady state: the learner has its figures
        step()
    start = time.perf_counter()
    for _ in range(requests // per_pass):
        step()
    return (time.perf_counter() - start) / (requests // per_pass * per_pass) * 1e6


def run_tree(tree: Path | None, args: argparse.Namespace) -> dict[str, float]:
    """Every row in a fresh process on `tree` (None: this one); microseconds by row name."""
    return run_child(__file__, ["--in-flight", str(args.in_flight), "--per-pass", str(args.per_pass),
                                "--requests", str(args.requests)], tree, CADENCERL_PURE_PYTHON="1")


def row_name(policy: str, classes: int, servers: int) -> str:
    return f"{policy}, {classes} class{'es' if classes > 1 else ''}, {servers} server{'s' if servers > 1 else ''}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--per-pass", type=int, default=8)
    ap.add_argument("--requests", type=int, default=20_000, help="timed requests a row")
    ap.add_argument("--compare-tree", type=Path, help="another source tree, run in the same rounds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("rounds", "in_flight", "per_pass", "requests"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.child:
        print(json.dumps({row_name(*r): one_row(*r, args.in_flight, args.per_pass, args.requests) for r in ROWS}))
        return
    trees = {"this tree": None} | ({"compared tree": args.compare_tree} if args.compare_tree else {})
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(run_tree(tree, args))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    result = {name: {row: round(statistics.median(r[row] for r in runs), 1) for row in runs[0]}
              for name, runs in rounds.items()}
    for row in result["this tree"]:
        figures = ", ".join(f"{name} {result[name][row]:6.1f} us" for name in trees)
        print(f"  {row:44s} {figures}", file=sys.stderr)
    print(json.dumps({"in_flight": args.in_flight, "per_pass": args.per_pass, "us_per_request": result}))


if __name__ == "__main__":
    main()
