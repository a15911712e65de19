"""MISA-T live: `cadencerl router` against the real `vllm-router` and direct round-robin, on two
vLLM CPU servers serving the tiny model.

One replayed mixed workload per configuration (fresh prompt text each time, so no configuration
inherits another's prefix cache): agentic sessions of three turns with tool waits between them,
RLVR groups of 8 samples sharing a prompt, RLHF single replies; sessions in the paper's mix
48.6 : 33.1 : 18.2, all submitted at once like one rollout step. Every reply has a fixed length
(`ignore_eos`), so the configurations do the same work. Configurations:

  (a) vllm-router `cache_aware`, thresholds over a 2-point grid (its CLI defaults 0.3/64/1.5 and
      its documented defaults 0.5/32/1.1); the better by throughput is kept, both are printed;
  (b) `cadencerl router --policy misa+cache-aware` (session and class headers sent), and the same
      router without admission (`--policy cache-aware`, the thresholds vllm-router's CLI defaults),
      with the sessions its admission held (from the router's own /metrics);
  (c) direct round-robin from the client (no router).

Each configuration replays `--rounds` rollouts back to back (6: a router keeps what it learned
from one to the next, as over a training run's iterations); `steady` is the mean of all but the
first (with throughput's range and standard error over those rounds), `first_round` the cold
start. Figures: throughput (completion tokens / makespan), prefix hit rate from the servers' own
`vllm:prefix_cache_hits` / `queries` counters, the servers' preemptions, D_TV of completed
sessions by class (mean over consecutive batches of `--batch` completions, as the simulator's
trainer consumes them, in pp), per-class P95 session latency, 429s (the client waits Retry-After
and resends).

    CADENCERL_VLLM_PYTHON=/work/main/.venv-engine/bin/python \\
        /work/main/.venv/bin/python benchmarks/router_live.py [--scale 1] [--model-dir DIR]

Not part of the test suite: it takes minutes and needs vLLM. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_overhead import cadencerl_router, free_port, vllm_router, vllm_router_binary  # noqa: E402

from cadencerl.devpool.local_pool import LocalPool, PoolConfig  # noqa: E402
from cadencerl.runs.summary import mixture_dtv_pp  # noqa: E402

MIX = {"agent": 0.486, "rlvr": 0.331, "rlhf": 0.182}
WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be or had "
         "not but what all when can there their one time would so if will out about up into who some them "
         "other could more these two may then do first any like now my such make over our even most me "
         "state after also made many did must before back see through way where get much go well your").split()
GRID = [(0.3, 64, 1.5), (0.5, 32, 1.1)]


@dataclass
class Session:
    cls: str
    prompt: str
    turns: int
    max_tokens: int
    tool_s: float = 0.0
    key: str = ""
    latency: float = 0.0
    done_at: float = 0.0


@dataclass
class Outcome:
    tokens: int = 0
    rejected: int = 0
    resent: int = 0
    errors: int = 0
    sessions: list = field(default_factory=list)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(salt: str, scale: int, seed: int = 0) -> list[Session]:
    rng = random.Random(seed)
    out = []
    for i in range(35 * scale):
        out.append(Session("agent", f"[{salt} a{i}] " + _text(rng, 120), 3, 40, rng.uniform(0.5, 1.5)))
    for g in range(3 * scale):
        shared = f"[{salt} g{g}] " + _text(rng, 150)
        out += [Session("rlvr", shared, 1, 64) for _ in range(8)]
    for i in range(13 * scale):
        out.append(Session("rlhf", f"[{salt} h{i}] " + _text(rng, 100), 1, 96))
    rng.shuffle(out)
    for i, s in enumerate(out):
        s.key = f"{salt}-{i}"
    return out


async def _post(c: httpx.AsyncClient, url: str, body: dict, headers: dict, out: Outcome) -> dict | None:
    for _ in range(50):
        try:
            r = await c.post(url, json=body, headers=headers)
        except httpx.TransportError:    # a kept-alive connection the server closed as it was reused:
            out.resent += 1             # resent, as the openai client does (its max_retries)
            continue
        if r.status_code == 429:
            out.rejected += 1
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            continue
        if r.status_code != 200:
            out.errors += 1
            return None
        return r.json()
    out.errors += 1
    return None


async def _run_session(c, s: Session, pick_url, with_headers: bool, t0: float, out: Outcome, rng) -> None:
    prompt = s.prompt
    for turn in range(s.turns):
        headers = {"X-Session-Id": s.key, "X-Workload-Class": s.cls} if with_headers else {}
        if with_headers and turn == s.turns - 1:
            headers["X-Session-End"] = "1"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": s.max_tokens, "ignore_eos": True,
                "temperature": 0.0}
        reply = await _post(c, pick_url() + "/v1/completions", body, headers, out)
        if reply is None:
            return
        out.tokens += reply["usage"]["completion_tokens"]
        if turn < s.turns - 1:
            await asyncio.sleep(s.tool_s)
            prompt = prompt + reply["choices"][0]["text"] + " observation: " + _text(rng, 30)
    s.done_at = time.monotonic()
    s.latency = s.done_at - t0
    out.sessions.append(s)


async def replay(sessions: list[Session], urls: list[str], with_headers: bool) -> tuple[Outcome, float]:
    out = Outcome()
    turn = iter(range(1 << 30))
    pick = (lambda: urls[next(turn) % len(urls)])
    rng = random.Random(1)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=512)) as c:
        t0 = time.monotonic()
        await asyncio.gather(*(_run_session(c, s, pick, with_headers, t0, out, rng) for s in sessions))
        return out, time.monotonic() - t0


COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total")


def engine_counters(urls: list[str]) -> tuple[float, ...]:
    """The servers' own prefix-cache hits and queries and preemptions, summed over servers."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for u in urls:
        for line in httpx.get(f"{u}/metrics", timeout=10).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
    return tuple(totals.values())


def figures(out: Outcome, makespan: float, counted: tuple, batch: int) -> dict:
    done = sorted(out.sessions, key=lambda s: s.done_at)
    batches = [Counter(s.cls for s in done[i:i + batch]) for i in range(0, len(done) - batch + 1, batch)]
    p95 = {c: round(float(np.percentile([s.latency for s in done if s.cls == c], 95)), 2)
           for c in MIX if any(s.cls == c for s in done)}
    hits, queries, preemptions = counted
    return {"throughput_tok_s": round(out.tokens / makespan, 1), "makespan_s": round(makespan, 1),
            "prefix_hit_rate": round(hits / queries, 4) if queries else None, "preemptions": int(preemptions),
            "dtv_pp": round(mixture_dtv_pp(batches, MIX), 2), "p95_session_s": p95,
            "sessions_done": len(done), "rejected_429": out.rejected, "resent": out.resent, "errors": out.errors}


def measured(name: str, servers: list[str], entry: list[str], with_headers: bool, args) -> dict:
    """`args.rounds` rollouts one after the other through the same entry (a router keeps what it
    learned), each of fresh text: the first round (a cold router) and the steady rounds after it."""
    rows = []
    for i in range(args.rounds):
        sessions = workload(f"{name}-r{i}", args.scale)
        c0 = engine_counters(servers)
        out, makespan = asyncio.run(replay(sessions, entry, with_headers))
        c1 = engine_counters(servers)
        rows.append(figures(out, makespan, tuple(b - a for a, b in zip(c0, c1)), args.batch))
        print(f"{name} round {i}", json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"steady": steady(rows[1:] or rows), "first_round": rows[0], "rounds": rows}


def steady(rows: list[dict]) -> dict:
    """Means over the steady rounds, with throughput's spread: rounds of the same work vary by tens
    of percent on this machine, so a difference between rows means something only past it."""
    tok_s = [r["throughput_tok_s"] for r in rows]
    out = {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in ("throughput_tok_s", "prefix_hit_rate", "dtv_pp")}
    sem = float(np.std(tok_s, ddof=1) / np.sqrt(len(tok_s))) if len(tok_s) > 1 else 0.0
    return {**out, "throughput_range": [min(tok_s), max(tok_s)], "throughput_sem": round(sem, 1),
            "preemptions": sum(r["preemptions"] for r in rows)}


def held(router: str) -> dict:
    """What the router's admission did (its own /metrics): sessions it held and how long, in all."""
    text = httpx.get(f"{router}/metrics", timeout=10).text
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
             if line.startswith("cadencerl_router_hold_wait_seconds_") and " " in line}
    count = value.get("cadencerl_router_hold_wait_seconds_count", 0.0)
    waited = value.get("cadencerl_router_hold_wait_seconds_sum", 0.0)
    over = count - value.get('cadencerl_router_hold_wait_seconds_bucket{le="0.01"}', count)
    return {"held_sessions_over_10ms": int(over), "hold_wait_mean_s": round(waited / count, 3) if count else 0.0}


def run_all(servers: list[str], args, logs: Path) -> dict:
    result: dict = {}
    result["direct round-robin"] = measured("direct", servers, servers, False, args)
    # The same router without admission (vllm-router's CLI-default thresholds) tells MISA-T's share of
    # a difference from the router's own (Python HTTP, placement).
    for policy in ("misa+cache-aware", "cache-aware"):
        port = free_port()
        with cadencerl_router(servers, port, policy, logs / f"cadencerl-{policy}.log", "--max-num-seqs",
                              str(args.max_num_seqs)) as r:
            r.wait_http(f"http://127.0.0.1:{port}/health")
            url = f"http://127.0.0.1:{port}"
            result[f"cadencerl router {policy}"] = {**measured(policy, servers, [url], True, args), **held(url)}
    if vllm_router_binary() is None:
        result["vllm-router cache_aware"] = "not installed (pip install vllm-router==0.1.17)"
        return result
    grid = {}
    for ct, ab, rel in GRID:
        port = free_port()
        flags = ["--policy", "cache_aware", "--cache-threshold", str(ct), "--balance-abs-threshold", str(ab),
                 "--balance-rel-threshold", str(rel)]
        with vllm_router(servers, port, logs / f"vllm-router-{ct}.log", *flags) as r:
            r.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
            grid[f"cache_threshold={ct},balance_abs={ab},balance_rel={rel}"] = measured(
                f"vr{ct}", servers, [f"http://127.0.0.1:{port}"], True, args)
    best = max(grid, key=lambda k: grid[k]["steady"]["throughput_tok_s"])
    result["vllm-router cache_aware (best of grid)"] = {"thresholds": best, **grid[best]}
    result["vllm-router grid"] = grid
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1, help="72 sessions per unit")
    ap.add_argument("--batch", type=int, default=12, help="completions per trainer batch, for D_TV")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6, help="rollouts per configuration; steady = all but the first")
    ap.add_argument("--model-dir", type=Path, default=None, help="a built tiny model (else built here)")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="router_live_"))
    config = PoolConfig(num_workers=2, kv_tokens=8192, max_num_seqs=args.max_num_seqs, max_model_len=2048,
                        model_dir=args.model_dir, start_timeout_s=300)
    t0 = time.monotonic()
    with LocalPool(logs / "pool", config) as pool:
        servers = pool.urls
        result = {"servers": len(servers), "kv_tokens_per_server": 8192, "max_num_seqs": args.max_num_seqs,
                  "sessions": len(workload("x", args.scale)), "target_mix": MIX, "vllm_router_grid": GRID}
        result.update(run_all(servers, args, logs))
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
