"""The journal's cost: the shrunk cpu-pair run through RolloutPool on two fake vLLM servers, with
and without `journal=`, alternated; prints JSON (tokens/s each way, the drop, CPU per token, the
journal's size, and the journal's own cost per token measured alone).

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
from cadencerl.core.journal import Journal
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


def cost_per_token_us(path: str, n: int = 200_000) -> float:
    """The journal alone: a token a call, 64 trajectories, a flush offered every 100 tokens."""
    j = Journal.open(path)
    started = time.perf_counter()
    for i in range(n):
        j.tokens(i % 64, [i % 4096])
        if i % 100 == 0:
            j.flush()
    j.flush(force=True)
    j.close()
    return 1e6 * (time.perf_counter() - started) / n


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
        micro = cost_per_token_us(os.path.join(d, "micro"))
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(json.dumps({"trajectories": args.trajectories, "runs": args.runs, "tokens_per_s_off": rates["off"],
                      "tokens_per_s_on": rates["on"], "median_drop_pct": 100 * (off - on) / off,
                      "cpu_us_per_token_off": cpu_per_token["off"], "cpu_us_per_token_on": cpu_per_token["on"],
                      "journal_bytes_at_end": size, "journal_alone_us_per_token": micro, "loadavg": open("/proc/loadavg").read().split()[:3]}))


if __name__ == "__main__":
    main()
