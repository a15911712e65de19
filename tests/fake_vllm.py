"""An in-process fake of the vLLM server subset CadenceRL's client speaks, for tests without vLLM.

Served by uvicorn on 127.0.0.1 (a free port) in a thread: real HTTP, real streaming, real client
disconnects, so the client and EngineBackend run exactly as against vLLM. The endpoints and their
shapes follow vLLM's `--enable-scale-out` token-in/token-out server:

- POST /inference/v1/generate  {request_id, model, token_ids, sampling_params{max_tokens}, stream}
  streams `data: {"choices": [{"token_ids": [...], "finish_reason": null}]}` events, then a last
  chunk with finish_reason "length" (or "abort"), then `data: [DONE]`. The server names the request
  `generate-tokens-<request_id>`. A closed connection aborts the request (vLLM does the same).
- POST /inference/v1/abort_requests {request_ids}; GET /health; GET /v1/models; GET /metrics with
  the gauges and counters the client reads and `vllm:cache_config_info`.

Tokens are greedy and deterministic: the next id is a function of the whole context so far, so a
request resumed from its last token on any fake server continues exactly as if never interrupted.
`die_after_tokens` makes the server drop every stream mid-body and stop answering (a
killed process); `break_after_tokens` drops the next stream to send a token, once, and stays
healthy (a network hiccup); `hold_after_tokens` stalls each request after that many tokens until it is aborted.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from server_thread import ServerThread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

PREFIX = "generate-tokens-"
VOCAB = 4096
BLOCK = 32


def next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of the context (its length and last two ids)."""
    a = context[-1] if context else 0
    b = context[-2] if len(context) > 1 else 0
    return 1 + (a * 31 + b * 17 + len(context) * 7) % (VOCAB - 1)


def reference(prompt: list[int], n: int) -> list[int]:
    """What `n` tokens after `prompt` are, streamed in one piece."""
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(next_token(ctx))
    return ctx[len(prompt):]


@dataclass
class _Request:
    context: list[int]
    aborted: bool = False


@dataclass
class FakeState:
    """What the fake saw; read by tests (written only on the server's thread)."""

    requests: list[tuple[str, list[int], int]] = field(default_factory=list)  # (id, prompt, max_tokens)
    aborted: list[str] = field(default_factory=list)        # ids aborted by abort_requests
    disconnected: list[str] = field(default_factory=list)   # ids whose client went away mid-stream
    tokens_streamed: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


class FakeVLLM:
    """One fake server; `with FakeVLLM() as server:` serves at `server.url` until the block ends."""

    def __init__(self, *, model: str = "tiny", max_model_len: int = 2048, kv_tokens: int = 8192,
                 token_interval_s: float = 0.002, die_after_tokens: int | None = None,
                 break_after_tokens: int | None = None, hold_after_tokens: int | None = None,
                 slow_health_probes: int = 0, reject_status: int | None = None,
                 reject_in_stream: bool = False, failing_health_probes: int = 0) -> None:
        self.model, self.max_model_len, self.kv_tokens = model, max_model_len, kv_tokens
        self.token_interval_s = token_interval_s
        # Faults at a token count, not a time, so a test on a busy machine sees the same run.
        self.die_after_tokens = die_after_tokens      # die once this many tokens were streamed in all
        self.break_after_tokens = break_after_tokens  # break one stream once, at this many in all
        self.hold_after_tokens = hold_after_tokens    # a request stalls after this many of its tokens
        self.slow_health_probes = slow_health_probes  # this many /health calls answer only after 2 s
        self.failing_health_probes = failing_health_probes  # ... then this many answer 503 (a restart)
        self.reject_status = reject_status            # answer every generate with this 4xx status
        self.reject_in_stream = reject_in_stream      # ... as vLLM does a streamed one: 200, then an error event
        self.state = FakeState()
        self.dead = False
        self._break_once = False
        self._running: dict[str, _Request] = {}
        self._seen_blocks: set[tuple[int, ...]] = set()
        app = Starlette(routes=[
            Route("/health", self._health),
            Route("/v1/models", self._models),
            Route("/metrics", self._metrics),
            Route("/inference/v1/generate", self._generate, methods=["POST"]),
            Route("/inference/v1/abort_requests", self._abort, methods=["POST"]),
        ])
        self._server = ServerThread(app, name="fake-vllm", log_level="critical", lifespan="off",
                                    timeout_graceful_shutdown=1)
        self.url = self._server.url

    # -- control (from the test's thread) -------------------------------------------------------

    def __enter__(self) -> FakeVLLM:
        self._server.start(timeout_s=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.stop()

    @property
    def running(self) -> int:
        return len(self._running)

    # -- endpoints (on the server's thread) -----------------------------------------------------

    async def _health(self, _request: Request) -> Response:
        if self.slow_health_probes > 0:
            self.slow_health_probes -= 1
            await asyncio.sleep(2.0)
        elif self.failing_health_probes > 0:
            self.failing_health_probes -= 1
            return Response(status_code=503)
        return Response(status_code=503 if self.dead else 200)

    async def _models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "max_model_len": self.max_model_len}]})

    async def _metrics(self, _request: Request) -> Response:
        used = sum(len(r.context) for r in self._running.values())
        lines = [
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {min(1.0, used / self.kv_tokens)}',
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {len(self._running)}.0',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",model_name="{self.model}"}} 0.0',
            "# TYPE vllm:num_preemptions counter",
            f'vllm:num_preemptions_total{{engine="0",model_name="{self.model}"}} 0.0',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="{self.model}"}} {self.state.prefix_queries}.0',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{self.model}"}} {self.state.prefix_hits}.0',
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",'
            f'num_gpu_blocks="{self.kv_tokens // BLOCK}"}} 1.0',
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def _abort(self, request: Request) -> Response:
        for rid in (await request.json()).get("request_ids", []):
            if rid in self._running:
                self._running[rid].aborted = True
                self.state.aborted.append(rid)
        return Response(status_code=200)

    async def _generate(self, request: Request) -> Response:
        if self.dead:
            return Response(status_code=503)
        body = await request.json()
        if body.get("model") != self.model:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "code": 404}}, status_code=404)
        if self.reject_status is not None:
            self.state.requests.append((body["request_id"], [], 0))
            error = {"error": {"message": "bad request: token id out of range", "type": "BadRequestError",
                               "param": None, "code": self.reject_status}}
            if self.reject_in_stream:
                return StreamingResponse(iter([_event(error), "data: [DONE]\n\n"]), media_type="text/event-stream")
            return JSONResponse(error, status_code=self.reject_status)
        prompt = [int(t) for t in body["token_ids"]]
        max_tokens = min(int(body["sampling_params"]["max_tokens"]), self.max_model_len - len(prompt))
        rid = PREFIX + body["request_id"]
        self.state.requests.append((body["request_id"], prompt, max_tokens))
        self._count_prefix(prompt)
        self._running[rid] = _Request(list(prompt))
        return StreamingResponse(self._stream(rid, max_tokens), media_type="text/event-stream")

    def _count_prefix(self, prompt: list[int]) -> None:
        """Whole blocks of the prompt seen before count as prefix-cache hits, as in vLLM."""
        self.state.prefix_queries += len(prompt)
        for end in range(BLOCK, len(prompt) + 1, BLOCK):
            block = tuple(prompt[:end])
            if block in self._seen_blocks:
                self.state.prefix_hits += BLOCK
            self._seen_blocks.add(block)

    def _count_streamed(self) -> None:
        self.state.tokens_streamed += 1
        if self.state.tokens_streamed == self.die_after_tokens:
            self.dead = True
        if self.state.tokens_streamed == self.break_after_tokens:
            self._break_once = True

    async def _stream(self, rid: str, max_tokens: int):
        req, sent, finish = self._running[rid], 0, "length"
        try:
            while sent < max_tokens:
                await asyncio.sleep(self.token_interval_s)
                if self.dead or self._break_once:
                    self._break_once = False
                    raise ConnectionResetError("fake vLLM dropped the stream")   # body never ends
                if req.aborted:
                    finish = "abort"
                    break
                if self.hold_after_tokens is not None and sent >= self.hold_after_tokens:
                    continue
                token = next_token(req.context)
                req.context.append(token)
                sent += 1
                self._count_streamed()
                yield _event({"request_id": rid, "choices": [{"index": 0, "token_ids": [token],
                                                              "finish_reason": None}]})
            yield _event({"request_id": rid, "choices": [{"index": 0, "token_ids": [],
                                                          "finish_reason": finish}]})
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.state.disconnected.append(rid)   # the client went away: abort, free the KV
            raise
        finally:
            self._running.pop(rid, None)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
