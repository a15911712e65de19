"""The router over HTTP, against stub upstreams on 127.0.0.1: the OpenAI surface, sessions and
classes, bad requests, the admin token, the hold queue's 429, and the fault rules."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from router_stub import Fleet
from router_stub import settle as _settle

pytestmark = pytest.mark.timeout(60)

TOKENS = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 4}


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


def test_completions_streaming_and_not_with_token_ids_and_chat() -> None:
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/completions", json=TOKENS)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        r = c.post("/v1/completions", json={**TOKENS, "stream": True, "prompt": [[1, 2], [3, 4]]})
        events = _events(r.text)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert len(events) == 5 and events[-1] == "[DONE]" and json.loads(events[0])["choices"]
        r = c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "stream": True})
        assert r.status_code == 200 and _events(r.text)[-1] == "[DONE]"
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        assert c.get("/health").json()["workers_up"] == 2
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_admissions_total{workload_class="agent"} 3.0' in metrics
        assert "cadencerl_router_hold_depth 0.0" in metrics and "cadencerl_router_mix_dtv" in metrics


def test_a_session_sticks_to_its_worker_by_header() -> None:
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for session in ("a", "b", "c", "d"):
            prompt = list(range(10))
            seen = set()
            for turn in range(4):
                r = c.post("/v1/completions", json={**TOKENS, "prompt": prompt},
                           headers={"X-Session-Id": session, "X-Workload-Class": "agent"})
                assert r.status_code == 200
                seen.add(r.headers["x-cadencerl-worker"])
                prompt = prompt + [1] * 8
            assert len(seen) == 1
        svc = f.service
        assert len(svc.state.parked) == 4
        assert c.delete("/v1/sessions/a").status_code == 200 and len(svc.state.parked) == 3
        assert c.delete("/v1/sessions/zzz").status_code == 404
        r = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": "b", "X-Session-End": "1"})
        assert r.status_code == 200 and len(svc.state.parked) == 2
        assert 'cadencerl_router_prefix_hits_total{kind="sticky"} 13.0' in c.get("/metrics").text


def test_the_user_field_is_an_affinity_key_that_holds_no_capacity() -> None:
    # One server with max_num_seqs 1: MISA-T's cap is a few sessions; one-shot requests never park.
    with Fleet(stubs=1, hold_timeout_s=0.3, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        codes = [c.post("/v1/completions", json={**TOKENS, "user": f"u{i}"}).status_code for i in range(12)]
        assert codes == [200] * 12 and len(f.service.state.parked) == 0
    with Fleet(stubs=3, policy="consistent-hash") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        homes = {}
        for i in range(24):
            user = f"u{i % 8}"
            r = c.post("/v1/completions", json={**TOKENS, "prompt": [i + 1] * 4, "user": user})
            assert homes.setdefault(user, r.headers["x-cadencerl-worker"]) == r.headers["x-cadencerl-worker"]
        assert len(set(homes.values())) > 1


@pytest.mark.parametrize("content, headers, status, param", [
    (b"{not json", {}, 400, None),
    (b"[1, 2]", {}, 400, None),
    (b'{"model": "tiny"}', {}, 400, "prompt"),
    (b'{"prompt": [1, -2]}', {}, 400, "prompt"),
    (b'{"prompt": "x", "max_tokens": -1}', {}, 400, "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 1.5}', {}, 400, "max_tokens"),
    (b'{"prompt": "x", "stream": "yes"}', {}, 400, "stream"),
    (b'{"prompt": "x", "user": 5}', {}, 400, "user"),
    (b'{"prompt": "x"}', {"X-Workload-Class": "nope"}, 400, "x-workload-class"),
    (b'{"prompt": "' + b"x" * 5000 + b'"}', {}, 413, None),
])
def test_bad_requests_get_openai_errors_and_the_router_keeps_serving(content, headers, status, param) -> None:
    with Fleet(max_body_bytes=4096) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/completions", content=content, headers={"content-type": "application/json", **headers})
        assert r.status_code == status
        err = r.json()["error"]
        assert err["code"] == status and err["message"] and err["param"] == param
        assert c.post("/v1/chat/completions", json={"messages": []}).json()["error"]["param"] == "messages"
        assert c.get("/no/such/route").status_code == 404 and c.get("/v1/completions").status_code == 405
        assert c.post("/v1/completions", json=TOKENS).status_code == 200


@pytest.mark.parametrize("field, body", [
    ("prompt", {"prompt": "x", "stream": None, "user": None, "model": None, "max_tokens": 100.0, "n": 1e0}),
    ("messages", {"messages": [{"role": "user", "content": "x"}], "stream": None, "max_completion_tokens": 1e2}),
    ("input", {"input": "x", "store": None, "background": None, "stream": None, "max_output_tokens": 8.0}),
])
def test_null_fields_and_integral_floats_are_taken_as_vllm_takes_them(field, body) -> None:
    """vLLM's request models read null as the field left out and 100.0 as 100: clients that send
    unset fields as null work through the router as they do against vLLM."""
    from cadencerl.router.requests import _route

    routed = _route(json.dumps(body).encode(), {}, field, {"rlvr": 1.0}, "rlvr")
    assert not routed.stream and not routed.background
    assert not routed.remember, "a null store is not stored (vLLM: `if request.store`)"


def test_admin_needs_the_bearer_token() -> None:
    with Fleet(admin_token="secret", policy="round-robin") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        url0 = f.settings.workers[0]
        assert c.get("/admin/workers").status_code == 401
        assert c.get("/admin/workers", headers={"Authorization": "Bearer wrong"}).status_code == 403
        assert c.post("/admin/workers/drain", json={"url": url0}).status_code == 401
        auth = {"Authorization": "Bearer secret"}
        assert len(c.get("/admin/workers", headers=auth).json()["workers"]) == 2
        assert c.post("/admin/workers/drain", json={"url": "nope"}, headers=auth).status_code == 400
        bad_port = c.post("/admin/workers", json={"url": "http://127.0.0.1:99999"}, headers=auth)
        assert bad_port.status_code == 400 and bad_port.json()["error"]["param"] == "url"
        openai_base = c.post("/admin/workers", json={"url": url0 + "/v1"}, headers=auth)
        assert openai_base.status_code == 400 and "without /v1" in openai_base.json()["error"]["message"]
        assert c.post("/admin/workers/drain", json={"url": url0}, headers=auth).json()["draining"] is True
        for _ in range(6):
            assert c.post("/v1/completions", json=TOKENS).headers["x-cadencerl-worker"] == "1"
        assert c.post("/admin/workers/remove", json={"url": url0}, headers=auth).status_code == 200
        assert c.post("/admin/workers", json={"url": url0}, headers=auth).status_code == 201
        assert c.post("/admin/workers", json={"url": url0}, headers=auth).status_code == 409
        assert {r.headers["x-cadencerl-worker"] for r in
                (c.post("/v1/completions", json=TOKENS) for _ in range(8))} == {"1", "2"}
    with Fleet(admin_token="") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        assert c.get("/admin/workers", headers={"Authorization": "Bearer x"}).status_code == 403


def test_new_sessions_beyond_the_hold_bound_get_429_with_retry_after() -> None:
    # One server with max_num_seqs 1: MISA-T's cap is at most 4 sessions there (MAX_CAP_FACTOR).
    with Fleet(stubs=1, hold_timeout_s=0.3, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        codes = []
        for i in range(8):   # sessions park in tool waits and keep MISA-T's slots
            r = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": f"s{i}"})
            codes.append(r.status_code)
        admitted = codes.index(429)      # MISA-T's caps (at most 4 sessions, shared by class)
        assert admitted >= 1 and set(codes[admitted:]) == {429}
        rejected = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": "late"})
        assert rejected.status_code == 429 and int(rejected.headers["retry-after"]) >= 1
        assert rejected.json()["error"]["type"] == "hold_timeout"
        r = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": "s0"})
        assert r.status_code == 200, "a continuation of an admitted session always passes"
    with Fleet(stubs=1, hold_max=0, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        codes = [c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": f"s{i}"}).status_code
                 for i in range(6)]
        admitted = codes.index(429)
        assert admitted >= 1 and set(codes[admitted:]) == {429}
        assert 'cadencerl_router_rejections_total{reason="hold_full"}' in c.get("/metrics").text
        assert f.service.state.live.keys() == {s.traj.id for s in f.service.state.parked.values()}


def test_an_upstream_5xx_passes_through_and_keeps_the_server_in_rotation() -> None:
    with Fleet(policy="round-robin") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].fail_status = 500
        codes = {}
        for i in range(6):
            r = c.post("/v1/completions", json={**TOKENS, "stream": i % 2 == 1})
            codes[r.headers["x-cadencerl-worker"]] = r.status_code
            if r.status_code == 500:
                assert r.json()["error"]["message"] == "stub failure", "the server's own body"
        assert codes == {"0": 500, "1": 200}, "a 5xx is the server's answer, not a reason to take it out"
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_errors_total{kind="upstream_5xx"} 3.0' in metrics
        assert "cadencerl_router_retries_total 0.0" in metrics


def test_a_dead_server_is_taken_out_and_its_sessions_move() -> None:
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": "s"})
        home = int(r.headers["x-cadencerl-worker"])
        f.stubs[home].stop()
        r = c.post("/v1/completions", json={**TOKENS, "stream": True}, headers={"X-Session-Id": "s"})
        assert r.status_code == 200 and r.headers["x-cadencerl-worker"] == str(1 - home)
        time.sleep(0.5)
        assert c.get("/health").json()["workers_up"] == 1
        f.stubs[1 - home].stop()
        t0 = time.monotonic()
        r = c.post("/v1/completions", json=TOKENS)
        assert r.status_code in (502, 503) and r.json()["error"]["message"] and time.monotonic() - t0 < 8
        time.sleep(0.5)
        assert c.get("/health").status_code == 503 and c.get("/v1/models").status_code == 503
        r = c.post("/v1/completions", json=TOKENS)
        assert r.status_code == 503 and r.json()["error"]["type"] == "no_worker"
        help_line = next(line for line in c.get("/metrics").text.splitlines()
                         if line.startswith("# HELP cadencerl_router_rejections_total"))
        assert "503 no_worker" in help_line, "the help text names every status the counter counts"


@pytest.mark.parametrize("cut_event", [None, 20, -1])
def test_a_stream_broken_midway_ends_with_an_error_event(cut_event: int | None) -> None:
    """Broken inside an event (`cut_event`: mid-line, or all but its blank line), the part sent is
    not relayed: the client would join it and the error event into one event that parses as neither."""
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.break_after, s.cut_event = 2, cut_event
        r = c.post("/v1/completions", json={**TOKENS, "stream": True, "max_tokens": 10},
                   headers={"X-Session-Id": "s"})
        events = _events(r.text)
        assert r.status_code == 200 and len(events) == 4 and events[-1] == "[DONE]", r.text
        assert json.loads(events[2])["error"]["type"] == "upstream_error"
        assert r.text.count("\n\n") == 4 and [json.loads(e) for e in events[:3]], "whole events only"
        assert 'cadencerl_router_errors_total{kind="midstream"} 1.0' in c.get("/metrics").text
        for s in f.states:
            s.break_after = None
        r = c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": "s"})
        assert r.status_code == 200, "the session continues after a broken turn"


def test_a_streamed_event_goes_out_as_it_arrives_and_the_end_once_the_session_is_parked() -> None:
    """The relay keeps back only the chunk that ends the stream (so a client that sends its next turn
    on `[DONE]` finds the session parked), never a token until the next one comes."""
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=20) as c:
        f.states[0].token_delay_s = 1.0       # the stub sleeps before each token
        arrived, parked_at_done = [], None
        with c.stream("POST", "/v1/completions", json={**TOKENS, "stream": True, "max_tokens": 2},
                      headers={"X-Session-Id": "s"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrived.append(time.monotonic())
                    if line == "data: [DONE]":
                        parked_at_done = len(f.service.state.parked)
        assert len(arrived) == 3 and parked_at_done == 1
        assert arrived[1] - arrived[0] > 0.5, "the first token waited for the second"


def test_a_stream_left_open_after_its_end_is_ended_by_the_relay(monkeypatch) -> None:
    """A server that sends `[DONE]` and keeps the stream open: the relay holds the end until the
    stream closes (the session is parked first), but no longer than END_GRACE_S; it used to wait
    for the read timeout (600 s by default)."""
    from cadencerl.router import proxy
    from cadencerl.router.proxy import END_GRACE_S

    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=30) as c:
        f.states[0].linger_s = 20.0
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={**TOKENS, "stream": True}, headers={"X-Session-Id": "s"})
        took = time.monotonic() - t0
        assert r.status_code == 200 and _events(r.text)[-1] == "[DONE]" and len(_events(r.text)) == 5
        assert END_GRACE_S <= took < END_GRACE_S + 5 and len(f.service.state.parked) == 1
        f.states[0].ping_s = 0.3            # and sends on after it: the bound still holds
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={**TOKENS, "stream": True}, headers={"X-Session-Id": "s"})
        assert r.status_code == 200 and _events(r.text)[-1] == "[DONE]" and time.monotonic() - t0 < END_GRACE_S + 5
        f.states[0].linger_s = 0.0
        monkeypatch.setattr(proxy, "END_GRACE_S", 60.0)     # a close is not waited for the grace
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={**TOKENS, "stream": True}, headers={"X-Session-Id": "s"})
        assert r.status_code == 200 and time.monotonic() - t0 < 30.0, "a stream that closes is not held"


def test_a_completion_streams_end_is_found_across_chunks() -> None:
    from cadencerl.router.proxy import EventCount

    reader = EventCount()
    for chunk in (b'data: {"choices": []}\n\n', b"data: [DO", b"NE]\n\n"):
        assert not reader.ended
        reader.feed(chunk)
    assert reader.ended and reader.generated == 1


def test_a_completion_streams_end_is_an_event_not_text_that_reads_like_one() -> None:
    """Generated text may hold `data: [DONE]` (a model writing SSE code; a tool call's arguments come
    in one delta): JSON escapes no part of it, but a string holds no raw newline, so only an event's
    own `data:` opens a line. Taken for the end, the rest of the stream would be held back."""
    from cadencerl.router.proxy import EventCount

    reader = EventCount()
    token = b'data: {"choices": [{"text": "print(\\"data: [DONE]\\")"}]}\n\n'
    cut = token.index(b"[DONE]") + 2      # the text's `data: [DONE]` cut between chunks
    for chunk in (token, token[:cut], token[cut:], b"data: [DO", b"NE]\n\n"):
        assert not reader.ended, chunk
        reader.feed(chunk)
    assert reader.ended and reader.generated == 2
    crlf = EventCount()
    for chunk in (b'data: {"text": "data: x"}\r\n\r\n', b"data: [DONE]\r\n\r\n"):
        crlf.feed(chunk)
    assert crlf.ended and crlf.generated == 1


def test_a_token_whose_text_reads_like_the_end_is_relayed_as_it_arrives() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=20) as c:
        f.states[0].text, f.states[0].token_delay_s = "data: [DONE]", 0.5
        arrived = []
        with c.stream("POST", "/v1/completions", json={**TOKENS, "stream": True, "max_tokens": 3},
                      headers={"X-Session-Id": "s"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrived.append(time.monotonic())
        assert len(arrived) == 4 and arrived[1] - arrived[0] > 0.25, "held back as if the stream had ended"
        assert [s.traj.tokens for s in f.service.state.parked.values()] == [3], "three tokens, one event each"


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_the_upstream_request() -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.05
        with c.stream("POST", "/v1/completions", json={**TOKENS, "stream": True, "max_tokens": 200},
                      headers={"X-Session-Id": "s"}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        deadline = time.monotonic() + 5
        while (f.states[0].running or f.service.state.workers[0].load) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f.states[0].running == 0 and f.service.state.workers[0].load == 0
        assert len(f.service.state.parked) == 1, "the session parks, ready for its next turn"


def test_a_prompt_no_server_can_hold_is_refused_at_once_and_blocks_nothing() -> None:
    with Fleet(kv_capacity=64, hold_timeout_s=20) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={**TOKENS, "prompt": list(range(64))})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 4 * 64}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert c.post("/v1/completions", json=TOKENS).status_code == 200
        assert time.monotonic() - t0 < f.settings.hold_timeout_s / 2 and len(f.service.state.hold) == 0


@pytest.mark.parametrize("content, param", [
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}', "messages[0].content[0].text"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]}',
     "messages[0].content[0].text"),
    (b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]}', "messages[1].content"),
    (b'{"messages": [{"role": "user", "content": ["a"]}]}', "messages[0].content[0]"),
    (b'{"messages": [{"role": 1}]}', "messages[0]"),
    (b'{"messages": [{"role": "user", "content": "hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}]}", None),
    (b'{"messages": [{"role": "user", "content": "hi", "x": ' + b"[" * 990 + b"]" * 990 + b"}]}", None),
])
def test_malformed_chat_bodies_get_a_400_naming_the_field_and_are_counted(content, param) -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
        if param is None and r.status_code == 200:
            return                           # shallow enough to parse here: nothing to refuse
        assert r.status_code == 400 and r.json()["error"]["param"] == param
        assert 'cadencerl_router_errors_total{kind="bad_request"} 1.0' in c.get("/metrics").text


def test_a_client_that_leaves_a_non_streaming_request_cancels_it_upstream() -> None:
    with Fleet(stubs=1) as f:
        f.states[0].token_delay_s = 0.05
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=f.url, timeout=0.5) as c:
            c.post("/v1/completions", json={**TOKENS, "max_tokens": 400})     # 20 s of generation
        assert _settle(lambda: f.states[0].running == 0 and f.service.state.workers[0].load == 0)
        assert 'cadencerl_router_errors_total{kind="client_disconnect"} 1.0' in httpx.get(f.url + "/metrics").text


def test_a_client_that_leaves_while_held_is_never_admitted() -> None:
    with Fleet(stubs=1, hold_timeout_s=20, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=0.5) as c:
        for i in range(16):       # sessions park and keep MISA-T's slots until one is held
            try:
                c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": f"s{i}", "X-Request-Id": f"r{i}"})
            except httpx.ReadTimeout:
                held = f"r{i}"
                break
        assert _settle(lambda: len(f.service.state.hold) == 0), "the held request is withdrawn"
        for key in list(f.service.state.by_key):
            assert c.delete(f"/v1/sessions/{key}").status_code == 200
        # a wrongly kept request would be admitted ahead of this one, into the slots just freed
        assert c.post("/v1/completions", json=TOKENS).status_code == 200
        time.sleep(0.3)
        assert f.states[0].served[held] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_headers_pass_both_ways_less_hop_by_hop_and_the_request_id_is_echoed(stream: bool) -> None:
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        sent = {"X-Custom": "v", "Authorization": "Bearer k", "Keep-Alive": "timeout=5",
                "Connection": "keep-alive, x-drop", "X-Drop": "1"}
        r = c.post("/v1/completions", json={**TOKENS, "stream": stream}, headers=sent)
        seen = f.states[0].last_headers
        assert seen["x-custom"] == "v" and seen["authorization"] == "Bearer k"
        assert "keep-alive" not in seen and "x-drop" not in seen and seen["content-type"] == "application/json"
        rid = r.headers["x-request-id"]
        assert rid and seen["x-request-id"] == rid, "a generated id goes upstream and comes back"
        assert r.headers["x-stub"] == "stub0" and len(r.headers.get_list("content-type")) == 1
        assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1
        r = c.post("/v1/completions", json={**TOKENS, "stream": stream}, headers={"X-Request-Id": "mine"})
        assert r.headers["x-request-id"] == "mine" == f.states[0].last_headers["x-request-id"]
        assert c.post("/v1/completions", content=b"{bad").headers["x-request-id"]


def test_a_keyless_request_is_placed_by_its_whole_prompt_not_a_shared_system_prompt() -> None:
    """Without a session or `user`, consistent-hash keys on the whole prompt: the samples of one
    prompt share a server, while prompts that share only a long system prompt spread."""
    from cadencerl.router.requests import _route

    system = {"role": "system", "content": "You are a careful agent. " * 60}     # ~1,500 characters

    def key(question: str) -> str:
        body = {"model": "tiny", "messages": [system, {"role": "user", "content": question}]}
        return _route(json.dumps(body).encode(), {}, "messages", {"rlvr": 1.0}, "rlvr").route_key

    assert key("What is 2+2?") == key("What is 2+2?")
    assert len({key(f"What is {i}+{i}?") for i in range(20)}) == 20


def test_held_requests_that_no_server_can_hold_any_more_get_the_400_at_once() -> None:
    """A server reports a smaller KV while requests wait in the hold queue: each gets the 400 a new
    request gets (naming `prompt`, or `messages` for chat), not a 429 when --hold-timeout passes."""
    long_prompt = list(range(1, 201))                  # 200 tokens: fits the default KV, not 128 tokens
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 4 * 200}], "max_tokens": 2}
    with Fleet(stubs=1, hold_timeout_s=20, session_ttl_s=30, max_num_seqs=1) as f, ThreadPoolExecutor(2) as pool:
        def post(path: str, body: dict, session: str) -> httpx.Response:
            return httpx.post(f.url + path, json=body, headers={"X-Session-Id": session}, timeout=10)

        hold = f.service.state.hold
        for i in range(16):       # sessions park and keep MISA-T's slots until one is held
            first = pool.submit(post, "/v1/completions", {**TOKENS, "prompt": long_prompt}, f"s{i}")
            assert _settle(lambda: first.done() or len(hold) == 1)
            if not first.done():
                break
            assert first.result().status_code == 200
        second = pool.submit(post, "/v1/chat/completions", chat, "chat")
        assert _settle(lambda: len(hold) == 2) and not first.done()
        t0 = time.monotonic()
        f.states[0].kv_blocks = 8                        # 128 tokens
        refused = [first.result(), second.result()]
        assert time.monotonic() - t0 < 5, "refused at the next poll, not at --hold-timeout"
        assert [r.status_code for r in refused] == [400, 400]
        assert [r.json()["error"]["param"] for r in refused] == ["prompt", "messages"]
        assert "200 tokens" in refused[0].json()["error"]["message"] and len(hold) == 0
        assert f.service.state.live.keys() == {s.traj.id for s in f.service.state.parked.values()}
        assert 'cadencerl_router_errors_total{kind="bad_request"} 2.0' in httpx.get(f.url + "/metrics").text


class _Buggy:
    """The router's service, but ending a session raises (the service is compiled: it takes no patch)."""

    def __init__(self, service) -> None:
        self._service = service

    def __getattr__(self, name: str):
        return getattr(self._service, name)

    def end_session(self, key: str) -> bool:
        raise RuntimeError("a bug")


def test_the_500_of_an_unhandled_error_carries_the_request_id_and_is_logged_once(caplog) -> None:
    uvicorn_log = logging.getLogger("uvicorn.error")       # uvicorn's loggers do not reach the root
    uvicorn_log.addHandler(caplog.handler)
    try:
        with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
            service, f.app.state.service = f.service, _Buggy(f.service)
            r = c.delete("/v1/sessions/s", headers={"X-Request-Id": "mine"})
            assert r.status_code == 500 and r.headers["x-request-id"] == "mine"
            assert r.json() == {"error": {"message": "internal router error: RuntimeError", "type": "internal_error",
                                          "param": None, "code": 500}}
            generated = c.delete("/v1/sessions/s")
            f.app.state.service = service
            assert generated.status_code == 500 and re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
            assert c.post("/v1/completions", json=TOKENS).status_code == 200, "the router keeps serving"
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 2 and "mine" in tracebacks[0].getMessage(), "one traceback per error, with its id"


def test_vllm_routers_other_session_headers_are_affinity_keys_that_open_no_session() -> None:
    from cadencerl.router.requests import _route

    def affinity(headers: dict, **body) -> str:
        raw = json.dumps({"model": "tiny", "prompt": "hi", **body}).encode()
        return _route(raw, headers, "prompt", {"rlvr": 1.0}, "rlvr").route_key

    assert affinity({"x-session-id": "s", "x-user-id": "u"}, user="b") == "session:s"
    assert affinity({"x-tenant-id": "t", "x-user-id": "u"}, user="b") == "x-user-id:u", "vllm-router's order"
    assert affinity({"x-correlation-id": "c"}, user="b") == "x-correlation-id:c"
    assert affinity({"x-request-id": "r", "x-trace-id": "t"}).startswith("prompt:"), "per-request ids are no key"
    assert affinity({}, session_params={"session_id": "n"}, user="b", session_id="s") == "session_params.session_id:n"
    assert affinity({}, user="b", session_id="s", user_id="u") == "user:b"
    assert affinity({}, session_id="s", user_id="u") == "session_id:s"
    assert affinity({}, user_id=7) == "user_id:7"
    assert affinity({"x-user-id": "u"}, session_id="s") == "x-user-id:u", "headers before the body"
    assert affinity({}, session_params="n", session_id=["x"]).startswith("prompt:"), "only a string or number"
    with Fleet(stubs=3, policy="consistent-hash") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for header in ("X-User-Id", "X-Tenant-Id", "X-Correlation-Id"):
            homes = {}
            for i in range(16):
                r = c.post("/v1/completions", json={**TOKENS, "prompt": [i + 1] * 4}, headers={header: f"k{i % 6}"})
                assert homes.setdefault(i % 6, r.headers["x-cadencerl-worker"]) == r.headers["x-cadencerl-worker"]
            assert len(set(homes.values())) > 1, header
        assert not f.service.state.by_key and not f.service.state.parked, "no session was opened"


@pytest.mark.parametrize("path, body, key", [
    ("/v1/embeddings", {"model": "tiny", "input": "hello"}, "data"),
    ("/v1/rerank", {"model": "tiny", "query": "q", "documents": ["a", "b"]}, "results"),
    ("/rerank", {"model": "tiny", "query": "q", "documents": ["a"]}, "results"),
])
def test_embeddings_and_rerank_pass_through_outside_admission(path: str, body: dict, key: str) -> None:
    # One server with max_num_seqs 1 and no hold queue: parked sessions fill MISA-T's caps.
    with Fleet(stubs=1, hold_max=0, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        codes = [c.post("/v1/completions", json=TOKENS, headers={"X-Session-Id": f"s{i}"}).status_code
                 for i in range(6)]
        assert 429 in codes
        live = set(f.service.state.live)
        r = c.post(path, json=body, headers={"X-Request-Id": "p1", "X-Custom": "v"})
        assert r.status_code == 200 and r.json()[key] and r.headers["x-stub"] == "stub0"
        assert r.headers["x-request-id"] == "p1" and r.headers["x-cadencerl-worker"] == "0"
        seen = f.states[0].last_headers
        assert f.states[0].served["p1"] == 1 and seen["x-custom"] == "v" and seen["content-type"] == "application/json"
        assert set(f.service.state.live) == live, "no session: not held, not admitted"
        assert c.post(path, content=b"[1]").json()["error"]["message"] == "the body must be a JSON object"
        assert c.post(path, json={**body, "user": 5}).json()["error"]["param"] == "user"
        f.states[0].fail_status = 500
        r = c.post(path, json=body)
        assert r.status_code == 500 and r.json()["error"]["message"] == "stub failure", "the server's own answer"
        metrics = c.get("/metrics").text
        assert f'cadencerl_router_pass_through_total{{route="{path}"}} 2.0' in metrics
        assert 'cadencerl_router_errors_total{kind="bad_request"} 2.0' in metrics


def test_pass_through_is_placed_by_the_policy_and_retried_once_on_another_server() -> None:
    embed = {"model": "tiny", "input": "hello"}
    # No health poll in the test's time: the stopped server is found by the request itself (a poll
    # 0.2 s after the stop could mark it down first on a slow machine, and nothing would be retried).
    with Fleet(stubs=3, policy="consistent-hash", metrics_interval_s=60) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        homes = {}
        for i in range(18):
            r = c.post("/v1/embeddings", json={**embed, "input": f"text {i}", "user": f"u{i % 6}"})
            assert homes.setdefault(i % 6, r.headers["x-cadencerl-worker"]) == r.headers["x-cadencerl-worker"]
        assert len(set(homes.values())) > 1, "consistent-hash keys on `user`, as for completions"
        home = int(homes[0])
        f.stubs[home].stop()
        r = c.post("/v1/embeddings", json={**embed, "user": "u0"})
        assert r.status_code == 200 and r.headers["x-cadencerl-worker"] != str(home)
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_errors_total{kind="connect"} 1.0' in metrics
        assert "cadencerl_router_retries_total 1.0" in metrics
        for i, stub in enumerate(f.stubs):
            if i != home:
                stub.stop()
        first = c.post("/v1/embeddings", json=embed)
        # Both left are down. How the router learns it depends on when its health poll runs: by the
        # first try and its retry failing (502, one retry), by the first try failing after the poll
        # found the other down (502, no retry), or by the poll alone (503, a rejection).
        outcomes = {"upstream server failed (connect), and the retry too": (1, 0),
                    "upstream server failed (connect); no other server is up": (0, 0),
                    "no server is up; retry later": (0, 1)}
        retries, rejected = outcomes[first.json()["error"]["message"]]
        assert first.status_code == (503 if rejected else 502)
        time.sleep(0.5)
        r = c.post("/v1/embeddings", json=embed)
        assert r.status_code == 503 and r.json()["error"]["type"] == "no_worker"
        metrics = c.get("/metrics").text
        assert f'cadencerl_router_rejections_total{{reason="no_worker"}} {1 + rejected}.0' in metrics
        assert f"cadencerl_router_retries_total {1 + retries}.0" in metrics


def test_a_pass_through_with_no_other_server_to_retry_on_says_so_and_counts_no_retry() -> None:
    # no health poll after the first, so the request (not a poll) finds the server gone: a poll
    # landing first made it a 503 "no server is up" on a loaded machine
    with Fleet(stubs=1, metrics_interval_s=600) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.stubs[0].stop()
        r = c.post("/v1/embeddings", json={"model": "tiny", "input": "hello"})
        assert r.status_code == 502
        assert r.json()["error"]["message"] == "upstream server failed (connect); no other server is up"
        metrics = c.get("/metrics").text
        assert "cadencerl_router_retries_total 0.0" in metrics
        assert 'cadencerl_router_rejections_total{reason="no_worker"}' not in metrics


def test_the_kv_misa_counts_for_sessions_between_turns_is_on_metrics() -> None:
    """Why admission holds: the KV a parked session's prefix keeps on its server, which MISA-T counts
    as used beside the server's own figure, per server on /metrics."""
    with Fleet(stubs=1, kv_capacity=1000) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/completions", json={**TOKENS, "prompt": list(range(96))}, headers={"X-Session-Id": "s"})
        assert r.status_code == 200 and _settle(lambda: len(f.service.state.parked) == 1)
        context = f.service.state.session("s").traj.context
        line = next(x for x in c.get("/metrics").text.splitlines() if x.startswith("cadencerl_router_worker_held_kv_usage{"))
        assert context == 96 + 4 and float(line.rsplit(" ", 1)[1]) == context / 1000


@pytest.mark.parametrize("path, body", [("/v1/completions", TOKENS), ("/v1/completions", {**TOKENS, "stream": True}),
                                        ("/v1/embeddings", {"model": "tiny", "input": "x"})])
def test_a_server_slower_than_the_request_timeout_gets_a_504_and_no_second_server(path, body) -> None:
    """Slow is not failed: sent again, the request would be generated twice before it failed."""
    with Fleet(stubs=2, request_timeout_s=1.0, policy="round-robin") as f, \
            httpx.Client(base_url=f.url, timeout=30) as c:
        for s in f.states:
            s.token_delay_s = s.pooled_delay_s = 5.0
        r = c.post(path, json=body, headers={"X-Request-Id": "slow"})
        assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_timeout"
        assert "--request-timeout-secs" in r.json()["error"]["message"]
        assert sum(s.served["slow"] for s in f.states) == 1
        assert _settle(lambda: all(w.load == 0 for w in f.service.state.workers))
        assert 'cadencerl_router_errors_total{kind="timeout"} 1.0' in c.get("/metrics").text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
def test_a_client_that_leaves_while_sending_its_body_is_counted_not_logged_as_an_error(path, caplog) -> None:
    import socket
    from urllib.parse import urlsplit

    caplog.set_level(logging.ERROR, logger="cadencerl.router")
    with Fleet(stubs=1) as f:
        url = urlsplit(f.url)
        with socket.create_connection((url.hostname, url.port)) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode() + b'{"prompt": "')
            time.sleep(0.3)
        metric = 'cadencerl_router_errors_total{kind="client_disconnect"} 1.0'
        assert _settle(lambda: metric in httpx.get(f.url + "/metrics").text)
        assert not [r for r in caplog.records if "unhandled" in r.getMessage()]
        assert httpx.post(f.url + "/v1/completions", json=TOKENS).status_code == 200


def test_a_new_session_carries_its_request_s_max_tokens_to_admission() -> None:
    """MISA-T bounds its first reply prior by it (admission/misa_learn.py)."""
    from cadencerl.router.requests import _route

    def routed(body: dict, field: str = "prompt"):
        return _route(json.dumps(body).encode(), {}, field, {"rlvr": 1.0}, "rlvr").max_new_tokens

    assert routed({"prompt": "x", "max_tokens": 64}) == 64
    assert routed({"prompt": [1, 2], "max_tokens": 64}) == 64                  # token ids: one prompt
    assert routed({"prompt": ["a", "b", "c"], "max_tokens": 64, "n": 2}) == 64 * 2 * 3   # every choice, every prompt
    assert routed({"messages": [{"role": "user", "content": "x"}], "max_tokens": 64,
                   "max_completion_tokens": 32}, "messages") == 32          # vLLM takes the newer name first
    assert routed({"input": "x", "max_output_tokens": 8.0}, "input") == 8
    assert routed({"prompt": "x"}) is None
    assert routed({"prompt": "x", "max_completion_tokens": 8}) is None          # not a completion's field
    assert routed({"input": "x", "max_tokens": 8}, "input") is None
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].token_delay_s = 0.5
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(c.post, "/v1/completions", json={**TOKENS, "max_tokens": 12})
            assert _settle(lambda: len(f.service.state.live) == 1)
            assert next(iter(f.service.state.live.values())).traj.spec.max_new_tokens == 12
            assert pending.result().status_code == 200


def test_vllm_s_other_routes_are_served_as_vllm_serves_them() -> None:
    """/tokenize and /detokenize placed on a server, /version and /ping from one that is up; a
    text/plain body on a generating route is a 415 (vllm-router's answer), not forwarded."""
    with Fleet(stubs=2) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for path in ("/tokenize", "/detokenize"):
            r = c.post(path, json={"model": "tiny", "prompt": "hello"})
            assert r.status_code == 200 and r.json()["count"] == 3 and r.headers["x-stub"].startswith("stub")
        assert c.get("/version").json()["version"].startswith("stub-")
        assert c.get("/ping").status_code == 200
        r = c.post("/v1/completions", content=b"hello", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["param"] == "content-type"
        assert sum(s.served.total() for s in f.states) == 2, "only the two tokenizer requests reached a server"
