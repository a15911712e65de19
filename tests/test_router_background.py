"""`background: true` Responses requests: answered at once, generated after; the router keeps the
session placed (in the server's load, in MISA-T's count) until the response is final."""

from __future__ import annotations

import time

import httpx
import pytest
from router_stub import Fleet, settle

from cadencerl.core.trajectory import State
from cadencerl.router.background import running_id

pytestmark = pytest.mark.timeout(60)
BACKGROUND = {"model": "tiny", "input": "x" * 400, "max_output_tokens": 10, "background": True}   # 100 in, 10 out


def _placed(f: Fleet) -> list[int]:
    """The tokens generated so far by each session placed on a server."""
    return [s.traj.generated for s in list(f.service.state.live.values()) if s.traj.state is State.RESIDENT]


def test_a_background_response_holds_its_place_until_it_is_generated() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.4                  # generated in 4 s: answered before that
        r = c.post("/v1/responses", json=BACKGROUND)
        assert r.status_code == 200 and r.json()["status"] == "queued"
        rid = r.json()["id"]
        assert _placed(f) == [0] and f.service.state.workers[0].load == 1, "still placed while generated"
        traj = next(iter(f.service.state.live.values())).traj
        assert settle(lambda: not _placed(f), timeout_s=20)
        assert f.service.state.completed["agent"] == 1 and f.service.state.workers[0].load == 0
        assert f.service.owners.context(rid) == 110, "the server's usage once final: 100 in, 10 out"
        assert traj.generated == 10, "released once, with the response's output tokens"
        assert c.get(f"/v1/responses/{rid}").json()["status"] == "completed"


def test_a_cancelled_background_response_frees_its_place() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 1.0                  # 10 s: cancelled long before
        rid = c.post("/v1/responses", json=BACKGROUND).json()["id"]
        assert _placed(f) == [0]
        assert c.post(f"/v1/responses/{rid}/cancel").json()["status"] == "cancelled"
        assert settle(lambda: not _placed(f), timeout_s=3)


def test_a_background_response_on_a_server_that_goes_down_frees_its_place() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 1.0
        assert c.post("/v1/responses", json=BACKGROUND).status_code == 200
        f.stubs[0].stop()
        assert settle(lambda: not _placed(f), timeout_s=5)
        assert not f.service.state.live, "the session ended: nothing lost, nothing left placed"


def test_a_background_session_is_released_when_the_router_stops() -> None:
    f = Fleet(stubs=1)
    with f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 1.0
        assert c.post("/v1/responses", json=BACKGROUND).status_code == 200
        assert _placed(f) == [0]
    assert not _placed(f) and len(f.service.followers) == 0


def test_only_a_response_still_running_is_followed() -> None:
    assert running_id(b'{"id": "resp_1", "status": "queued"}') == "resp_1"
    assert running_id(b'{"id": "resp_1", "status": "in_progress"}') == "resp_1"
    for body in (b'{"id": "resp_1", "status": "completed"}', b'{"status": "queued"}', b"not json", b"[1]"):
        assert running_id(body) is None


def test_a_next_turn_sent_as_the_client_sees_the_response_final_is_a_continuation() -> None:
    """The client polls the response itself and sends its next turn the moment it is final; the
    router, polling every 10 s here, has not seen it yet: the turn wakes its follower and waits for
    it, so it continues the session instead of starting a new one."""
    with Fleet(stubs=1, metrics_interval_s=10.0) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.03                 # generated in 0.3 s
        headers = {"X-Session-Id": "s"}
        rid = c.post("/v1/responses", json=BACKGROUND, headers=headers).json()["id"]
        t0 = time.monotonic()
        while c.get(f"/v1/responses/{rid}").json()["status"] != "completed":
            time.sleep(0.05)
        r = c.post("/v1/responses", json={**BACKGROUND, "background": False, "previous_response_id": rid},
                   headers=headers)
        assert r.status_code == 200 and time.monotonic() - t0 < 8.0, "woken, not waited for its next poll"
        assert 'cadencerl_router_requests_total{kind="continuation",workload_class="agent"} 1.0' in \
            c.get("/metrics").text


def test_a_background_response_the_server_forgets_or_never_ends_frees_its_place() -> None:
    with Fleet(stubs=1, request_timeout_s=1.5) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 10.0                 # never within the test: vLLM can leave one queued
        t0 = time.monotonic()                            # the deadline runs from its placement, after this
        assert c.post("/v1/responses", json=BACKGROUND).status_code == 200
        assert settle(lambda: not _placed(f), timeout_s=10) and time.monotonic() - t0 >= 1.4, "at the deadline"
        assert c.post("/v1/responses", json=BACKGROUND).status_code == 200
        f.states[0].stored.clear()                      # a restarted server knows none
        assert settle(lambda: not _placed(f), timeout_s=1)


def test_a_streamed_background_response_its_client_leaves_stays_placed_until_generated() -> None:
    """vLLM generates a background response in a task of its own: a client that stops reading its
    stream does not stop it, so the router follows it to its end as a non-streamed one."""
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.3                  # 10 tokens: 3 s
        with c.stream("POST", "/v1/responses", json={**BACKGROUND, "stream": True}) as r:
            first = next(r.iter_lines())
            assert first.startswith("event: response.created")
        # the client is gone after its first event
        time.sleep(0.5)
        assert _placed(f) == [0] and f.service.state.workers[0].load == 1, "still placed while generated"
        assert settle(lambda: not _placed(f), timeout_s=20)
        assert f.service.state.workers[0].load == 0 and f.service.state.completed["agent"] == 1


def test_a_streamed_response_its_client_leaves_is_released_when_it_is_not_background() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.3
        with c.stream("POST", "/v1/responses", json={**BACKGROUND, "stream": True, "background": False}) as r:
            next(r.iter_lines())
        assert settle(lambda: not _placed(f), timeout_s=5)
