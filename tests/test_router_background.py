"""`background: true` Responses requests: answered at once, generated after; the router keeps the
session placed (in the server's load, in MISA-T's count) until the response is final."""

from __future__ import annotations

import time

import httpx
import pytest

from cadencerl.core.trajectory import State
from cadencerl.router.background import running_id
from router_stub import Fleet, settle

pytestmark = pytest.mark.timeout(60)
BACKGROUND = {"model": "tiny", "input": "x" * 400, "max_output_tokens": 10, "background": True}   # 100 in, 10 out


def _placed(f: Fleet) -> list[int]:
    """The tokens generated so far by each session placed on a server."""
    return [s.traj.generated for s in list(f.service.state.live.values()) if s.traj.state is State.RESIDENT]


def test_a_background_response_holds_its_place_until_it_is_generated() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.1                  # generated in 1 s
        t0 = time.monotonic()
        r = c.post("/v1/responses", json=BACKGROUND)
        assert r.status_code == 200 and r.json()["status"] == "queued" and time.monotonic() - t0 < 0.8
        rid = r.json()["id"]
        assert _placed(f) == [0] and f.service.state.workers[0].load == 1, "still placed while generated"
        assert settle(lambda: not _placed(f), timeout_s=5)
        assert f.service.state.completed["agent"] == 1 and f.service.state.workers[0].load == 0
        assert f.service.owners.context(rid) == 110, "the server's usage once final: 100 in, 10 out"
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
    assert not _placed(f) and not f.service._followers


def test_only_a_response_still_running_is_followed() -> None:
    assert running_id(b'{"id": "resp_1", "status": "queued"}') == "resp_1"
    assert running_id(b'{"id": "resp_1", "status": "in_progress"}') == "resp_1"
    for body in (b'{"id": "resp_1", "status": "completed"}', b'{"status": "queued"}', b"not json", b"[1]"):
        assert running_id(body) is None
