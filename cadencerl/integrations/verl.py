"""verl (0.9.1) through the CadenceRL router: a client whose `generate` is verl's
`LLMServerClient.generate` sent to the router, a load balancer with `GlobalRequestLoadBalancer`'s
interface that keeps the router's workers in step with verl's servers and leaves each request's
choice to the router, and `CadenceRLAgentLoopManager` for `rollout.agent.agent_loop_manager_class`.
verl is imported only when the manager is looked up; the rest needs httpx alone. How: docs/sglang-verl.md.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import httpx

ROUTER_URL_ENV = "CADENCERL_ROUTER_URL"
ROUTER_ID = "cadencerl-router"      # the one server id the balancer hands out: the router chooses
SESSION_HEADER = "X-Session-Id"      # the router's session key: verl's request id, one per trajectory
MAX_RESUMES = 64                     # re-sends of one request the router handed back ("abort")


@dataclass
class TokenOutput:
    """verl's `TokenOutput` fields (`verl/workers/rollout/replica.py`), when verl is not installed."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


def _token_output(**fields: Any):
    try:
        from verl.workers.rollout.replica import TokenOutput as VerlTokenOutput
    except ImportError:
        return TokenOutput(**fields)
    return VerlTokenOutput(**fields)


def resolve_router_url(config: Any = None, given: str | None = None) -> str:
    """`given`, else `actor_rollout_ref.rollout.cadencerl_router_url`, else $CADENCERL_ROUTER_URL."""
    url = given or _rollout(config).get("cadencerl_router_url") or os.environ.get(ROUTER_URL_ENV)
    if not url:
        raise ValueError(f"cadencerl_router_url: give the router's address (rollout.cadencerl_router_url or "
                         f"${ROUTER_URL_ENV})")
    return url.rstrip("/")


def _rollout(config: Any) -> Any:
    try:
        return config.actor_rollout_ref.rollout or {}
    except AttributeError:
        return {}


def max_tokens(sampling_params: dict, prompt_len: int, rollout: Any) -> int:
    """verl's vLLM server's bound (`vllm_async_server.py`, `generate`): `max_tokens` or
    `max_new_tokens` if given, else the response length capped by what the prompt leaves."""
    for name in ("max_tokens", "max_new_tokens"):
        if sampling_params.get(name) is not None:
            return max(1, int(sampling_params[name]))
    response = int(rollout.get("response_length") or 0)
    if not response:
        raise ValueError("max_tokens: give it in sampling_params, or rollout.response_length")
    prompt = int(rollout.get("prompt_length") or 0)
    return max(1, min(response, prompt + response - prompt_len) if prompt else response)


_SAME = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
         "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "seed", "min_tokens")


def completion_body(prompt_ids: list[int], sampling_params: dict, bound: int) -> dict:
    """The router's token-id completion for one verl generate call (the resumable shape)."""
    body = {k: sampling_params[k] for k in _SAME if sampling_params.get(k) is not None}
    return {"prompt": list(prompt_ids), "max_tokens": bound, **body, "logprobs": 0,
            "return_tokens_as_token_ids": True, "stream": False}


def read_answer(answer: dict) -> tuple[list[int], list[float], str | None]:
    """Token ids, their logprobs and vLLM's finish reason from the router's completion answer."""
    choice = answer["choices"][0]
    logprobs = choice.get("logprobs") or {}
    ids = [int(t.removeprefix("token_id:")) for t in logprobs.get("tokens") or []]
    return ids, list(logprobs.get("token_logprobs") or []), choice.get("finish_reason")


class CadenceRLServerClient:
    """verl's `LLMServerClient` interface over the router: `generate(request_id, *, prompt_ids,
    sampling_params, ...) -> TokenOutput`. The request id is the router's session key, so the turns
    of one trajectory are one session there. A request the router hands back ("abort": evicted, or
    aborted) is re-sent with its tokens so far, as `FullyAsyncLLMServerClient` re-sends, until it ends."""

    def __init__(self, config: Any = None, load_balancer_handle: Any = None, router_url: str | None = None,
                 timeout_s: float = 600.0, **kwargs: Any) -> None:
        self.config = config
        self._load_balancer = load_balancer_handle     # kept for verl's interface; the router chooses
        self.url = resolve_router_url(config, router_url)
        self.timeout_s = timeout_s
        self._http: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    def __getstate__(self) -> dict:          # sent to verl's agent-loop workers (Ray): no open client
        return {**self.__dict__, "_http": None}

    def _client(self) -> httpx.AsyncClient:
        """One connection pool per event loop (a pool is bound to the loop it was opened on)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop:
            self._http = (loop, httpx.AsyncClient(timeout=self.timeout_s))
        return self._http[1]

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any):
        if image_data or video_data or audio_data:
            raise ValueError("image_data: multimodal inputs do not go through the CadenceRL router")
        bound = max_tokens(sampling_params, len(prompt_ids), _rollout(self.config))
        tokens: list[int] = []
        logprobs: list[float] = []
        for resumes in range(MAX_RESUMES + 1):
            body = completion_body([*prompt_ids, *tokens], sampling_params, bound - len(tokens))
            r = await self._client().post(f"{self.url}/v1/completions", json=body,
                                      headers={SESSION_HEADER: str(request_id)})
            if r.status_code != 200:
                raise RuntimeError(f"cadencerl router answered {r.status_code}: {r.text[:300]}")
            ids, lps, reason = read_answer(r.json())
            tokens += ids
            logprobs += lps
            if reason != "abort" or len(tokens) >= bound:
                break
        want = sampling_params.get("logprobs")
        return _token_output(token_ids=tokens, log_probs=logprobs if want else None,
                             stop_reason="aborted" if reason == "abort" else "completed",
                             num_preempted=resumes, extra_fields={"cadencerl_resumes": resumes})


class CadenceRLLoadBalancer:
    """`GlobalRequestLoadBalancer`'s interface (`verl/workers/rollout/router.py`). verl's servers
    are the router's workers (registered through its `/workers`); every request is handed the
    router, which places it when it arrives (`acquire_server` -> `(ROUTER_ID, router URL)`).
    As verl's YAML plugin (`rollout.router_config_path`) it is built as `cls(servers, yaml_config)`."""

    def __init__(self, servers: dict[str, Any] | None = None, config: dict | None = None,
                 router_url: str | None = None, full_determinism: bool = False, **kwargs: Any) -> None:
        self.url = (router_url or (config or {}).get("router_url") or os.environ.get(ROUTER_URL_ENV) or "").rstrip("/")
        if not self.url:
            raise ValueError(f"router_url: give the router's address (the plugin YAML's router_url or ${ROUTER_URL_ENV})")
        self._inflight: dict[str | None, int] = {}
        self._servers: dict[str, Any] = {}
        self.add_servers(dict(servers or {}))

    def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, str]:
        self._inflight[request_id] = self._inflight.get(request_id, 0) + 1
        return ROUTER_ID, self.url

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(request_id, 0) > 1:
            self._inflight[request_id] -= 1
        else:
            self._inflight.pop(request_id, None)

    def require_acquire_fields(self) -> list[str]:
        return []

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def add_servers(self, servers: dict[str, Any]) -> None:
        for address, handle in servers.items():
            url = address if "://" in address else f"http://{address}"
            r = httpx.post(f"{self.url}/workers", json={"url": url}, timeout=30)
            if r.status_code not in (200, 201):
                raise RuntimeError(f"cadencerl router refused worker {url}: {r.status_code} {r.text[:300]}")
            self._servers[address] = handle

    def remove_servers(self, server_ids: list[str]) -> None:
        listed = httpx.get(f"{self.url}/workers", timeout=30).json()["workers"]
        for address in server_ids:
            url = address if "://" in address else f"http://{address}"
            for worker in listed:
                if worker["upstream_url"] == url.rstrip("/"):
                    httpx.delete(f"{self.url}/workers/{worker['id']}", timeout=30)
            self._servers.pop(address, None)

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def get_inflight_count(self, server_id: str) -> int:
        return self.get_total_inflight() if server_id == ROUTER_ID else 0

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def get_status(self) -> dict:
        return {"router": self.url, "servers": self.get_all_servers(), "inflight": self.get_total_inflight()}

    def clear_sticky_cache(self) -> dict:
        """Stickiness is the router's (its sessions end at their TTL): nothing is cached here."""
        return {"cleared": 0}


@cache
def _manager_class() -> type:
    from verl.experimental.agent_loop import AgentLoopManager

    class CadenceRLAgentLoopManager(AgentLoopManager):
        """verl's `AgentLoopManager` whose agent loops generate through the CadenceRL router."""

        def __init__(self, config: Any, llm_client: Any = None, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, CadenceRLServerClient(config=config), *args, **kwargs)

    CadenceRLAgentLoopManager.__module__ = __name__
    return CadenceRLAgentLoopManager


def __getattr__(name: str) -> Any:
    """`CadenceRLAgentLoopManager`, built on verl's `AgentLoopManager` when verl looks it up by name."""
    if name == "CadenceRLAgentLoopManager":
        return _manager_class()
    raise AttributeError(name)
