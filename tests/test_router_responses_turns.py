"""A Responses turn that continues a stored response, as the router sizes it: the context the server
holds for that response (its usage, else the router's own count) plus the new input, with a session
key or without; and a Responses stream that breaks midway, ended with the Responses API's own
streaming error event (a completions stream keeps `data: {"error": ...}` and `data: [DONE]`)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from router_stub import Fleet, settle

from cadencerl.core.trajectory import State

pytestmark = pytest.mark.timeout(60)

FIRST = {"model": "tiny", "input": "x" * 400, "max_output_tokens": 20}     # 100 tokens in, 20 out
NEXT = {"model": "tiny", "input": "y" * 40, "max_output_tokens": 20}       # 10 new tokens


def sse(text: str) -> list[tuple[str | None, str]]:
    """The events of an SSE body as a client reads them (the `event:` name, the joined `data:`)."""
    out, kind, data = [], None, []
    for line in text.split("\n"):
        if not line:
            if kind is not None or data:
                out.append((kind, "\n".join(data)))
            kind, data = None, []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return out


def _ask(c: httpx.Client, body: dict, stream: bool, headers: dict) -> str:
    r = c.post("/v1/responses", json={**body, "stream": stream}, headers=headers)
    assert r.status_code == 200, r.text
    return json.loads(sse(r.text)[0][1])["response"]["id"] if stream else r.json()["id"]


def _in_flight(f: Fleet) -> list[int]:
    return [s.traj.context for s in list(f.service.state.live.values()) if s.traj.state is State.RESIDENT]


@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("session", [None, "s"])
def test_a_continuing_turn_is_sized_by_the_context_the_server_holds_plus_its_input(
        session: str | None, stream: bool, usage: bool) -> None:
    """The server holds the first turn's 120 tokens (usage: 100 in, 20 out; without usage, what the
    router counted: its 100-token prompt and, streaming, 20 deltas; a JSON body without usage shows
    no tokens generated). The next turn's trajectory is that plus its 10 new tokens, for MISA-T's KV
    accounting as for the fit check; with a session key, the session's own context (counted once)."""
    headers = {"X-Session-Id": session} if session else {}
    with Fleet(stubs=1, session_ttl_s=30) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].usage = usage
        rid = _ask(c, FIRST, stream, headers)
        held = 120 if usage or stream else 100
        assert settle(lambda: f.service.owners.context(rid) == held), f.service.owners.context(rid)
        f.states[0].token_delay_s = 0.05
        done: list[str] = []
        with httpx.Client(base_url=f.url, timeout=10) as c2:
            turn = threading.Thread(target=lambda: done.append(_ask(c2, {**NEXT, "previous_response_id": rid},
                                                                    stream, headers)))
            turn.start()
            assert settle(lambda: len(_in_flight(f)) == 1)
            expected = held + 10 if session is None else 100 + (20 if usage or stream else 0) + 10
            assert _in_flight(f) == [expected], "the held context and the new input, counted once"
            turn.join()
        if usage:
            assert settle(lambda: f.service.owners.context(done[0]) == 150), "the server's count: 130 in, 20 out"
        else:
            assert settle(lambda: f.service.owners.context(done[0]) == expected + (20 if stream else 0))


@pytest.mark.parametrize("session", [None, "s"])
def test_a_continuing_turn_its_server_cannot_hold_in_all_is_a_400_naming_input(session: str | None) -> None:
    """10 new tokens fit a 128-token KV; with the 120 the server holds for the response they do not.
    Refused on arrival: it used to wait for the next poll of the servers (here 5 s)."""
    headers = {"X-Session-Id": session} if session else {}
    with Fleet(stubs=1, kv_capacity=128, session_ttl_s=30, metrics_interval_s=5.0) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        rid = _ask(c, FIRST, False, headers)
        served = sum(f.states[0].served.values())
        t0 = time.monotonic()
        r = c.post("/v1/responses", json={**NEXT, "previous_response_id": rid}, headers=headers)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "input" and "about 130 tokens" in err["message"], r.text
        assert time.monotonic() - t0 < 2.0
        assert 'cadencerl_router_errors_total{kind="bad_request"} 1.0' in c.get("/metrics").text
        assert sum(f.states[0].served.values()) == served, "never sent"
        assert not f.service.state.hold and not f.service.state.pending
        r = c.post("/v1/responses", json={**NEXT, "input": "z", "previous_response_id": rid}, headers=headers)
        assert r.status_code == 200, "121 tokens fit"


@pytest.mark.parametrize("cut_event", [None, 20, -1])
def test_a_responses_stream_broken_midway_ends_with_the_responses_error_event(cut_event: int | None) -> None:
    """vLLM numbers a Responses stream's events from 0 and sends no `data: [DONE]`; the OpenAI
    client's `responses.stream()` reads an `event: error` whose data is a `ResponseErrorEvent`.
    A stream that breaks inside an event: the part sent is not relayed (the client would read it
    and the error event as one event whose data parses as neither), nor numbered: the error event
    follows the last event the client got."""
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].break_after = 3         # response.created and two deltas, then the stream breaks
        f.states[0].cut_event = cut_event
        r = c.post("/v1/responses", json={**FIRST, "stream": True})
        events = sse(r.text)
        assert r.status_code == 200 and [k for k, _ in events] == ["response.created"] + \
            ["response.output_text.delta"] * 2 + ["error"], r.text
        error = json.loads(events[-1][1])
        assert error == {"type": "error", "code": "upstream_error", "param": None, "sequence_number": 3,
                         "message": "the upstream stream broke: RemoteProtocolError"}
        assert "[DONE]" not in r.text and "\"error\": {" not in r.text
        assert 'cadencerl_router_errors_total{kind="midstream"} 1.0' in c.get("/metrics").text
        # a completions stream that breaks keeps its own ending
        r = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 10, "stream": True})
        events = sse(r.text)
        assert [k for k, _ in events] == [None] * 5 and events[-1][1] == "[DONE]"
        assert json.loads(events[-2][1])["error"]["type"] == "upstream_error"
