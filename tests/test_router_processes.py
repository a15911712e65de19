"""`cadencerl router --processes N`: N processes on one port, one of them owning every decision.

The router runs in its own processes (as a user starts it) in front of two stub servers on
127.0.0.1; each request goes on a new connection, so the kernel spreads them over the processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from router_process import start_router, stop
from router_stub import FAST, StubState, stub_app
from server_thread import ServerThread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def slow_stubs():
    """Stubs that take 20 ms a token, so a long stream stays in flight while others are placed."""
    servers = [ServerThread(stub_app(StubState(f"stub{i}", token_delay_s=0.02)), name=f"stub{i}", **FAST).start()
               for i in range(2)]
    yield [s.url for s in servers]
    for s in servers:
        s.stop()


@pytest.fixture
def stubs():
    servers = [ServerThread(stub_app(StubState(f"stub{i}")), name=f"stub{i}", **FAST).start() for i in range(2)]
    yield [s.url for s in servers]
    for s in servers:
        s.stop()


def fresh_client(url: str) -> httpx.Client:
    """No kept-alive connection: every request opens its own, which any process may accept."""
    return httpx.Client(base_url=url, timeout=20, headers={"Connection": "close"})


def by_process(client: httpx.Client) -> dict[str, float]:
    found = re.findall(r'cadencerl_router_requests_by_process_total\{process="(\d+)"\} (\S+)', client.get("/metrics").text)
    return {p: float(n) for p, n in found}


def settle(client: httpx.Client, in_flight: int) -> None:
    """Wait until the owner counts `in_flight` requests: a data-path process's release reaches the
    owner over its channel, and may arrive after the client's next request (the same state before
    each decision is what makes the sequence one recorded sequence)."""
    deadline = time.monotonic() + 10
    while True:
        loads = re.findall(r'cadencerl_router_worker_load\{worker="[^"]*"\} (\S+)', client.get("/metrics").text)
        if sum(float(n) for n in loads) == in_flight:
            return
        assert time.monotonic() < deadline, (loads, in_flight)
        time.sleep(0.01)


def sequence() -> list[tuple]:
    """Sessions' first and last turns and one-turn requests, with streams opened between them and
    kept open: the load they hold makes the policy spread what follows (in order, so deterministic)."""
    asks = ([(f"s{i}", "agent" if i % 2 else "rlvr", [i + 1] * (8 + 4 * i), False) for i in range(8)]
            + [(f"s{i}", "agent" if i % 2 else "rlvr", [i + 1] * (8 + 4 * i) + [7] * 6, True) for i in range(8)]
            + [(None, "rlhf", [50 + i] * (4 + i), False) for i in range(8)])
    out: list[tuple] = []
    for i, ask in enumerate(asks):
        out.append(("ask", *ask))
        if i % 3 == 1:
            out.append(("hold", None, "rlhf", [90 + i] * 5, False))
    return out


def replay(url: str) -> list[str]:
    """The recorded sequence, one request at a time: the worker that answered each (held streams
    are read to their first event, so placed, before the next request goes)."""
    workers, held = [], []
    with fresh_client(url) as c:
        try:
            for op, key, cls, prompt, end in sequence():
                headers = {"X-Workload-Class": cls, **({"X-Session-Id": key} if key else {}),
                           **({"X-Session-End": "1"} if end else {})}
                if op == "hold":
                    held.append(c.stream("POST", "/v1/completions", headers=headers, json={
                        "model": "tiny", "prompt": prompt, "max_tokens": 5000, "stream": True}))
                    r = held[-1].__enter__()
                    chunks = r.iter_raw()
                    next(chunks)
                    held.append(chunks)     # kept: a dropped iterator closes its stream
                else:
                    r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 3},
                               headers=headers)
                assert r.status_code == 200, r.read()
                workers.append(r.headers["x-cadencerl-worker"])
                settle(c, len(held) // 2)
        finally:
            for stream in held[::2]:
                stream.__exit__(None, None, None)
    return workers


@pytest.mark.parametrize("policy", ["cache-aware", "misa+cache-aware", "round-robin"])
def test_one_and_two_processes_decide_the_same_on_one_recorded_sequence(slow_stubs, policy: str) -> None:
    spread = ["--balance-abs-threshold", "0", "--balance-rel-threshold", "1"]   # any load gap: the least loaded
    results, served = {}, {}
    for n in (1, 2):
        proc, url = start_router(slow_stubs, "--policy", policy, *spread, processes=n)
        try:
            results[n] = replay(url)
            with fresh_client(url) as c:
                served[n] = by_process(c)
        finally:
            stop(proc)
    assert 0.25 < results[1].count("1") / len(results[1]) < 0.75, results[1]   # a wrong worker would show
    assert results[2] == results[1]
    assert sum(served[2].values()) == len(results[2])
    assert served[2].get("1", 0) > 0 and served[2].get("0", 0) > 0, served[2]    # both processes served


def test_a_data_path_process_relays_every_other_route_and_counts_in_the_owners_metrics(stubs) -> None:
    proc, url = start_router(stubs, processes=2)
    try:
        with fresh_client(url) as c:
            for _ in range(12):         # each on a new connection: some on each process
                assert c.get("/health").json()["workers_up"] == 2
                assert c.get("/v1/models").status_code == 200
                r = c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": "many"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
                r = c.post("/v1/chat/completions", json={"model": "tiny", "stream": True, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
            assert c.delete("/v1/sessions/none").status_code == 404
            metrics = c.get("/metrics").text
            assert 'cadencerl_router_errors_total{kind="bad_request"} 12.0' in metrics
            placed = by_process(c)
            assert sum(placed.values()) == 12 and placed.get("1", 0) > 0, placed
    finally:
        stop(proc)


def helper_pids(owner: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(owner)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_the_data_path_processes_stop_with_their_owner_even_when_it_is_killed(stubs) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc, url = start_router(stubs, processes=3)
        helpers = helper_pids(proc.pid)
        assert len(helpers) == 2, helpers
        proc.send_signal(sig)
        proc.wait(20)
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]
                  for p in helpers):
            assert time.monotonic() < deadline, f"data-path processes outlived their owner ({sig.name})"
            time.sleep(0.1)
