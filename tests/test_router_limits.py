"""`router/limits.py`: a request head too large, with too many headers, or too slow, or a body that
stalls, is refused (431, 408) and its connection closed; ordinary requests on a kept-alive
connection, and a slow body that keeps sending, are not touched."""

from __future__ import annotations

import socket
import time

import pytest
from server_thread import ServerThread

from cadencerl.router import limits
from cadencerl.router.limits import LimitedHttpToolsProtocol

pytestmark = pytest.mark.timeout(60)


async def ok_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server():
    s = ServerThread(ok_app, name="limits", loop="uvloop", http=LimitedHttpToolsProtocol, lifespan="off").start()
    yield s
    s.stop()


def _exchange(server: ServerThread, *pieces: bytes, pause_s: float = 0.0) -> bytes:
    """Send the pieces (pausing between them), then read until the server closes or 3 s pass."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(pause_s)
        except OSError:          # the server refused and closed while we were still sending
            pass
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def test_ordinary_requests_on_one_connection_pass(server) -> None:
    get = b"GET / HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 4000 + b"\r\n\r\n"
    out = _exchange(server, get, get + get[:-2] + b"connection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200") == 3


def test_a_huge_head_is_refused_with_431_before_it_is_read(server) -> None:
    big = [b"GET / HTTP/1.1\r\nhost: x\r\nx-big: "] + [b"a" * 65536] * 64     # 4 MiB of one header
    out = _exchange(server, *big)
    assert out.startswith(b"HTTP/1.1 431") and out.count(b"HTTP/1.1") == 1


def test_too_many_headers_are_refused_with_431(server) -> None:
    head = b"GET / HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: 1\r\n" % i for i in range(150)) + b"\r\n"
    out = _exchange(server, head)
    assert out.startswith(b"HTTP/1.1 431") and out.count(b"HTTP/1.1") == 1


def test_a_head_sent_too_slowly_is_closed_with_408(server, monkeypatch) -> None:
    monkeypatch.setattr(limits, "READ_TIMEOUT_S", 0.5)
    out = _exchange(server, b"GET / HTTP/1.1\r\n", b"host: x\r\n", b"x-a: 1\r\n", b"x-b: 1\r\n", pause_s=0.3)
    assert out.startswith(b"HTTP/1.1 408")


def test_a_body_that_stalls_is_closed_with_408_and_one_that_keeps_sending_is_not(server, monkeypatch) -> None:
    monkeypatch.setattr(limits, "READ_TIMEOUT_S", 0.5)
    head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\n\r\n"
    out = _exchange(server, head + b"ab", b"", pause_s=1.0)
    assert out.startswith(b"HTTP/1.1 408") and b"body" in out
    out = _exchange(server, head, *[b"ab"] * 3, b"ab" + head.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"),
                    *[b"ab"] * 4, pause_s=0.3)      # 2.7 s in all, 0.3 s between reads
    assert out.count(b"HTTP/1.1 200") == 2


async def early_app(scope, receive, send) -> None:
    """Answers before reading the request's body (a 404, a refusal)."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def test_a_body_left_unread_after_the_reply_cannot_hold_the_connection(monkeypatch) -> None:
    """uvicorn arms no keep-alive timer while the rest of such a body arrives: the body's bound closes it."""
    monkeypatch.setattr(limits, "READ_TIMEOUT_S", 0.5)
    s = ServerThread(early_app, name="early", loop="uvloop", http=LimitedHttpToolsProtocol, lifespan="off").start()
    try:
        start = time.monotonic()
        out = _exchange(s, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab", b"c", pause_s=0.2)
        assert out.startswith(b"HTTP/1.1 404") and b"408" not in out
        assert time.monotonic() - start < 2.5        # closed, not held until the read gives up at 3 s
    finally:
        s.stop()
