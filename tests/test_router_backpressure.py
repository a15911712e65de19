"""`router/backpressure.py`: under a placement-only policy, requests past the in-flight bound wait in a
bounded FIFO queue, a bounded time; the rest get 429 with Retry-After; MISA-T keeps its own HOLD."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from router_stub import Fleet, settle

from cadencerl.router.backpressure import InFlightLimit
from cadencerl.router.rejections import Rejected

pytestmark = pytest.mark.timeout(60)

TOKENS = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}


def _limit(limit: int, hold_max: int = 2, hold_timeout_s: float = 5.0, up: bool = True) -> InFlightLimit:
    counter = SimpleNamespace(inc=lambda: None)
    svc = SimpleNamespace(settings=SimpleNamespace(hold_max=hold_max, hold_timeout_s=hold_timeout_s),
                          upstreams=[SimpleNamespace(routable=up)], state=SimpleNamespace(
                              workers=[SimpleNamespace(max_num_seqs=3)]),
                          metrics=SimpleNamespace(rejections=SimpleNamespace(labels=lambda reason: counter)),
                          retry_after=lambda: 7)
    return InFlightLimit(svc, limit)


def test_waiters_are_served_in_arrival_order_and_the_queue_is_bounded() -> None:
    async def run() -> None:
        lim = _limit(1, hold_max=2)
        await lim.enter()
        order = []

        async def wait(name: str) -> None:
            await lim.enter()
            order.append(name)

        a, b = asyncio.create_task(wait("a")), asyncio.create_task(wait("b"))
        await asyncio.sleep(0)
        with pytest.raises(Rejected) as refused:
            await lim.enter()
        assert refused.value.status == 429 and refused.value.reason == "hold_full" and refused.value.retry_after == 7
        lim.leave()
        await a
        assert order == ["a"] and lim.in_flight == 1 and lim.depth == 1
        lim.leave()
        await b
        assert order == ["a", "b"] and lim.depth == 0
    asyncio.run(run())


def test_a_wait_past_the_timeout_is_a_429_and_a_waiter_that_leaves_gives_its_place_back() -> None:
    async def run() -> None:
        lim = _limit(1, hold_timeout_s=0.05)
        await lim.enter()
        with pytest.raises(Rejected) as late:
            await lim.enter()
        assert late.value.reason == "hold_timeout" and lim.depth == 0
        gone = asyncio.create_task(lim.enter())
        await asyncio.sleep(0)
        lim.leave()             # the slot is handed to the waiter ...
        gone.cancel()           # ... which left before it ran: the slot comes back
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert lim.in_flight == 0 and lim.depth == 0
    asyncio.run(run())


def test_the_default_bound_is_twice_the_servers_up_and_none_up_waits_for_nothing() -> None:
    assert _limit(0).capacity() == 6
    async def run() -> None:
        lim = _limit(0, up=False)
        for _ in range(10):     # placement answers these 503 at once
            await asyncio.wait_for(lim.enter(), 1)
    asyncio.run(run())


def test_past_the_bound_requests_wait_then_past_the_queue_get_429_with_retry_after() -> None:
    with Fleet(stubs=1, policy="cache-aware", max_concurrent_requests=2, hold_max=1) as f:
        f.states[0].token_delay_s = 0.6         # each completion takes about 3 s
        results: list[httpx.Response] = []

        def post() -> None:
            results.append(httpx.post(f.url + "/v1/completions", json=TOKENS, timeout=30))

        threads = [threading.Thread(target=post) for _ in range(3)]
        for t in threads:
            t.start()
        assert settle(lambda: f.states[0].running == 2 and f.app.state.limit.depth == 1, timeout_s=2.5)
        refused = httpx.post(f.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "hold_full" and refused.headers["x-request-id"]
        assert "cadencerl_router_hold_depth 1.0" in httpx.get(f.url + "/metrics").text
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [200, 200, 200], "the third waited its turn"
        assert f.app.state.limit.in_flight == 0
        assert httpx.post(f.url + "/v1/completions", json=TOKENS).status_code == 200


def test_misa_t_keeps_its_own_hold_and_is_not_bounded_twice() -> None:
    with Fleet(stubs=1) as f:
        assert f.app.state.limit is None
        start = time.monotonic()
        assert httpx.post(f.url + "/v1/completions", json=TOKENS).status_code == 200
        assert time.monotonic() - start < 10


def test_the_responses_and_generate_routes_are_within_the_same_bound() -> None:
    with Fleet(stubs=1, policy="cache-aware", max_concurrent_requests=1, hold_max=0) as f:
        f.states[0].token_delay_s = 0.3         # the completion holding the one slot takes about 1.5 s
        held = threading.Thread(target=lambda: httpx.post(f.url + "/v1/completions", json=TOKENS, timeout=30))
        held.start()
        assert settle(lambda: f.states[0].running == 1, timeout_s=2.5)
        responses = httpx.post(f.url + "/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 2})
        generate = httpx.post(f.url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        for refused in (responses, generate):
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "hold_full", refused.text
        held.join(30)
        assert settle(lambda: f.app.state.limit.in_flight == 0, timeout_s=2)
        f.states[0].token_delay_s = 0.0
        assert httpx.post(f.url + "/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 2}).status_code == 200
        assert httpx.post(f.url + "/generate", json={"input_ids": [1, 2, 3],
                                                     "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        assert f.app.state.limit.in_flight == 0
