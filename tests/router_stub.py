"""A stub vLLM server for the router's tests and overhead benchmark, and a uvicorn-in-a-thread runner.

It answers /v1/completions and /v1/chat/completions at once (streaming one SSE event per token, or
one JSON body with `usage`), /v1/embeddings and (/v1)/rerank (one fixed answer), /v1/models, /health
and a /metrics page with vLLM's gauge names. Fault modes, set on `StubState` while it runs:
`fail_status` (answer every request with that status), `break_after` (close the stream after that
many events, without the end of the chunked body; with `cut_event`, after part of the next one),
`linger_s` (keep a stream open that long after its end, sending `: ping` each `ping_s`),
`token_delay_s` (sleep between events), `metrics` ("current" gauge names, "old": the KV gauge by its older name, or "none": /metrics
answers 404), `kv_blocks` (a KV of that many 16-token blocks in `vllm:cache_config_info`; None: no
KV size), `pooled_delay_s` (embeddings and rerank answer after that long), `usage` (False: a
response object carries no usage). vLLM's dev-mode weight routes (/pause, /collective_rpc,
/update_weight_version, /resume) answer 200 and are recorded in `dev_calls`. It counts the
X-Request-Id of every request it serves and keeps the latest one's headers.

The Responses API as vLLM serves it with its store on: `POST /v1/responses` (a response object, or
a stream whose first event, `response.created`, carries its id), kept unless `store` is false;
`previous_response_id`, `GET /v1/responses/{id}` and `POST .../cancel` answer vLLM's 404 for an id
this stub did not make, so a request routed to the wrong server fails as it would on vLLM. A
`background: true` request is answered `queued` at once and completed after its tokens' time.

    python tests/router_stub.py --port 8001        # a stub server in its own process
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import uvicorn
from server_thread import ServerThread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

DEV_ROUTES = ("/pause", "/collective_rpc", "/update_weight_version", "/resume")
# uvloop and httptools, as the router is served in production (cadencerl/router/serve.py)
FAST = dict(lifespan="on", loop="uvloop", http="httptools", backlog=4096, timeout_keep_alive=75)


@dataclass
class StubState:
    name: str = "stub"
    fail_status: int | None = None
    break_after: int | None = None
    cut_event: int | None = None    # with break_after: the bytes of the next event sent before the break
                                    # (negative: all but that many; -1 leaves out the blank line that ends it)
    linger_s: float = 0.0           # a stream stays open this long after its last event
    ping_s: float = 0.0             # and meanwhile sends a keep-alive comment this often
    token_delay_s: float = 0.0
    metrics: str = "current"
    metrics_asked: int = 0          # /metrics requests answered (the router polls one server at a time)
    kv_blocks: int | None = None
    pooled_delay_s: float = 0.0
    usage: bool = True              # a response object carries its usage
    text: str = " t"                # each completion token's text
    running: int = 0
    stored: dict = field(default_factory=dict)      # response id -> response object
    generating: set = field(default_factory=set)    # background responses' tasks
    held: dict = field(default_factory=dict)        # response id -> its context, in tokens
    served: Counter = field(default_factory=Counter)
    last_headers: object = None      # the headers of the latest completion request
    dev_calls: list = field(default_factory=list)   # vLLM dev-mode weight routes called: (route, args)


class BrokenStream(Exception):
    """Raised inside a response body: uvicorn drops the connection mid-body."""


def stub_app(state: StubState) -> Starlette:
    async def received(request: Request) -> tuple[dict, Response | None]:
        """The body, counted as served; with the failure answer when the stub is set to fail."""
        body = await request.json()
        state.served[request.headers.get("x-request-id", "")] += 1
        state.last_headers = request.headers
        failure = None if state.fail_status is None else \
            JSONResponse({"error": {"message": "stub failure"}}, status_code=state.fail_status)
        return body, failure

    async def complete(request: Request) -> Response:
        body, failure = await received(request)
        if failure is not None:
            return failure
        n = int(body.get("max_tokens") or 16)
        chat = request.url.path.endswith("chat/completions")
        if not body.get("stream"):
            state.running += 1
            try:
                for _ in range(n if state.token_delay_s else 0):   # vLLM aborts a request whose client left
                    await asyncio.sleep(state.token_delay_s)
                    if await request.is_disconnected():
                        return Response(status_code=499)
            finally:
                state.running -= 1
            choice = {"index": 0, "finish_reason": "length",
                      **({"message": {"role": "assistant", "content": " t" * n}} if chat else {"text": " t" * n})}
            return JSONResponse({"id": "cmpl-stub", "object": "chat.completion" if chat else "text_completion",
                                 "model": "tiny", "choices": [choice],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}},
                                headers={"x-stub": state.name})
        if body.get("return_tokens_as_token_ids") and body.get("logprobs") is not None:
            return StreamingResponse(_token_events(state, body["prompt"], n, body.get("stream_options")),
                                     media_type="text/event-stream", headers={"x-stub": state.name})
        return StreamingResponse(_events(state, n, chat), media_type="text/event-stream",
                                 headers={"x-stub": state.name})

    async def metrics(request: Request) -> Response:
        state.metrics_asked += 1
        if state.metrics == "none":
            return PlainTextResponse("not found", status_code=404)
        kv = "vllm:gpu_cache_usage_perc" if state.metrics == "old" else "vllm:kv_cache_usage_perc"
        text = (f"# TYPE {kv} gauge\n{kv}{{engine=\"0\"}} "
                f"{min(1.0, state.running / 64)}\n"
                f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} {state.running}\n"
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0\n"
                "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{engine=\"0\"} 0\n")
        if state.kv_blocks is not None:
            text += ("# TYPE vllm:cache_config_info gauge\n"
                     f"vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{state.kv_blocks}\"}} 1.0\n")
        return PlainTextResponse(text)

    async def pooled(request: Request) -> Response:
        """/v1/embeddings and (/v1)/rerank, as a pooling model answers them."""
        body, failure = await received(request)
        state.running += 1
        try:
            await asyncio.sleep(state.pooled_delay_s)
        finally:
            state.running -= 1
        if failure is not None:
            return failure
        if request.url.path.endswith("embeddings"):
            out = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.5]}]}
        else:
            out = {"results": [{"index": i, "relevance_score": 1 / (i + 1)} for i in range(len(body["documents"]))]}
        return JSONResponse({**out, "model": "tiny"}, headers={"x-stub": state.name})

    async def responses(request: Request) -> Response:
        body, failure = await received(request)
        if failure is not None:
            return failure
        previous = body.get("previous_response_id")
        if previous is not None and previous not in state.stored:
            return _not_found(previous)
        n = int(body.get("max_output_tokens") or 16)
        rid = body.get("request_id") or f"resp_{state.name}_{sum(state.served.values())}"
        # vLLM's input_tokens count the turns a previous_response_id continues (the stub: 4 characters a token)
        given = body["input"] if isinstance(body["input"], str) else json.dumps(body["input"])
        held = state.held.get(previous, 0)
        usage = {"input_tokens": held + max(1, len(given) // 4), "output_tokens": n}
        usage["total_tokens"] = usage["input_tokens"] + n
        done = {"id": rid, "object": "response", "status": "completed", "previous_response_id": previous,
                "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": " t" * n}]}],
                "usage": usage if state.usage else None}
        if body.get("store") is not False:
            state.stored[rid], state.held[rid] = done, usage["total_tokens"]
        if body.get("background"):     # generated on, whether or not its client stays (vLLM's task)
            state.stored[rid] = queued = {**done, "status": "queued", "output": [], "usage": None}
            state.generating.add(asyncio.create_task(_generate(state, rid, done, n)))
            if not body.get("stream"):      # answered now
                return JSONResponse(queued, headers={"x-stub": state.name})
        if not body.get("stream"):
            await asyncio.sleep(state.token_delay_s * n)
            return JSONResponse(done, headers={"x-stub": state.name})
        return StreamingResponse(_response_events(state, done, n), media_type="text/event-stream",
                                 headers={"x-stub": state.name})

    async def stored(request: Request) -> Response:
        rid = request.path_params["response_id"]
        state.served[request.headers.get("x-request-id", "")] += 1
        state.last_headers = request.headers
        if rid not in state.stored:
            return _not_found(rid)
        if request.url.path.endswith("/cancel"):
            state.stored[rid] = {**state.stored[rid], "status": "cancelled"}
        elif request.query_params.get("stream") == "true":     # replayed as a stream
            done = state.stored[rid]
            return StreamingResponse(_response_events(state, done, done["usage"]["output_tokens"]),
                                     media_type="text/event-stream", headers={"x-stub": state.name})
        return JSONResponse(state.stored[rid], headers={"x-stub": state.name})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def health(request: Request) -> Response:
        return PlainTextResponse("")

    async def version(request: Request) -> Response:
        return JSONResponse({"version": "stub-" + state.name})

    async def tokenize(request: Request) -> Response:
        """vLLM's /tokenize and /detokenize, answered with the stub's name (which server answered)."""
        body, failure = await received(request)
        return failure or JSONResponse({"tokens": [1, 2, 3], "count": 3, "max_model_len": 4096},
                                       headers={"x-stub": state.name})

    async def dev(request: Request) -> Response:
        """vLLM's dev-mode routes (VLLM_SERVER_DEV_MODE=1) a weight update uses, recorded."""
        raw = await request.body()
        state.dev_calls.append((request.url.path, json.loads(raw) if raw else dict(request.query_params)))
        return JSONResponse({})

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/v1/chat/completions", complete, methods=["POST"]),
                             *(Route(p, pooled, methods=["POST"]) for p in ("/v1/embeddings", "/v1/rerank", "/rerank")),
                             Route("/v1/responses", responses, methods=["POST"]),
                             Route("/v1/responses/{response_id}", stored, methods=["GET"]),
                             Route("/v1/responses/{response_id}/cancel", stored, methods=["POST"]),
                             Route("/metrics", metrics), Route("/v1/models", models), Route("/health", health),
                             Route("/version", version), Route("/ping", health),
                             *(Route(p, tokenize, methods=["POST"]) for p in ("/tokenize", "/detokenize")),
                             *(Route(p, dev, methods=["POST"]) for p in DEV_ROUTES)])


async def _events(state: StubState, n: int, chat: bool):
    state.running += 1
    try:
        delta = {"delta": {"content": state.text}} if chat else {"text": state.text}
        chunks = ({"id": "cmpl-stub", "object": "chat.completion.chunk" if chat else "text_completion",
                   "choices": [{"index": 0, **delta, "finish_reason": "length" if i == n - 1 else None}]}
                  for i in range(n))
        async for event in _paced(state, (f"data: {json.dumps(chunk)}\n\n" for chunk in chunks), first_waits=True):
            yield event
        yield "data: [DONE]\n\n"
        lingered = 0.0
        while lingered < state.linger_s:    # open after its end, a keep-alive comment each ping_s
            await asyncio.sleep(state.ping_s or state.linger_s)
            lingered += state.ping_s or state.linger_s
            if state.ping_s:
                yield ": ping\n\n"
    finally:
        state.running -= 1


def stub_token(context: list[int]) -> int:
    """The stub's model: the next token id, a function of the context alone (so a resumed request
    goes on exactly as if it had never been cut)."""
    return (len(context) * 7 + (context[-1] if context else 0)) % 997 + 1


async def _token_events(state: StubState, prompt: list[int], n: int, options: dict | None):
    """A token-id completion stream as vLLM sends it with `return_tokens_as_token_ids` and logprobs:
    one token per event, `token_id:N`, then the usage when `stream_options.include_usage` asks."""
    state.running += 1
    context = list(prompt)
    try:
        for i in range(n):
            if state.token_delay_s:
                await asyncio.sleep(state.token_delay_s)
            token = stub_token(context)
            context.append(token)
            choice = {"index": 0, "text": f" w{token}", "finish_reason": "length" if i == n - 1 else None,
                      "logprobs": {"text_offset": [0], "token_logprobs": [-0.5], "tokens": [f"token_id:{token}"],
                                   "top_logprobs": [{f"token_id:{token}": -0.5}]}}
            yield f"data: {json.dumps({'id': 'cmpl-stub', 'object': 'text_completion', 'choices': [choice]})}\n\n"
        if options and options.get("include_usage"):
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            yield f"data: {json.dumps({'id': 'cmpl-stub', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        state.running -= 1


async def _generate(state: StubState, rid: str, done: dict, n: int) -> None:
    """A background response: completed after its tokens' time, unless cancelled meanwhile."""
    await asyncio.sleep(state.token_delay_s * n)
    if state.stored.get(rid, {}).get("status") == "queued":
        state.stored[rid] = done


def _not_found(response_id: str) -> Response:
    """vLLM's answer for a response id it does not hold."""
    return JSONResponse({"error": {"message": f"Response with id '{response_id}' not found.", "type": "invalid_request_error",
                                   "param": "response_id", "code": 404}}, status_code=404)


async def _response_events(state: StubState, done: dict, n: int):
    """A Responses stream as vLLM sends it: `event:` and `data:` lines, the id in the first event."""
    state.running += 1
    try:
        events = [("response.created", {"response": {**done, "status": "in_progress", "output": [], "usage": None}}),
                  *(("response.output_text.delta", {"delta": " t"}) for _ in range(n)),
                  ("response.completed", {"response": done})]
        texts = (f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': i, **data})}\n\n"
                 for i, (kind, data) in enumerate(events))
        async for event in _paced(state, texts, first_waits=False):
            yield event
    finally:
        state.running -= 1


async def _paced(state: StubState, events, first_waits: bool):
    """`events` each after `token_delay_s` (the first too, if `first_waits`), broken off as
    `break_after` and `cut_event` say."""
    for i, event in enumerate(events):
        if state.token_delay_s and (i or first_waits):
            await asyncio.sleep(state.token_delay_s)
        if state.break_after is not None and i >= state.break_after:
            if state.cut_event is not None:
                yield event[:state.cut_event]
            raise BrokenStream("stub breaks the stream")
        yield event


class Fleet:
    """Stub upstreams and a router in front of them, all on 127.0.0.1; a context manager."""

    def __init__(self, stubs: int = 2, admin_token: str | None = "secret", **settings) -> None:
        from cadencerl.router.app import create_app
        from cadencerl.router.settings import make_settings

        self.states = [StubState(f"stub{i}") for i in range(stubs)]
        self.stubs = [ServerThread(stub_app(s), name=s.name, **FAST).start() for s in self.states]
        settings.setdefault("metrics_interval_s", 0.1)
        self.settings = make_settings(workers=[s.url for s in self.stubs], **settings)
        self.app = create_app(self.settings, admin_token=admin_token)
        from cadencerl.router.datapath import protocol_for  # as `cadencerl router` serves it
        self.router = ServerThread(self.app, name="router", **{**FAST, "http": protocol_for(self.app)}).start()
        self.url = self.router.url

    @property
    def service(self):
        return self.app.state.service

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.router.stop()
        for s in self.stubs:
            s.stop()


def settle(check, timeout_s: float = 3.0) -> bool:
    """Wait until `check()` holds (the router's state changes on its own thread), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="stub")
    args = parser.parse_args()
    uvicorn.run(stub_app(StubState(args.name)), host="127.0.0.1", port=args.port, log_level="error",
                access_log=False, loop="uvloop", http="httptools", backlog=4096)


if __name__ == "__main__":
    main()
