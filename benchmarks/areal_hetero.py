"""AReaL's own client on the heterogeneous CPU pair (`cpu-hetero`): through `cadencerl router
--policy cadence`, through `--policy least-loaded`, and given both servers itself (AReaL's own
round-robin), beside `cadencerl sim -s cpu-hetero`'s prediction of each.

The episodes are the scenario's trajectories (seed 0: its prompts as token ids, each reply of its
length, `ignore_eos`), so every configuration and the simulator do the same work. The client is
`tests/engine/areal_client.py` (AReaL 1.0.4's RemotevLLMEngine + WorkflowExecutor, unchanged):
batches of the scenario's batch size, eta 1, a training step of its train_time_s after each batch,
then a weight update from disk (through the router: AReaL's pause / update / continue; direct:
each stock vLLM server's dev-mode routes). Throughput: completion tokens / wall time; latency: an
episode's, from the workflow starting it to its end. Runs interleave the configurations; medians
(min-max) of `--runs`. Needs root for the slow server's CPU quota.

    CADENCERL_VLLM_PYTHON=$PWD/.venv-engine/bin/python CADENCERL_AREAL_PATH=$PWD/.venv-areal \\
        .venv/bin/python benchmarks/areal_hetero.py --runs 3 --out benchmarks/results/areal-hetero.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cadencerl.config import builtin_scenario
from cadencerl.devpool.local_pool import vllm_python
from cadencerl.devpool.weights import WeightVersions
from cadencerl.engine.prompts import synthetic_prompt
from cadencerl.engine.server_metrics import series_total
from cadencerl.workload.generate import generate

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tests" / "engine" / "areal_client.py"
SCENARIO = ROOT / "cadencerl" / "scenarios" / "cpu-hetero.yaml"
CONFIGS = {"cadence": "router", "least-loaded": "router", "areal": "direct"}   # areal: AReaL's round-robin


def episodes(scenario) -> list[dict]:
    """The scenario's trajectories as AReaL episodes (the benchmark knows each length; the router does not)."""
    key = object()
    out = []
    for spec in generate(scenario.workload, scenario.seed, key):
        replies = [spec.response.reveal(key)] + [t.response.reveal(key) for t in spec.later_turns.reveal(key)]
        out.append({"id": spec.id, "prompt": synthetic_prompt(scenario.seed, spec.group, spec.prompt_len),
                    "replies": replies, "observation": [7] * 8})
    return out


def run_client(addr: str, spec_file: Path, weights: list[Path], scratch: Path, batch: int, eta: int,
               train_time: float, direct: bool) -> dict:
    out = scratch / "result.json"
    env = {**os.environ, "PYTHONPATH": f"{os.environ['CADENCERL_AREAL_PATH']}:{ROOT}", "PYTHONWARNINGS": "ignore"}
    cmd = [vllm_python(), str(CLIENT), "--addr", addr, "--weights", ",".join(map(str, weights)), "--out", str(out),
           "--scratch", str(scratch), "--episodes-file", str(spec_file), "--batch", str(batch), "--eta", str(eta),
           "--train-time", str(train_time), *(["--direct"] if direct else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the AReaL client failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def figures(result: dict) -> dict:
    tokens = sum(t["tokens"] for ep in result["episodes"].values() for t in ep["turns"])
    latencies = [ep["latency_s"] for ep in result["episodes"].values()]
    return {"tok_s": tokens / result["wall_s"], "p95_s": float(np.percentile(latencies, 95)),
            "wall_s": result["wall_s"], "tokens": tokens, "updates_s": result["updates_s"]}


def router(urls: list[str], policy: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(urls),
                             "--policy", policy, "--config", str(SCENARIO), "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    found = re.search(r"listening on http://(127\.0\.0\.1:\d+)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the router did not start: {line}")
    return proc, found.group(1)


SERVER_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total")


def server_counters(urls: list[str]) -> list[dict]:
    """Each server's own token and preemption counters (vLLM's /metrics), to split a run by server."""
    import httpx
    out = []
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        out.append({name: series_total(text, name) for name in SERVER_COUNTERS})
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user + system), from /proc: the router shares the cores with the servers."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def handed_back(addr: str) -> dict:
    import httpx
    text = httpx.get(f"http://{addr}/metrics", timeout=10).text
    return {why: series_total(text, "cadencerl_router_handed_back_total", why=why) for why in ("evicted", "pause")}


def predicted(policy: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cadencerl.cli", "sim", "-s", "cpu-hetero", "-p", policy,
                           "--json", "-"], capture_output=True, text=True, check=True)
    data = json.loads(done.stdout)
    return {"tok_s": data["throughput_tok_s"], "p95_s": data["latency_p95_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "areal-hetero.json")
    parser.add_argument("--state-dir", type=Path, default=ROOT / "out" / "areal-hetero")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which configurations (comma-separated; a "
                        "name other than areal is the router with that --policy)")
    args = parser.parse_args()
    if not os.environ.get("CADENCERL_AREAL_PATH"):
        raise SystemExit("set CADENCERL_AREAL_PATH to the areal extra (make test installs it into .venv-areal)")
    scenario = builtin_scenario("cpu-hetero")
    batch, eta, train_time = scenario.trainer.batch_size, scenario.controller.eta, scenario.trainer.train_time_s
    cadencerl = [sys.executable, "-m", "cadencerl.cli"]
    subprocess.run([*cadencerl, "pool", "up", "-s", "cpu-hetero", "--state-dir", str(args.state_dir)], check=True)
    chosen = {name: CONFIGS.get(name, "router") for name in args.configs.split(",")}   # any other: a router policy
    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    try:
        urls = (args.state_dir / "urls.txt").read_text().strip().split(",")
        model_dir = Path(json.loads((args.state_dir / "pool.json").read_text())["model_dir"])
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            spec_file = scratch / "episodes.json"
            spec_file.write_text(json.dumps(episodes(scenario)))
            versions = WeightVersions(model_dir, scratch / "versions")
            weights = [versions.path(v) for v in range(1, scenario.workload.trajectories // batch)]
            for run in range(args.runs):
                for name, how in chosen.items():
                    proc, addr = router(urls, name) if how == "router" else (None, ",".join(
                        u.removeprefix("http://") for u in urls))
                    try:
                        started, before = time.monotonic(), server_counters(urls)
                        result = figures(run_client(addr, spec_file, weights, scratch, batch, eta, train_time,
                                                    direct=proc is None))
                        result["servers"] = [{k: a[k] - b[k] for k in a} for a, b in zip(server_counters(urls), before)]
                        if proc is not None:
                            result["handed_back"] = handed_back(addr)
                            result["router_cpu_s"] = cpu_seconds(proc.pid)
                    finally:
                        if proc is not None:
                            proc.terminate()
                            proc.wait(timeout=20)
                    runs[name].append(result)
                    split = " / ".join(f"{s['vllm:generation_tokens_total']:.0f}" for s in result["servers"])
                    cpu = f", router CPU {result['router_cpu_s']:.0f} s" if "router_cpu_s" in result else ""
                    print(f"run {run + 1} {name}: {result['tok_s']:.0f} tok/s, P95 {result['p95_s']:.1f} s, tokens by "
                          f"server {split}{cpu} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        subprocess.run([*cadencerl, "pool", "down", "--state-dir", str(args.state_dir)], check=False)
    summary = {}
    for name, rs in runs.items():
        sim = predicted(name)
        med = {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "p95_s")}
        summary[name] = {"median": med, "min": {k: min(r[k] for r in rs) for k in med},
                         "max": {k: max(r[k] for r in rs) for k in med}, "sim": sim, "runs": rs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    print("| configuration | tok/s | P95 s | sim tok/s | sim P95 s |\n|---|---|---|---|---|")
    for name, s in summary.items():
        m, lo, hi, sim = s["median"], s["min"], s["max"], s["sim"]
        print(f"| {name} | {m['tok_s']:.0f} ({lo['tok_s']:.0f}-{hi['tok_s']:.0f}) | {m['p95_s']:.1f} "
              f"({lo['p95_s']:.1f}-{hi['p95_s']:.1f}) | {sim['tok_s']:.0f} | {sim['p95_s']:.1f} |")


if __name__ == "__main__":
    main()
