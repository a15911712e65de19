"""What the Rust data path's Python side costs a request at one connection, without HTTP.

`cadencerl router --data-path rust` hands each request to Python (`rust_owner.RustOwner`): its ask
(the parse, the session's entry and the decision pass that places it) lies on the request's path;
its end and the pass the end schedules run while the reply travels. Here a fake `_datapath` takes
the answers, one request at a time as one connection sends them (an ask, then its end with the
tokens the Rust side counted, then a turn of the loop for the end's pass), on one server. Each
tree runs compiled where its `make native` built it (the JSON says). `--compare-tree PATH` runs
another source tree in the same rounds, alternated; each figure is the median over `--rounds`.

    .venv/bin/python benchmarks/owner_cost.py [--rounds 3] [--policies misa+cache-aware,cache-aware]
                                              [--compare-tree PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from tree_child import run_child

BODY = b'{"model": "tiny", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 16, "stream": false}'
HEADERS = {"content-type": "application/json", "host": "router", "content-length": str(len(BODY))}
PARTS = ("ask", "end", "end's pass")


class FakeDataPath:
    """The Rust side's two answers, counted: a request forwarded, or refused (which this load never is)."""

    def __init__(self) -> None:
        self.forwarded = 0

    def forward(self, rid: int, url: str, worker: str) -> None:
        self.forwarded += 1

    def reply(self, rid: int, status: int, headers: list, body: bytes) -> None:
        raise SystemExit(f"request {rid} was refused ({status}): {body!r}")


async def one_policy(policy: str, requests: int) -> dict[str, float]:
    """Microseconds a request of each part, in this process (this tree's `cadencerl`)."""
    from cadencerl.router.app import create_app
    from cadencerl.router.settings import make_settings

    fake, app = FakeDataPath(), create_app(make_settings(workers=["http://127.0.0.1:9"], policy=policy))
    try:
        from cadencerl.router.rust_owner import RustOwner
        owner = RustOwner(app, "", fake)
    except ImportError:         # a tree from before the owner had a module of its own (--compare-tree)
        from cadencerl.router import rust_path
        rust_path._datapath = fake
        owner = rust_path.RustOwner(app, "")
    spent = dict.fromkeys(PARTS, 0.0)
    warm = 2_000
    for rid in range(warm + requests):
        t0 = time.perf_counter()
        owner.on_events([("a", rid, ("/v1/completions", HEADERS, BODY))])
        t1 = time.perf_counter()
        owner.on_events([("d", rid, (200, 16, None, False))])
        t2 = time.perf_counter()
        await asyncio.sleep(0)
        t3 = time.perf_counter()
        if rid >= warm:
            for part, took in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2)):
                spent[part] += took
    if fake.forwarded != warm + requests:
        raise SystemExit(f"{fake.forwarded} of {warm + requests} requests were forwarded")
    return {part: took / requests * 1e6 for part, took in spent.items()}


def run_tree(tree: Path | None, policy: str, requests: int) -> dict:
    """One policy in a fresh process on `tree` (None: this one)."""
    return run_child(__file__, ["--policies", policy, "--requests", str(requests)], tree)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20_000, help="timed requests a policy and round")
    ap.add_argument("--policies", default="misa+cache-aware,cache-aware")
    ap.add_argument("--compare-tree", type=Path, help="another source tree, run in the same rounds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("rounds", "requests"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.child:
        import uvloop

        from cadencerl.native import compiled
        figures = uvloop.run(one_policy(policies[0], args.requests))
        print(json.dumps({"compiled": compiled(), **figures}))
        return
    trees = {"this tree": None} | ({str(args.compare_tree): args.compare_tree} if args.compare_tree else {})
    runs: dict[tuple[str, str], list[dict]] = {(t, p): [] for t in trees for p in policies}
    for i in range(args.rounds):
        for policy in policies:
            for name, tree in trees.items():
                runs[name, policy].append(run_tree(tree, policy, args.requests))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    result: dict = {}
    for (name, policy), rows in runs.items():
        median = {part: round(statistics.median(r[part] for r in rows), 1) for part in PARTS}
        median["total"] = round(sum(median.values()), 1)
        result.setdefault(policy, {})[name] = {"compiled": rows[0]["compiled"], "us_per_request": median}
        print(f"  {policy:20s} {name:24s} " + ", ".join(f"{k} {v:5.1f} us" for k, v in median.items())
              + ("" if rows[0]["compiled"] else " (plain Python)"), file=sys.stderr)
    print(json.dumps({"requests": args.requests, "rounds": args.rounds, "policies": result}))


if __name__ == "__main__":
    main()
