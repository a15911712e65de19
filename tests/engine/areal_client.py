"""AReaL's own rollout client, unchanged, pointed at a router: the program `test_areal.py` runs.

It runs under vLLM's interpreter with AReaL on its path (`make test` installs `areal==1.0.4` with only
what its remote engine imports, `--no-deps`, into .venv-areal). Episodes go through AReaL's
`RemotevLLMEngine` and `WorkflowExecutor` (its `StalenessManager` paces them); after a batch, a
weight update from disk goes as AReaL sends it (pause, update, continue) while the rest are in
flight. What each episode got is written as JSON (for `test_areal.py`, `benchmarks/areal_hetero.py`).
`--direct`: AReaL is given the servers themselves, which (stock vLLM) lack AReaL's update route:
the update goes to each through vLLM's dev-mode routes, as `devpool.weights` sends it.

    python areal_client.py --addr 127.0.0.1:PORT --weights DIR[,DIR2...] --out result.json --scratch DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig, NameResolveConfig
from areal.api.io_struct import ModelRequest, WeightUpdateMeta
from areal.api.workflow_api import RolloutWorkflow
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.utils import name_resolve, names

EXPERIMENT, TRIAL = "cadencerl", "areal-client"


class TokenEpisode(RolloutWorkflow):
    """One episode of token ids: a single reply (RLVR), or turns with observations between (agentic)."""

    async def arun_episode(self, engine, data):
        started = time.monotonic()
        context = list(data["prompt"])
        turns = []
        for turn, n in enumerate(data["replies"]):
            gconfig = GenerationHyperparameters(max_new_tokens=n, ignore_eos=True, temperature=1.0)
            resp = await engine.agenerate(ModelRequest(input_ids=list(context), gconfig=gconfig))
            turns.append({"tokens": len(resp.output_tokens), "asked": n, "stop": resp.stop_reason,
                          "versions": list(resp.output_versions)})
            context += list(resp.output_tokens)
            if turn + 1 < len(data["replies"]):
                context += data["observation"]       # a tool's answer joins the context
        RESULTS[data["id"]] = {"turns": turns, "context": len(context), "latency_s": time.monotonic() - started}
        versions = [v for t in turns for v in t["versions"]]
        return {"input_ids": torch.tensor([context], dtype=torch.int32),
                "attention_mask": torch.ones((1, len(context)), dtype=torch.bool),
                "versions": torch.tensor([[-1] * (len(context) - len(versions)) + versions], dtype=torch.int32),
                "episode": torch.tensor([data["id"]], dtype=torch.int32),
                "rewards": torch.tensor([float(len(context))])}


RESULTS: dict[int, dict] = {}


def episodes(n: int) -> list[dict]:
    """Every third episode agentic (three turns), the rest a single long reply; one in six 2,000
    tokens, still running when the first batch is taken (so one spans the update on a fast machine)."""
    out = []
    for i in range(n):
        prompt = [5 + (i * 37 + j * 11) % 900 for j in range(24 + i % 5)]
        replies = [120, 80, 100] if i % 3 == 2 else [2000 if i % 6 == 4 else 300 + 100 * (i % 6)]
        out.append({"id": i, "prompt": prompt, "replies": replies, "observation": [7, 8, 9, 10] * 3})
    return out


def update_weights(engine: RemotevLLMEngine, path: str, version: int, servers: list[str] | None) -> float:
    """AReaL's disk update as its trainer drives it (`areal/trainer/rl_trainer.py`, `fsdp_engine.py`):
    pause the rollout, pause generation, publish, update every address, continue, resume. `servers`:
    AReaL was given stock vLLM servers, updated one by one through their dev-mode routes."""
    start = time.monotonic()
    engine.pause()
    if servers is not None:
        push_directly(servers, path, version)
        engine.set_version(version)
        engine.resume()
        return time.monotonic() - start
    engine.pause_generation()
    future = engine.update_weights_from_disk(WeightUpdateMeta(type="disk", path=path,
                                                              clear_checkpoint_after_load=False))
    key = names.update_weights_from_disk(EXPERIMENT, TRIAL, engine.get_version())
    name_resolve.add(key, str(time.time()), keepalive_ttl=120, replace=True)   # the trainer's "saved"
    future.result(timeout=120)
    engine.set_version(version)
    engine.continue_generation()
    engine.resume()
    return time.monotonic() - start


def push_directly(addresses: list[str], path: str, version: int) -> None:
    """Each stock vLLM server: pause (aborting what runs, which AReaL resumes), reload, tag, resume."""
    import httpx

    from cadencerl.devpool.weights import update_steps

    for addr in addresses:
        for route, args in update_steps(path, version):
            httpx.post(f"http://{addr}{route}", timeout=300, **args).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="host:port of each server AReaL is given (comma-separated)")
    parser.add_argument("--weights", required=True, help="the folders of versions 1, 2, ... (comma-separated): "
                        "one update after each batch but the last, while there are folders")
    parser.add_argument("--out", required=True)
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eta", type=int, default=1)
    parser.add_argument("--scratch", required=True, help="a folder for AReaL's name_resolve records")
    parser.add_argument("--episodes-file", help="the episodes as JSON (id, prompt, replies, observation)")
    parser.add_argument("--train-time", type=float, default=0.0, help="seconds a training step takes")
    parser.add_argument("--direct", action="store_true", help="--addr are the servers (stock vLLM)")
    args = parser.parse_args()

    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=os.path.join(args.scratch, "names")))
    config = InferenceEngineConfig(backend="vllm:d1", experiment_name=EXPERIMENT, trial_name=TRIAL,
                                   max_concurrent_rollouts=args.batch * (args.eta + 1),
                                   consumer_batch_size=args.batch, max_head_offpolicyness=args.eta,
                                   setup_timeout=60, request_timeout=300, request_retries=2,
                                   pause_grace_period=0.5)
    engine = RemotevLLMEngine(config)
    engine.initialize(addr=args.addr.split(","), train_data_parallel_size=1)
    spec = json.load(open(args.episodes_file)) if args.episodes_file else episodes(args.episodes)
    weights = args.weights.split(",")
    start = time.monotonic()
    consumed = []            # (trainer version when the batch was taken, episode ids)
    updates = []             # seconds each weight update held generation
    try:
        workflow = TokenEpisode()
        for data in spec:
            engine.submit(data, workflow=workflow)
        left = len(spec)
        while left:
            batch = engine.wait(min(args.batch, left), timeout=600)
            version = engine.get_version()
            consumed.append((version, [int(t["episode"][0]) for t in batch if t is not None]))
            left -= len(batch)
            if left and version < len(weights):     # a training step while the rest are in flight
                time.sleep(args.train_time)
                updates.append(update_weights(engine, weights[version], version + 1,
                                              args.addr.split(",") if args.direct else None))
        stats = engine.workflow_executor.staleness_manager.get_stats()
    finally:
        engine.destroy()
    with open(args.out, "w") as f:
        json.dump({"episodes": {str(k): v for k, v in RESULTS.items()}, "spec": spec,
                   "consumed": consumed, "updates_s": updates, "wall_s": time.monotonic() - start,
                   "staleness": {k: v for k, v in vars(stats).items()} if hasattr(stats, "__dict__") else str(stats)},
                  f)


if __name__ == "__main__":
    main()
