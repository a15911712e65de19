"""A fast stub vLLM server for the router's capacity benchmark: raw uvloop + httptools, instant replies.

POST /v1/completions and /v1/chat/completions answer at once: one JSON body with `usage`, or (with
`stream: true`) one SSE event per token (`max_tokens` of them, default 16) and `data: [DONE]`, all
in one write. GET /health, /v1/models and a /metrics page with vLLM's gauge names. So little work a
request that what a router in front of it adds is what a benchmark measures.

    python benchmarks/fast_stub.py --port 8001 [--port 8002 ...]

Each `--port` is one server as a router sees it (a fleet of N servers in one process: the same
work a request, N addresses).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httptools
import uvloop

METRICS = (b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.0\n"
           b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 0\n"
           b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0\n")
MODELS = b'{"object":"list","data":[{"id":"tiny","object":"model"}]}'


def _head(status: str, ctype: bytes, length: int | None) -> bytes:
    size = b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    return b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype + b"\r\n" + size + b"\r\n"


def _reply(path: bytes, body: bytes) -> bytes:
    if path in (b"/v1/completions", b"/v1/chat/completions"):
        req = json.loads(body or b"{}")
        n = int(req.get("max_tokens") or 16)
        chat = path.endswith(b"chat/completions")
        if req.get("stream"):
            delta = (lambda: {"delta": {"content": " t"}}) if chat else (lambda: {"text": " t"})
            events = b"".join(b"data: " + json.dumps({"id": "cmpl-stub", "choices": [{"index": 0, **delta(),
                              "finish_reason": None}]}).encode() + b"\n\n" for _ in range(n)) + b"data: [DONE]\n\n"
            return _head("200 OK", b"text/event-stream", None) + b"%x\r\n" % len(events) + events + b"\r\n0\r\n\r\n"
        choice = {"index": 0, "finish_reason": "length",
                  **({"message": {"role": "assistant", "content": " t" * n}} if chat else {"text": " t" * n})}
        out = json.dumps({"id": "cmpl-stub", "object": "text_completion", "model": "tiny", "choices": [choice],
                          "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}}).encode()
        return _head("200 OK", b"application/json", len(out)) + out
    if path == b"/health":
        return _head("200 OK", b"text/plain", 0)
    if path == b"/metrics":
        return _head("200 OK", b"text/plain", len(METRICS)) + METRICS
    if path == b"/v1/models":
        return _head("200 OK", b"application/json", len(MODELS)) + MODELS
    return _head("404 Not Found", b"text/plain", 0)


class StubProtocol(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport, self.parser = transport, httptools.HttpRequestParser(self)
        self.url, self.body = b"", []

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = httptools.parse_url(self.url).path
        self.transport.write(_reply(path, b"".join(self.body)))
        self.url, self.body = b"", []
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(host: str, ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(StubProtocol, host, port, backlog=4096) for port in ports]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, action="append", help="a port to serve on (repeat for more; default 8001)")
    args = ap.parse_args()
    uvloop.run(serve(args.host, args.port or [8001]))


if __name__ == "__main__":
    main()
