"""`router/datapath.py`: the generating routes served on the connection's protocol keep HTTP's rules
(keep-alive, pipelining in order, chunked streams, 100-continue, body limits) and hand every other
request to the Starlette app on the same connection."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httptools
import httpx
import pytest
from router_stub import Fleet, settle

pytestmark = pytest.mark.timeout(60)

BODY = b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 3}'
STREAM = b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "stream": true}'


def _post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        path.encode(), len(body))
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


class _Replies:
    """httptools' parse of what the router sent back on one connection: each reply's status, headers, body."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, dict, bytes]] = []
        self._headers: dict = {}
        self._body = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self._headers, self._body))
        self._headers, self._body = {}, b""


def _talk(url: str, data: bytes, replies: int, pause_s: float = 0.0) -> tuple[list, bool]:
    """Send `data` on one connection and read `replies` replies; also whether the server closed it after."""
    u = urlsplit(url)
    parsed = _Replies()
    closed = False
    with socket.create_connection((u.hostname, u.port), timeout=5) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + 5
        while len(parsed.done) < replies and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            parsed.parser.feed_data(chunk)
        if not closed:
            sock.settimeout(pause_s or 0.2)
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                pass
    return parsed.done, closed


def test_pipelined_requests_are_answered_in_order_on_one_kept_alive_connection() -> None:
    with Fleet(stubs=1) as f:
        data = (_post("/v1/completions", BODY, b"x-request-id: one") + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
                + _post("/v1/completions", STREAM, b"x-request-id: three")
                + _post("/v1/completions?x=1", BODY, b"x-request-id: four"))      # a query: the app's path
        done, closed = _talk(f.url, data, 4)
        assert [status for status, _, _ in done] == [200, 200, 200, 200] and not closed
        assert done[0][1]["x-request-id"] == "one" and b'"choices"' in done[0][2]
        assert b'"workers_up"' in done[1][2]
        assert done[2][1]["transfer-encoding"] == "chunked" and done[2][1]["x-request-id"] == "three"
        assert done[2][2].count(b"data: ") == 4 and done[2][2].endswith(b"data: [DONE]\n\n")
        assert done[3][1]["x-request-id"] == "four"
        assert f.states[0].served.total() == 3
        assert settle(lambda: all(w.load == 0 for w in f.service.state.workers))


def test_a_request_id_is_made_when_none_is_sent_and_reaches_the_server() -> None:
    with Fleet(stubs=1) as f:
        done, _ = _talk(f.url, _post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}'), 1)
        assert done[0][0] == 200 and len(done[0][1]["x-request-id"]) == 32
        assert f.states[0].last_headers.get("x-request-id") == done[0][1]["x-request-id"]


def test_connection_close_and_http_1_0_are_honoured() -> None:
    with Fleet(stubs=1) as f:
        done, closed = _talk(f.url, _post("/v1/completions", BODY, b"connection: close"), 1)
        assert done[0][0] == 200 and done[0][1]["connection"] == "close" and closed
        old = _post("/v1/completions", BODY).replace(b"HTTP/1.1", b"HTTP/1.0", 1)     # the app's path
        done, closed = _talk(f.url, old, 1)
        assert done[0][0] == 200 and closed


def test_a_body_over_the_limit_is_a_413_at_once_and_the_connection_closed() -> None:
    with Fleet(stubs=1, max_body_bytes=1000) as f:
        declared = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\nexpect: 100-continue\r\n\r\n"
        done, closed = _talk(f.url, declared, 1)       # refused before a byte of the body came (no 100 first)
        assert done[0][0] == 413 and b'"request_too_large"' in done[0][2] and closed
        chunked = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                   + b"400\r\n" + b"a" * 1024 + b"\r\n" + b"400\r\n" + b"a" * 1024 + b"\r\n")
        done, closed = _talk(f.url, chunked, 1)
        assert done[0][0] == 413 and closed and len(done[0][1]["x-request-id"]) == 32
        assert 'cadencerl_router_errors_total{kind="bad_request"} 2.0' in httpx.get(f.url + "/metrics").text
        assert httpx.post(f.url + "/v1/completions", content=BODY).status_code == 200


def test_a_chunked_body_and_expect_100_continue_are_read() -> None:
    with Fleet(stubs=1) as f:
        half = len(BODY) // 2
        chunked = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n"
                   b"\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half, BODY[half:]))
        u = urlsplit(f.url)
        with socket.create_connection((u.hostname, u.port), timeout=5) as sock:
            sock.sendall(chunked)
            out = b""
            while b"[1" not in out and b'"choices"' not in out:
                out += sock.recv(65536)
        assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")


def test_a_client_that_leaves_a_stream_or_a_held_request_frees_what_it_held() -> None:
    with Fleet(stubs=1) as f:
        f.states[0].token_delay_s = 0.2
        u = urlsplit(f.url)
        for body in (STREAM, BODY):
            with socket.create_connection((u.hostname, u.port), timeout=5) as sock:
                sock.sendall(_post("/v1/completions", body.replace(b'"max_tokens": 3', b'"max_tokens": 50')))
                assert settle(lambda: f.states[0].running == 1)
            assert settle(lambda: f.states[0].running == 0 and all(w.load == 0 for w in f.service.state.workers))
        metric = 'cadencerl_router_errors_total{kind="client_disconnect"} 2.0'   # both left before their reply began
        assert metric in httpx.get(f.url + "/metrics").text


def test_the_head_limits_hold_on_the_data_path() -> None:
    with Fleet(stubs=1) as f:
        many = b"".join(b"x-h%d: v\r\n" % i for i in range(101))
        done, closed = _talk(f.url, _post("/v1/completions", BODY, many.rstrip(b"\r\n")), 1)
        assert done[0][0] == 431 and closed
        assert httpx.post(f.url + "/v1/completions", content=BODY).status_code == 200


def test_a_reply_made_after_its_client_left_is_dropped_and_counted_not_logged(monkeypatch, caplog) -> None:
    """A cancel can be lost (3.11's wait_for drops one that comes with its result): the reply is then
    ready for a connection that is gone, and must be dropped quietly, not written."""
    import asyncio
    import logging

    from starlette.responses import Response

    from cadencerl.router import datapath

    async def deaf(*args) -> Response:           # the lost cancel, made certain
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)
        return Response(b"{}", media_type="application/json")

    monkeypatch.setattr(datapath, "serve_routed", deaf)
    caplog.set_level(logging.ERROR, logger="cadencerl.router")
    with Fleet(stubs=1) as f:
        u = urlsplit(f.url)
        with socket.create_connection((u.hostname, u.port), timeout=5) as sock:
            sock.sendall(_post("/v1/completions", BODY))
            time.sleep(0.1)
        metric = 'cadencerl_router_errors_total{kind="client_disconnect"} 1.0'
        assert settle(lambda: metric in httpx.get(f.url + "/metrics").text)
        time.sleep(0.3)
        assert not [r for r in caplog.records if "unhandled" in r.getMessage()]
