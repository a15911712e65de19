"""`cadencerl router --journal` killed with SIGKILL between turns of multi-turn sessions and
started again on its journal: every session's next turn goes to the worker that served its earlier
turns (its prefix cache), and the sessions end there. Stub upstreams on 127.0.0.1, the router in
its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from router_process import stop
from router_stub import FAST, StubState, stub_app
from server_thread import ServerThread

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 8


def start_router(urls: list[str], journal: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(urls),
                             "--port", "0", "--journal", str(journal), "--session-ttl", "600",
                             "--balance-abs-threshold", "0", "--balance-rel-threshold", "1"],   # spread new sessions
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    found = re.search(r"listening on (http://\S+?),", line)
    assert found, line
    deadline = time.monotonic() + 30
    while True:          # bound at the line, listening once uvicorn started
        try:
            if httpx.get(f"{found.group(1)}/health", timeout=2).status_code == 200:
                return proc, found.group(1)
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "the router did not start"
        time.sleep(0.1)


def turn(client: httpx.Client, session: str, prompt: list[int], end: bool = False) -> str:
    headers = {"X-Session-Id": session, "X-Workload-Class": "agent", **({"X-Session-End": "1"} if end else {})}
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 4}, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-cadencerl-worker"]


def test_sigkill_between_turns_then_restart_keeps_every_session_on_its_worker(tmp_path: Path) -> None:
    journal = tmp_path / "router.journal"
    states = [StubState(f"stub{i}") for i in range(2)]
    stubs = [ServerThread(stub_app(s), name=s.name, **FAST).start() for s in states]
    procs = []
    try:
        proc, url = start_router([s.url for s in stubs], journal)
        procs.append(proc)
        prompts = {f"s{i}": [i + 1] * (16 + 8 * i) for i in range(SESSIONS)}
        for s in states:
            s.token_delay_s = 0.05      # the first turns overlap, so the load spreads them
        with httpx.Client(base_url=url, timeout=20) as c, ThreadPoolExecutor(SESSIONS) as pool:
            homes = dict(zip(prompts, pool.map(lambda kp: turn(c, *kp), prompts.items())))
        for s in states:
            s.token_delay_s = 0.0
        assert len(set(homes.values())) == 2, homes      # spread over both: a lost home would show
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, url = start_router([s.url for s in stubs], journal)
        procs.append(proc)
        with httpx.Client(base_url=url, timeout=20) as c:
            for k, p in prompts.items():
                assert turn(c, k, p + [7] * 12) == homes[k], f"session {k} left its worker after the restart"
            for k, p in prompts.items():
                assert turn(c, k, p + [7] * 24, end=True) == homes[k]
            deadline = time.monotonic() + 5       # the gauges follow on the router's poll
            while True:
                metrics = c.get("/metrics").text
                homed = [x for x in metrics.splitlines() if x.startswith("cadencerl_router_worker_sessions{")]
                clean = "cadencerl_router_parked_sessions 0.0" in metrics and len(homed) == 2 and all(
                    x.endswith(" 0.0") for x in homed)
                if clean or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert clean and 'completed_sessions{workload_class="agent"} 8.0' in metrics, "not every session ended: " + "; ".join(
            x for x in metrics.splitlines() if "sessions" in x and not x.startswith("#"))
    finally:
        for p in procs:
            stop(p, wait_s=10)
        for s in stubs:
            s.stop()
