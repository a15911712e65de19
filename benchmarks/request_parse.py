"""What reading a generating request costs the router, by prompt length: `parse_request` (the body's
JSON, its checks, the prompt's length and prefix group) against `json.loads` of the same body alone.

Rollout clients send token ids (AReaL, slime), thousands a prompt and more each turn, so the parse
grows with the prompt while the capacity benchmark's 8-token prompt does not show it. Best of 7
repeats each; `--compare-tree PATH` times that source tree's `router/requests.py` beside this one's.

    .venv/bin/python benchmarks/request_parse.py [--ids 8,512,4096,32768] [--compare-tree PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import timeit
from pathlib import Path

from starlette.datastructures import Headers

from cadencerl.router import requests

HEADERS = Headers({"content-type": "application/json"})


def tree_module(tree: Path):
    """`cadencerl/router/requests.py` of another source tree, loaded beside this one's."""
    spec = importlib.util.spec_from_file_location("compared_requests", tree / "cadencerl/router/requests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def best_us(fn, raw: bytes, reps: int) -> float:
    return round(min(timeit.repeat(lambda: fn(raw), number=reps, repeat=7)) / reps * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default="8,512,4096,32768", help="prompt lengths in token ids, comma-separated")
    ap.add_argument("--compare-tree", type=Path, help="also this source tree's parse (e.g. a `git archive`)")
    args = ap.parse_args()
    parsers = {"this tree": requests.parse_request}
    if args.compare_tree is not None:
        parsers["compared tree"] = tree_module(args.compare_tree).parse_request
    rng = random.Random(0)
    rows = []
    for n in (int(x) for x in args.ids.split(",")):
        raw = json.dumps({"model": "m", "prompt": [rng.randrange(150_000) for _ in range(n)], "max_tokens": 512}).encode()
        reps = max(20, 20_000 // n)
        row = {"token_ids": n, "json_loads_us": best_us(json.loads, raw, reps)}
        for name, parse in parsers.items():
            row[f"parse_us ({name})"] = best_us(lambda r, p=parse: p(r, HEADERS, "prompt", {"c": 1.0}, "c"), raw, reps)
        rows.append(row)
        print(", ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
    print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
