"""A connection with no request open is closed after `CADENCERL_KEEP_ALIVE_S` with nothing sent
(30 s unless set; here 1 s), on either data path: one never used, and one after its reply. A
request open longer than that (a reply slower than the bound) is not cut."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from router_process import start_router, stop
from router_stub import FAST, StubState, stub_app
from server_thread import ServerThread

from cadencerl.router.rust_path import available

pytestmark = pytest.mark.timeout(90)
PATHS = ["python", pytest.param("rust", marks=pytest.mark.skipif(not available(), reason="not built (make router-native)"))]
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s")


def closed_after(sock: socket.socket) -> float:
    """Seconds until the router closes `sock` (read to its end)."""
    start = time.monotonic()
    sock.settimeout(10)
    while sock.recv(65536):
        pass
    return time.monotonic() - start


@pytest.mark.parametrize("data_path", PATHS)
def test_an_idle_connection_is_closed_and_an_open_request_is_not(data_path, monkeypatch) -> None:
    state = StubState("slow")
    server = ServerThread(stub_app(state), name="slow", **FAST).start()
    monkeypatch.setenv("CADENCERL_KEEP_ALIVE_S", "1")
    proc, url = start_router([server.url], "--data-path", data_path, "--policy", "cache-aware")
    address = (urlsplit(url).hostname, urlsplit(url).port)
    try:
        with socket.create_connection(address) as never_used:
            assert 0.8 < closed_after(never_used) < 5
        with socket.create_connection(address) as used:
            body = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'
            used.sendall(REQUEST % (len(body), body))
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                reply += used.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200")
            assert 0.8 < closed_after(used) < 5
        state.token_delay_s = 0.4             # 6 tokens: 2.4 s, past the bound, streamed and not
        with httpx.Client(base_url=url, timeout=20) as client:
            for stream in (True, False):
                with client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 6,
                                                                     "stream": stream}) as r:
                    text = r.read().decode()
                assert r.status_code == 200 and (text.rstrip().endswith("[DONE]") if stream else '"usage"' in text)
    finally:
        stop(proc)
        server.stop()
