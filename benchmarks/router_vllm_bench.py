"""`cadencerl router` against the real `vllm-router`, measured by vLLM's own benchmark client
(`vllm.benchmarks.serve`, what `vllm bench serve` runs) on two vLLM CPU servers with the tiny
model, sized so that KV does not bind: prefix-repetition and random data, several rounds, the
targets in a rotated order each round, each run on prompts of its own (a seed per run, so no run
finds another's prefixes cached). Prints JSON: each round's output tokens/s and median TTFT per
target and dataset, their medians, and each target's ratio to vllm-router's.

    PATH=<venv with vllm-router>/bin:$PATH CADENCERL_VLLM_PYTHON=<engine venv>/bin/python \\
        .venv/bin/python benchmarks/router_vllm_bench.py [--rounds 3] [--prompts 160]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_live import held  # noqa: E402
from router_overhead import cadencerl_router, free_port, vllm_router, vllm_router_binary  # noqa: E402

from cadencerl.devpool.local_pool import SERVED_MODEL_NAME, LocalPool, PoolConfig, vllm_python  # noqa: E402

DATASETS = {
    "prefix_repetition": ["--prefix-repetition-prefix-len", "256", "--prefix-repetition-suffix-len", "64",
                          "--prefix-repetition-num-prefixes", "8", "--prefix-repetition-output-len", "64"],
    "random": ["--random-input-len", "256", "--random-output-len", "64"],
}
BENCH = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
         "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
POLICIES = ("misa+cache-aware", "cache-aware")        # the router's default, and the same without admission
VLLM_ROUTER = ["--policy", "cache_aware", "--cache-threshold", "0.5", "--balance-abs-threshold", "32",
               "--balance-rel-threshold", "1.1"]   # its documented defaults: the better of its two in router_live.py


def bench(url: str, model_dir: Path, dataset: str, args, out: Path, seed: int) -> dict:
    """One run of vLLM's benchmark client against `url`; its own result JSON, read back."""
    cmd = [vllm_python(), "-c", BENCH, "--backend", "vllm", "--base-url", url, "--model", SERVED_MODEL_NAME,
           "--tokenizer", str(model_dir), "--dataset-name", dataset, *DATASETS[dataset], "--num-prompts",
           str(args.prompts), "--max-concurrency", str(args.concurrency), "--request-rate", "inf", "--ignore-eos",
           "--seed", str(seed), "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
           "--disable-tqdm"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if run.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed against {url}:\n{run.stderr[-3000:]}")
    got = json.loads(out.read_text())
    return {"output_tok_s": round(got["output_throughput"], 1), "median_ttft_ms": round(got["median_ttft_ms"], 1),
            "completed": got["completed"], "failed": got.get("failed", 0)}


def summary(rows: dict, base: str) -> dict:
    """Medians over the rounds, and each target's ratio to `base`'s (tok/s and median TTFT)."""
    med = {t: {k: statistics.median(r[k] for r in rs) for k in ("output_tok_s", "median_ttft_ms")}
           for t, rs in rows.items()}
    return {t: {**m, "tok_s_ratio": round(m["output_tok_s"] / med[base]["output_tok_s"], 3),
                "ttft_ratio": round(m["median_ttft_ms"] / med[base]["median_ttft_ms"], 3)} for t, m in med.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=160, help="requests per run")
    ap.add_argument("--concurrency", type=int, default=16, help="the client's requests in flight")
    ap.add_argument("--kv-tokens", type=int, default=32768, help="each server's KV (16 x 320 tokens fit 6x)")
    ap.add_argument("--model-dir", type=Path, default=None, help="a built tiny model (else built here)")
    args = ap.parse_args()
    if vllm_router_binary() is None:
        sys.exit("vllm-router is not on PATH: pip install vllm-router==0.1.17 (the bench extra)")
    logs = Path(tempfile.mkdtemp(prefix="router_vllm_bench_"))
    config = PoolConfig(num_workers=2, kv_tokens=args.kv_tokens, max_num_seqs=32, max_model_len=2048,
                        model_dir=args.model_dir, start_timeout_s=300)
    t0 = time.monotonic()
    with LocalPool(logs / "pool", config) as pool, ExitStack() as stack:
        servers = pool.urls
        targets: dict[str, str] = {}
        for policy in POLICIES:
            port = free_port()
            r = stack.enter_context(cadencerl_router(servers, port, policy, logs / f"cadencerl-{policy}.log"))
            r.wait_http(f"http://127.0.0.1:{port}/health")
            targets[f"cadencerl router {policy}"] = f"http://127.0.0.1:{port}"
        port = free_port()
        r = stack.enter_context(vllm_router(servers, port, logs / "vllm-router.log", *VLLM_ROUTER))
        r.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
        targets["vllm-router cache_aware"] = f"http://127.0.0.1:{port}"
        names = list(targets)
        result: dict = {"servers": len(servers), "kv_tokens_per_server": args.kv_tokens, "prompts": args.prompts,
                        "concurrency": args.concurrency, "datasets": DATASETS, "vllm_router_flags": VLLM_ROUTER}
        for dataset in DATASETS:
            rows: dict[str, list[dict]] = {t: [] for t in names}
            for i in range(args.rounds):
                order = names[i % len(names):] + names[:i % len(names)]
                for t in order:
                    got = bench(targets[t], pool.model_dir, dataset, args, logs / f"{dataset}-{i}-{len(rows[t])}-"
                                f"{t.replace(' ', '_')}.json", seed=100 * i + names.index(t))
                    rows[t].append(got)
                    print(f"{dataset} round {i} {t}: {json.dumps(got)}", file=sys.stderr, flush=True)
            result[dataset] = {"rounds": rows, "median": summary(rows, "vllm-router cache_aware")}
        # what each cadencerl router's admission held, over all its runs (its own /metrics)
        result["held"] = {t: held(targets[t]) for t in names if t.startswith("cadencerl")}
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
