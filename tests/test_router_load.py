"""A bounded load test: 1,000 concurrent agentic sessions of three turns each through the router
(MISA-T in front of cache-aware) to two stub upstreams on 127.0.0.1.

Every request is answered exactly once (and reaches an upstream exactly once), no session is lost,
the router's session state returns to empty after each wave (it does not grow with completed
sessions; the prefix tree stays under its size bound), and /health answers throughout.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from router_stub import Fleet

pytestmark = pytest.mark.timeout(480)

SESSIONS = 1000
TURNS = 3
TREE_TOKENS = 4096


async def _session(c: httpx.AsyncClient, wave: int, i: int, answers: dict) -> None:
    """One agentic session: three turns, each prompt the last one plus its reply and a tool result."""
    prompt = [i % 97] * 16 + [wave, i]
    for turn in range(TURNS):
        rid = f"{wave}-{i}-{turn}"
        headers = {"X-Session-Id": f"{wave}-{i}", "X-Workload-Class": "agent", "X-Request-Id": rid}
        if turn == TURNS - 1:
            headers["X-Session-End"] = "1"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "stream": turn == 1}
        r = await c.post("/v1/completions", json=body, headers=headers)
        answers[rid] = answers.get(rid, 0) + 1
        assert r.status_code == 200, r.text
        if turn == 1:
            assert r.text.rstrip().endswith("data: [DONE]")
        prompt = prompt + [7] * 4 + [3] * 8       # the reply, then a tool observation
        await asyncio.sleep(0.01 * (i % 5))       # the tool call


async def _watch_health(c: httpx.AsyncClient, stop: asyncio.Event, seen: list) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        r = await c.get("/health")
        seen.append((r.status_code, time.monotonic() - t0))
        await asyncio.sleep(0.05)


async def _wave(url: str, wave: int, sessions: int, answers: dict, health: list) -> None:
    """The sessions spread over several clients: httpx's pool scans all its connections per request."""
    per_client = 40
    clients = [httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=per_client))
               for _ in range(-(-sessions // per_client))]
    async with httpx.AsyncClient(base_url=url, timeout=30) as h:
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_health(h, stop, health))
        try:
            await asyncio.gather(*(_session(clients[i // per_client], wave, i, answers) for i in range(sessions)))
        finally:
            stop.set()
            await watcher
            await asyncio.gather(*(c.aclose() for c in clients))


def _state_sizes(svc) -> dict:
    st = svc.state
    return {"live": len(st.live), "keys": len(st.by_key), "parked": len(st.parked), "held": len(st.hold),
            "pending": len(st.pending), "waiters": len(svc.waiters),
            "in_flight": sum(w.load for w in st.workers), "sessions": sum(w.sessions for w in st.workers),
            "active": sum(st.active_by_class.values())}


def test_a_thousand_concurrent_sessions() -> None:
    # Router, stubs and 1,000 client sessions share one process (one GIL) here: on a starved CI
    # machine a /metrics scrape can take seconds. Health detection is not what this test measures
    # (test_a_dead_server_is_taken_out_and_its_sessions_move does), so a server counts as down only after ~10 s of failed scrapes.
    # A starved client may send a next turn late: no parked session ends early here (contended TTL as the hold's).
    with Fleet(hold_timeout_s=120, max_tree_size=TREE_TOKENS, eviction_interval_s=0.5,
               metrics_interval_s=1.0, failures_to_down=5, contended_ttl_s=120) as f:
        svc = f.service
        answers: dict[str, int] = {}
        health: list = []
        sizes = []
        waves = (SESSIONS, SESSIONS // 4)     # the second, smaller one: does state grow with finished sessions?
        for wave, sessions in enumerate(waves):
            asyncio.run(_wave(f.url, wave, sessions, answers, health))
            sizes.append(_state_sizes(svc))
        assert len(answers) == sum(waves) * TURNS and set(answers.values()) == {1}
        served = sum((s.served for s in f.states), start=type(f.states[0].served)())
        assert len(served) == len(answers) and set(served.values()) == {1}
        assert sum(svc.state.completed.values()) == sum(waves)
        assert sizes[0] == sizes[1] == dict.fromkeys(sizes[0], 0)
        time.sleep(0.7)   # one more eviction pass of the prefix tree
        tree = svc.state.policy.inner._tree
        f.service.decide()
        assert all(t.size <= TREE_TOKENS for t in tree.tenants)
        assert all(len(g) <= 4096 for g in svc.groups_seen)
        assert health and all(code == 200 for code, _ in health)
