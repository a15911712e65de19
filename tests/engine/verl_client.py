"""verl's own classes pointed at a CadenceRL router: the program `tests/test_verl.py` runs.

It runs under vLLM's interpreter (torch) with verl 0.9.1 on its path, installed with only what the
code used here imports (`make test`: .venv-verl, beside .venv-areal's Ray and OmegaConf). verl's
plugin factory builds the load balancer as a Ray actor from its YAML, verl's `LLMServerClient` asks
that actor for a server, verl's loader finds the agent-loop manager by the name a user configures,
and the manager's client runs multi-turn trajectories through the router. What each step gave is
written as JSON for the test to check.

    python verl_client.py --router URL --register HOST:PORT --yaml FILE --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import ray
from omegaconf import OmegaConf
from verl.experimental.agent_loop import AgentLoopManager
from verl.utils.import_utils import load_class_from_fqn
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.router import get_router_handle

MANAGER = "cadencerl.integrations.verl.CadenceRLAgentLoopManager"
TURNS, TRAJECTORIES, OBSERVATION = 3, 2, [700]


def verl_config(router: str):
    return OmegaConf.create({"actor_rollout_ref": {"model": {}, "rollout": {
        "name": "vllm", "response_length": 12, "prompt_length": 64, "cadencerl_router_url": router,
        "agent": {"agent_loop_manager_class": MANAGER}}}})


async def trajectory(client, request_id: str, prompt: list[int]) -> list[dict]:
    """Turns as verl's tool agent loop sends them: the context grows by each reply and an observation."""
    turns = []
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)
    for _ in range(TURNS):
        out = await client.generate(request_id, prompt_ids=list(prompt), sampling_params=params)
        turns.append({"prompt": list(prompt), "tokens": out.token_ids, "log_probs": out.log_probs,
                      "stop_reason": out.stop_reason, "verl_token_output": isinstance(out, TokenOutput)})
        prompt = prompt + out.token_ids + OBSERVATION
    return turns


async def acquire_release(handle) -> list:
    """verl's own client asks the balancer actor, as every verl generate call does first."""
    client = LLMServerClient(config=None, load_balancer_handle=handle)
    server_id, server = await client._acquire_server("verl-request-1")
    inflight = await handle.get_total_inflight.remote()
    client._release_server(server_id, request_id="verl-request-1")
    return [server_id, server, inflight]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--register", required=True, help="a server verl launched, to join the router")
    ap.add_argument("--yaml", required=True, help="verl's rollout.router_config_path")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        handle = get_router_handle(servers={args.register: None}, router_config_path=args.yaml)
        acquired = asyncio.run(acquire_release(handle))
        status = ray.get(handle.get_status.remote())
        joined = [w["upstream_url"] for w in httpx.get(f"{args.router}/workers").json()["workers"]]
        config = verl_config(args.router)
        manager_cls = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                          "AgentLoopManager")
        manager = manager_cls(config=config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None)

        async def rollouts() -> list[list[dict]]:
            return await asyncio.gather(*(trajectory(manager.llm_client, f"traj-{i}", [60 + i, 1])
                                          for i in range(TRAJECTORIES)))
        result = {"acquired": acquired, "status": status, "router_workers": joined,
                  "manager_is_verls": isinstance(manager, AgentLoopManager),
                  "client": type(manager.llm_client).__name__, "client_url": manager.llm_client.url,
                  "trajectories": asyncio.run(rollouts())}
        ray.get(handle.remove_servers.remote([args.register]))
    finally:
        ray.shutdown()
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
