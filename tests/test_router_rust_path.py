"""`cadencerl router --data-path rust`: the port served in Rust, the decisions the router's own.

The router runs as a user starts it (its own process) in front of stub servers in this process.
The same sequence of requests through either data path leaves the same books (admissions, parked
sessions and their KV, which counts the tokens each reply generated, errors), and the Rust path
keeps what the Python one does: a retry before the first token, an error event when a stream
breaks, a client that leaves releasing its request, the limits on heads and bodies. Skipped where
`make router-native` could not build it (it says why).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import subprocess
import sys
import time

import httpx
import pytest
from router_process import ROOT, start_router, stop
from router_stub import FAST, StubState, stub_app
from server_thread import ServerThread

from cadencerl.router import settings as settings_module
from cadencerl.router.settings import RouterSettings, rust_data_path_built

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not rust_data_path_built(), reason="the Rust data path is not built (make router-native)")]
BOOKS = ("requests_total", "admissions_total", "completed_sessions", "parked_sessions", "worker_held_kv_usage",
         "worker_load", "worker_sessions", "errors_total", "rejections_total", "retries_total")


@pytest.fixture
def stub_states():
    states = [StubState(f"stub{i}") for i in range(2)]
    servers = [ServerThread(stub_app(s), name=s.name, **FAST).start() for s in states]
    yield states, [s.url for s in servers]
    for s in servers:
        s.stop()


@contextlib.contextmanager
def serving(urls: list[str], *options: str):
    """A router started as a user starts it (`--data-path rust` unless `options` say otherwise), and a client."""
    proc, url = start_router(urls, "--data-path", "rust", *options)
    try:
        with httpx.Client(base_url=url, timeout=20) as client:
            yield client
    finally:
        stop(proc)


def books(client: httpx.Client) -> dict[str, float]:
    """The router's counts of what it admitted, parked, finished and refused (no times)."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        name = name.removeprefix("cadencerl_router_")
        if name.split("{")[0] in BOOKS:
            out[name] = float(value)
    return out


def settle(client: httpx.Client) -> None:
    """Until no request is in flight (a release reaches the decisions as the reply ends)."""
    deadline = time.monotonic() + 10
    while sum(float(n) for n in re.findall(r"cadencerl_router_worker_load\{[^}]*\} (\S+)",
                                           client.get("/metrics").text)) and time.monotonic() < deadline:
        time.sleep(0.05)


def sequence(client: httpx.Client) -> list[tuple[int, str]]:
    """Plain and streamed requests, three sessions (one parked after a JSON reply, one after a stream,
    one ended), two bad ones."""
    def post(body: dict, headers: dict | None = None, content: bytes | None = None) -> tuple[int, str]:
        r = client.post("/v1/completions", json=None if content else {"model": "m", **body}, content=content,
                        headers=headers or {})
        settle(client)
        return r.status_code, r.text
    return [post({"prompt": "one", "max_tokens": 5}),
            post({"prompt": "two", "max_tokens": 7, "stream": True}),
            post({"prompt": "session one", "max_tokens": 4}, {"X-Session-Id": "s1"}),
            post({"prompt": "session two", "max_tokens": 9, "stream": True}, {"X-Session-Id": "s2"}),
            post({"prompt": "session three", "max_tokens": 6}, {"X-Session-Id": "s3"}),
            post({"prompt": "session three, again", "max_tokens": 3}, {"X-Session-Id": "s3", "X-Session-End": "1"}),
            post({"max_tokens": 3}),
            post({}, {"Content-Type": "text/plain"}, b"hello")]


def test_the_same_sequence_leaves_the_same_books_on_either_data_path(stub_states):
    _, urls = stub_states
    seen = {}
    for path in ("python", "rust"):
        with serving(urls, "--data-path", path) as client:
            replies = sequence(client)
            seen[path] = (books(client), [status for status, _ in replies], replies)
    (python, py_status, py_replies), (rust, rust_status, rust_replies) = seen["python"], seen["rust"]
    assert py_status == rust_status == [200, 200, 200, 200, 200, 200, 400, 415]
    assert rust == python       # the parked sessions' KV counts the tokens each reply generated
    assert rust["parked_sessions"] == 2 and rust['completed_sessions{workload_class="agent"}'] == 3
    assert sum(v for k, v in rust.items() if k.startswith("worker_held_kv_usage")) > 0
    assert json.loads(rust_replies[6][1])["error"]["param"] == json.loads(py_replies[6][1])["error"]["param"]
    assert rust_replies[1][1].endswith("data: [DONE]\n\n") and rust_replies[1][1].count("data: ") == 8


def test_a_dead_server_is_retried_on_another_before_the_first_byte(stub_states):
    _, urls = stub_states
    doomed = ServerThread(stub_app(StubState("doomed")), name="doomed", **FAST).start()
    # No health poll in the test's time: the stopped server is found by the requests themselves.
    with serving([doomed.url, urls[0]], "--policy", "round-robin", "--poll-interval-secs", "60") as client:
        doomed.stop()
        statuses = [client.post("/v1/completions", json={"model": "m", "prompt": f"p{i}", "max_tokens": 2}
                                ).status_code for i in range(6)]
        settle(client)
        found = books(client)
    assert statuses == [200] * 6
    assert found["retries_total"] >= 1 and found['errors_total{kind="connect"}'] >= 1
    assert found['worker_load{worker="%s"}' % urls[0]] == 0


def test_a_broken_stream_ends_with_an_error_event_and_is_released(stub_states):
    states, urls = stub_states
    for s in states:
        s.break_after = 3
    with serving(urls) as client:
        r = client.post("/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 8, "stream": True})
        settle(client)
        load = books(client)
    events = [e for e in r.text.split("\n\n") if e]
    assert len(events) == 5 and events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["type"] == "upstream_error"
    assert not any(v for k, v in load.items() if k.startswith("worker_load"))
    assert load['errors_total{kind="midstream"}'] == 1


def test_a_client_that_leaves_mid_stream_releases_its_request(stub_states):
    states, urls = stub_states
    for s in states:
        s.token_delay_s = 0.05
    with serving(urls) as client:
        with client.stream("POST", "/v1/completions",
                           json={"model": "m", "prompt": "p", "max_tokens": 200, "stream": True}) as r:
            next(r.iter_bytes())
        settle(client)
        load = books(client)
    assert not any(v for k, v in load.items() if k.startswith("worker_load"))
    assert load['completed_sessions{workload_class="agent"}'] == 1


def test_limits_on_the_head_and_the_body_and_the_other_routes(stub_states):
    _, urls = stub_states
    with serving(urls, "--max-payload-size", "1000") as client:
        big = client.post("/v1/completions", json={"model": "m", "prompt": "x" * 2000})
        head = client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={"X-Big": "y" * 70_000})
        models = client.get("/v1/models")
        found = books(client)
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    assert found['errors_total{kind="bad_request"}'] == 1
    assert head.status_code == 431
    assert models.status_code == 200 and models.json()["data"]


def test_bad_data_path_options_are_one_line_errors():
    for extra, says in ((["--data-path", "go"], "data_path"), (["--data-path", "rust", "--processes", "2"], "data_path")):
        out = subprocess.run([sys.executable, "-m", "cadencerl.cli", "router", "--workers", "http://127.0.0.1:9",
                              *extra], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("built, processes, chosen", [(True, 1, "rust"), (True, 2, "python"), (False, 1, "python")])
def test_auto_takes_the_rust_path_where_it_is_built_and_serves_alone(monkeypatch, built, processes, chosen):
    monkeypatch.setattr(settings_module, "rust_data_path_built", lambda: built)
    assert RouterSettings(workers=["http://127.0.0.1:9"], processes=processes).data_path == chosen
    assert RouterSettings(workers=["http://127.0.0.1:9"], data_path="python").data_path == "python"


def test_a_server_slower_than_the_request_timeout_gets_a_504(stub_states):
    """No first byte within --request-timeout-secs: a 504, streamed or not (slow is not failed: not
    sent again), the session released."""
    states, urls = stub_states
    for s in states:
        s.token_delay_s = 0.4
    with serving(urls, "--request-timeout-secs", "0.3") as client:
        plain = client.post("/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 5})
        streamed = client.post("/v1/completions", json={"model": "m", "prompt": "q", "max_tokens": 5, "stream": True})
        settle(client)
        found = books(client)
    for r in (plain, streamed):
        assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_timeout"
    assert found['errors_total{kind="timeout"}'] == 2 and found["retries_total"] == 0
    assert not any(v for k, v in found.items() if k.startswith("worker_load"))


def test_a_refusal_at_entry_is_answered_under_misa(stub_states):
    """No server up: the default policy's 503 at once, on a kept-alive connection and a new one."""
    states, urls = stub_states
    doomed = ServerThread(stub_app(StubState("doomed")), name="doomed", **FAST).start()
    with serving([doomed.url], "--poll-interval-secs", "0.2") as client:
        doomed.stop()
        deadline = time.monotonic() + 10
        while any_up(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        with httpx.Client(base_url=str(client.base_url), timeout=10) as other:
            answers = [c.post("/v1/completions", json={"model": "m", "prompt": "p"}) for c in (client, other)]
    assert [a.status_code for a in answers] == [503, 503]
    assert all(a.json()["error"]["type"] == "no_worker" for a in answers)


def any_up(client: httpx.Client) -> bool:
    """Does the router count a server up?"""
    return re.search(r"cadencerl_router_worker_up\{[^}]*\} 1\.0", client.get("/metrics").text) is not None


def test_clients_leaving_at_every_stage_leave_the_in_flight_bound_whole(stub_states):
    """A placement-only policy's in-flight bound (4 here): clients that leave while waiting for a
    slot, while placed, or mid-reply give every slot back; 8 requests then all go through."""
    states, urls = stub_states
    for s in states:
        s.token_delay_s = 0.01

    async def storm(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            async def one(i: int) -> None:
                try:
                    async with asyncio.timeout((0.001, 0.02, 0.1)[i % 3]):
                        await client.post("/v1/completions", json={"model": "m", "prompt": f"p{i}", "max_tokens": 20,
                                                                   "stream": i % 2 == 0})
                except (TimeoutError, httpx.HTTPError):
                    pass
            await asyncio.gather(*(one(i) for i in range(120)))

    with serving(urls, "--policy", "cache-aware", "--max-concurrent-requests", "4", "--hold-timeout", "3") as client:
        asyncio.run(storm(str(client.base_url)))
        settle(client)
        for s in states:
            s.token_delay_s = 0.0
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: client.post("/v1/completions", json={"model": "m", "prompt": f"q{i}",
                                                                                     "max_tokens": 2}).status_code,
                                     range(8)))
    assert statuses == [200] * 8
