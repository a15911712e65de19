"""The journal's cost: the shrunk cpu-pair run through RolloutPool on two fake vLLM servers, with
and without `journal=`, alternated; prints JSON (tokens/s each way, the drop, the journal's size).

    PYTHONPATH=.:tests python benchmarks/journal_overhead.py [--runs 3] [--trajectories 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from cadencerl.api import RolloutPool
from tests.fake_vllm import FakeVLLM
from tests.journal_driver import scenario


def one(urls: list[str], trajectories: int, journal: str | None) -> tuple[float, float, int, int | None]:
    s = scenario(trajectories, 8)
    started, cpu = time.perf_counter(), time.process_time()
    with RolloutPool.from_scenario(s, urls, policy="cadence", kv_tokens=1024, deadline_s=600, journal=journal) as pool:
        for _ in pool.batches():
            pool.publish()
        result = pool.result()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return wall, cpu, result["tokens_generated"], (result.get("journal") or {}).get("bytes")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trajectories", type=int, default=64)
    args = ap.parse_args()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_per_token: dict[str, list[float]] = {"off": [], "on": []}   # the process's CPU (servers included)
    size = None
    with FakeVLLM() as a, FakeVLLM() as b, tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            for mode in ("off", "on"):
                path = os.path.join(d, f"j{i}") if mode == "on" else None
                wall, cpu, tokens, nbytes = one([a.url, b.url], args.trajectories, path)
                rates[mode].append(tokens / wall)
                cpu_per_token[mode].append(1e6 * cpu / tokens)
                size = nbytes or size
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(json.dumps({"trajectories": args.trajectories, "runs": args.runs, "tokens_per_s_off": rates["off"],
                      "tokens_per_s_on": rates["on"], "median_drop_pct": 100 * (off - on) / off,
                      "cpu_us_per_token_off": cpu_per_token["off"], "cpu_us_per_token_on": cpu_per_token["on"],
                      "journal_bytes_at_end": size, "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
