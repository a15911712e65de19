"""A connection's time bounds, on either data path. One with no request open is closed after
`CADENCERL_KEEP_ALIVE_S` with nothing sent (30 s unless set; here 1 s): one never used, and one
after its reply. A request open longer than that (a reply slower than the bound), or a reply its
client reads only later than that, is not cut. A body that sends nothing for
`CADENCERL_READ_TIMEOUT_S` gets a 408, and nothing of it is admitted; one that keeps sending passes; a
head not whole that long after its first byte gets a 408 too.
A bad value is a one-line error naming it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest
from router_process import ROOT, start_router, stop
from router_stub import FAST, StubState, stub_app
from server_thread import ServerThread

from cadencerl.router.settings import rust_data_path_built

pytestmark = pytest.mark.timeout(90)
PATHS = ["python", pytest.param("rust", marks=pytest.mark.skipif(not rust_data_path_built(), reason="not built (make router-native)"))]
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


@pytest.mark.parametrize("data_path", PATHS)
def test_a_reply_read_late_is_whole(data_path, monkeypatch) -> None:
    """20 MB of reply, more than the sockets buffer, read 2.5 s after the request: the reply's
    request has ended on the router, but its bytes wait on the client, so the connection stays."""
    server = ServerThread(stub_app(StubState("big")), name="big", **FAST).start()
    monkeypatch.setenv("CADENCERL_KEEP_ALIVE_S", "1")
    proc, url = start_router([server.url], "--data-path", data_path, "--policy", "cache-aware")
    conn = http.client.HTTPConnection(urlsplit(url).hostname, urlsplit(url).port, timeout=20)
    try:
        tokens = 10_000_000                 # the stub's text is " t" a token
        conn.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": "hi", "max_tokens": tokens}),
                     {"content-type": "application/json"})
        time.sleep(2.5)
        reply = conn.getresponse()
        assert reply.status == 200
        assert len(json.loads(reply.read())["choices"][0]["text"]) == 2 * tokens
    finally:
        conn.close()
        stop(proc)
        server.stop()


@pytest.mark.parametrize("data_path", PATHS)
def test_a_body_that_stalls_gets_408_and_one_that_keeps_sending_passes(data_path, monkeypatch) -> None:
    server = ServerThread(stub_app(StubState("paced")), name="paced", **FAST).start()
    monkeypatch.setenv("CADENCERL_READ_TIMEOUT_S", "1")
    proc, url = start_router([server.url], "--data-path", data_path, "--policy", "misa+cache-aware")
    address = (urlsplit(url).hostname, urlsplit(url).port)
    body = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'
    try:
        for path in (b"/v1/completions", b"/v1/responses"):    # a generating route, and the router's own app's
            with socket.create_connection(address) as stalled:
                stalled.sendall(REQUEST.replace(b"/v1/completions", path) % (len(body), body[:10]))
                start = time.monotonic()
                reply = read_to_close(stalled)
                assert reply.startswith(b"HTTP/1.1 408") and b"the request body sent nothing within 1 s" in reply, reply
                assert 0.8 < time.monotonic() - start < 5
        lines = [b"POST /v1/completions HTTP/1.1\r\n", b"host: x\r\n"] + [b"x-%d: 1\r\n" % i for i in range(6)]
        for sent, pause in ((lines, 0.3), (lines[:2], 0.0)):    # a line at a time (2.4 s); one that stops halfway
            with socket.create_connection(address) as slow:
                start = time.monotonic()
                with contextlib.suppress(OSError):     # refused and closed while we were still sending
                    for line in sent:
                        slow.sendall(line)
                        time.sleep(pause)
                reply = read_to_close(slow)
                assert reply.startswith(b"HTTP/1.1 408") and b"the request head did not arrive within 1 s" in reply, reply
                assert 0.8 < time.monotonic() - start < 5
        with socket.create_connection(address) as paced:        # 1.8 s in all, never 1 s without a byte
            paced.sendall(REQUEST % (len(body), b""))
            for i in range(0, len(body), 8):
                time.sleep(0.3)
                paced.sendall(body[i:i + 8])
            paced.settimeout(10)
            reply = paced.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply
        metrics = httpx.get(f"{url}/metrics").text
        assert admitted(metrics) == 1 and "cadencerl_router_hold_depth 0.0" in metrics
        # the two stalled bodies, counted alike on both paths (a head that never came is no request)
        assert 'cadencerl_router_errors_total{kind="client_disconnect"} 2.0' in metrics, metrics
    finally:
        stop(proc)
        server.stop()


def read_to_close(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def admitted(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("cadencerl_router_admissions_total"))


@pytest.mark.parametrize("name", ["CADENCERL_KEEP_ALIVE_S", "CADENCERL_READ_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_a_bad_time_bound_is_a_one_line_error_naming_it(name, value) -> None:
    done = subprocess.run([sys.executable, "-m", "cadencerl.cli", "router", "--workers", "http://127.0.0.1:9",
                           "--port", "0"], env={**os.environ, name: value, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert name in done.stderr and "Traceback" not in done.stderr, done.stderr
