"""The journal's cost: the shrunk cpu-pair run through RolloutPool on two fake vLLM servers, with and
without `journal=`, in alternated pairs (off-on, then on-off); prints JSON: each pair's throughput
drop, their median with a bootstrap 95% interval, the controller process's CPU per token each way,
and the journal's own cost as a share of each run's wall time and of the controller process's CPU
(its flushes and publishes, timed in the run, plus a list append per token chunk, timed alone):
what it takes from a run bound by the controller.

    PYTHONPATH=.:tests python benchmarks/journal_overhead.py [--pairs 20] [--trajectories 64] [--servers process]

`--servers process` (the default) runs the fakes in a process of their own, so the CPU measured is
the controller's; `thread` runs them in this process, as the tests do (their CPU then counts).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from cadencerl.api import RolloutPool
from cadencerl.core.journal import Journal
from tests.journal_driver import scenario

ROOT = Path(__file__).resolve().parents[1]
SERVE = ("import sys\nfrom tests.fake_vllm import FakeVLLM\n"
         "with FakeVLLM() as a, FakeVLLM() as b:\n    print(a.url, b.url, flush=True)\n    sys.stdin.read()\n")


@contextmanager
def fake_servers(where: str):
    """Two fake vLLM servers' URLs, in their own process or in this one's threads."""
    if where == "thread":
        from tests.fake_vllm import FakeVLLM
        with FakeVLLM() as a, FakeVLLM() as b:
            yield [a.url, b.url]
        return
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})
    try:
        yield proc.stdout.readline().split()
    finally:
        proc.stdin.close()
        proc.wait(20)


def one(urls: list[str], trajectories: int, journal: str | None) -> dict:
    s = scenario(trajectories, 8)
    started, cpu = time.perf_counter(), time.process_time()
    with RolloutPool.from_scenario(s, urls, policy="cadence", kv_tokens=1024, deadline_s=600, journal=journal) as pool:
        for _ in pool.batches():
            pool.publish()
        result = pool.result()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    j = result.get("journal") or {}
    return {"rate": result["tokens_generated"] / wall, "cpu_us": 1e6 * cpu / result["tokens_generated"],
            "wall": wall, "cpu": cpu, "tokens": result["tokens_generated"], "flush_s": j.get("flush_s", 0.0),
            "flush_cpu_s": j.get("flush_cpu_s", 0.0),
            "bytes": j.get("bytes")}


def cost_per_token_us(path: str, n: int = 200_000) -> tuple[float, float]:
    """The journal alone, a token a call on 64 trajectories: the call's CPU time (`Journal.tokens`,
    what a streamed chunk costs between flushes), and the call with a flush offered every 100 tokens."""
    j = Journal.open(path)
    ids = [[i % 4096] for i in range(n)]
    started = time.thread_time()
    for i in range(n):
        j.tokens(i % 64, ids[i])
    call = time.thread_time() - started
    j.flush(force=True)
    started = time.perf_counter()
    for i in range(n):
        j.tokens(i % 64, ids[i])
        if i % 100 == 0:
            j.flush()
    j.flush(force=True)
    j.close()
    return 1e6 * call / n, 1e6 * (time.perf_counter() - started) / n


def median_ci(xs: list[float], draws: int = 10_000, seed: int = 0) -> list[float]:
    """A bootstrap 95% interval of the median of `xs` (the pairs resampled)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return [meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]]


def summary(xs: list[float], digits: int = 2) -> dict:
    return {"median": round(statistics.median(xs), digits), "ci95": [round(x, digits) for x in median_ci(xs)],
            "min": round(min(xs), digits), "max": round(max(xs), digits)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--servers", choices=["process", "thread"], default="process")
    args = ap.parse_args()
    runs: list[dict[str, dict]] = []
    load = [os.getloadavg()]
    with ExitStack() as stack:
        urls = stack.enter_context(fake_servers(args.servers))
        d = stack.enter_context(tempfile.TemporaryDirectory())
        one(urls, args.trajectories, None)          # warm-up (imports, connections), not counted
        for i in range(args.pairs):
            pair = {}
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                pair[mode] = one(urls, args.trajectories, os.path.join(d, f"j{i}") if mode == "on" else None)
            runs.append(pair)
            load.append(os.getloadavg())
            print(f"pair {i + 1}/{args.pairs}: drop {100 * (1 - pair['on']['rate'] / pair['off']['rate']):+.2f}%",
                  file=sys.stderr, flush=True)
        call_us, with_flush_us = cost_per_token_us(os.path.join(d, "micro"))
    drops = [100 * (1 - p["on"]["rate"] / p["off"]["rate"]) for p in runs]
    cpu = [100 * (p["on"]["cpu_us"] / p["off"]["cpu_us"] - 1) for p in runs]
    print(json.dumps({
        "trajectories": args.trajectories, "pairs": args.pairs, "servers": args.servers,
        "tokens_per_s_off": summary([p["off"]["rate"] for p in runs], 0),
        "tokens_per_s_on": summary([p["on"]["rate"] for p in runs], 0),
        "throughput_drop_pct": summary(drops), "drops_pct": [round(x, 2) for x in drops],
        "cpu_us_per_token_off": summary([p["off"]["cpu_us"] for p in runs], 1),
        "cpu_us_per_token_on": summary([p["on"]["cpu_us"] for p in runs], 1),
        "cpu_per_token_rise_pct": summary(cpu),
        "flush_share_of_wall_pct": summary([100 * p["on"]["flush_s"] / p["on"]["wall"] for p in runs], 3),
        "journal_share_of_wall_pct": summary([100 * (p["on"]["flush_s"] + 1e-6 * call_us * p["on"]["tokens"])
                                              / p["on"]["wall"] for p in runs], 3),
        "journal_share_of_cpu_pct": summary([100 * (p["on"]["flush_cpu_s"] + 1e-6 * call_us * p["on"]["tokens"])
                                             / p["on"]["cpu"] for p in runs], 3),
        "journal_bytes_at_end": max(p["on"]["bytes"] or 0 for p in runs),
        "token_call_us": round(call_us, 3), "journal_alone_us_per_token": round(with_flush_us, 3),
        "loadavg_1min": summary([x[0] for x in load])}))


if __name__ == "__main__":
    main()
