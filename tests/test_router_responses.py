"""The router's Responses API, against stub servers that store responses as vLLM does: admission
as for completions, `previous_response_id`, GET and cancel pinned to the server that made the
response, unknown or orphaned ids, bad bodies; and pass-throughs counted in their server's load."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from router_stub import Fleet
from router_stub import settle as _settle

pytestmark = pytest.mark.timeout(60)

ASK = {"model": "tiny", "input": "hello", "max_output_tokens": 3}
AUTH = {"Authorization": "Bearer secret"}


def _events(text: str) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_responses_are_admitted_and_relayed_streaming_and_not() -> None:
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/responses", json=ASK, headers={"X-Workload-Class": "rlvr", "X-Request-Id": "q1"})
        assert r.status_code == 200 and r.json()["id"].startswith("resp_") and r.headers["x-request-id"] == "q1"
        r = c.post("/v1/responses", json={**ASK, "stream": True})
        events = _events(r.text)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert [e["type"] for e in events] == ["response.created"] + ["response.output_text.delta"] * 3 + \
            ["response.completed"]
        assert len(f.service.owners) == 2 and not f.service.state.live, "both single replies finished"
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_admissions_total{workload_class="rlvr"} 1.0' in metrics
        assert 'cadencerl_router_admissions_total{workload_class="agent"} 1.0' in metrics
    # the hold queue's bound applies as it does to completions: parked sessions keep MISA-T's slots
    with Fleet(stubs=1, hold_max=0, session_ttl_s=30, max_num_seqs=1) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        codes = [c.post("/v1/responses", json=ASK, headers={"X-Session-Id": f"s{i}"}).status_code for i in range(6)]
        admitted = codes.index(429)
        assert admitted >= 1 and set(codes[admitted:]) == {429}
        assert 'cadencerl_router_rejections_total{reason="hold_full"}' in c.get("/metrics").text


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_goes_to_the_server_that_made_the_response(stream: bool) -> None:
    # Round-robin would send each request to the next server, and the stubs 404 an id they do not hold.
    with Fleet(stubs=3, policy="round-robin") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        def ask(body: dict, headers: dict | None = None) -> tuple[str, str]:
            r = c.post("/v1/responses", json={**body, "stream": stream}, headers=headers or {})
            assert r.status_code == 200, r.text
            rid = _events(r.text)[0]["response"]["id"] if stream else r.json()["id"]
            return rid, r.headers["x-cadencerl-worker"]

        for headers in ({}, {"X-Session-Id": "s"}):
            rid, home = ask(ASK, headers)
            for turn in range(4):
                ask(ASK, headers)      # an unrelated request in between moves round-robin on
                rid, where = ask({**ASK, "input": f"turn {turn}", "previous_response_id": rid}, headers)
                assert where == home
        metrics = c.get("/metrics").text
        assert 'cadencerl_router_requests_total{kind="continuation",workload_class="agent"} 8.0' in metrics, \
            "with a session key, each turn is the session's next; the others are one-reply sessions"
        assert f.service.state.session("s").traj.home == int(home)


def test_get_and_cancel_go_to_the_server_that_holds_the_response() -> None:
    with Fleet(stubs=3, policy="round-robin") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        made = {}
        for _ in range(3):
            r = c.post("/v1/responses", json=ASK)
            made[r.json()["id"]] = r.headers["x-cadencerl-worker"]
        assert len(set(made.values())) == 3
        for rid, home in made.items():
            r = c.get(f"/v1/responses/{rid}", params={"stream": "false"}, headers={"X-Custom": "v"})
            assert r.status_code == 200 and r.json()["id"] == rid and r.headers["x-cadencerl-worker"] == home
            assert f.states[int(home)].last_headers["x-custom"] == "v"
            r = c.post(f"/v1/responses/{rid}/cancel")
            assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.headers["x-cadencerl-worker"] == home
        assert not f.service.state.live, "no admission, no session"


def test_an_id_the_router_does_not_know_is_a_404_naming_the_field() -> None:
    with Fleet(stubs=2) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        unstored = c.post("/v1/responses", json={**ASK, "store": False}).json()["id"]
        served = sum(sum(s.served.values()) for s in f.states)
        for rid in ("resp_nope", unstored):
            for r, param in ((c.get(f"/v1/responses/{rid}"), "response_id"),
                             (c.post(f"/v1/responses/{rid}/cancel"), "response_id"),
                             (c.post("/v1/responses", json={**ASK, "previous_response_id": rid}), "previous_response_id")):
                err = r.json()["error"]
                assert r.status_code == 404 and err["param"] == param and rid in err["message"]
        assert sum(sum(s.served.values()) for s in f.states) == served, "no server was asked"
        assert 'cadencerl_router_errors_total{kind="unknown_response"} 6.0' in c.get("/metrics").text
        assert not f.service.state.live and not f.service.state.hold


def test_a_response_whose_server_left_the_pool_is_a_404_and_a_drained_one_a_503() -> None:
    with Fleet(stubs=2, policy="round-robin") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        first, second = (c.post("/v1/responses", json=ASK) for _ in range(2))
        urls = f.settings.workers
        drained = urls[int(first.headers["x-cadencerl-worker"])]
        assert c.post("/admin/workers/drain", json={"url": drained}, headers=AUTH).status_code == 200
        r = c.post("/v1/responses", json={**ASK, "previous_response_id": first.json()["id"]})
        err = r.json()["error"]
        assert r.status_code == 503 and err["type"] == "no_worker" and "retry-after" in r.headers
        assert err["param"] == "previous_response_id"
        assert c.get(f"/v1/responses/{first.json()['id']}").status_code == 200, "reading it generates nothing"
        removed = urls[int(second.headers["x-cadencerl-worker"])]
        assert c.post("/admin/workers/remove", json={"url": removed}, headers=AUTH).status_code == 200
        for r in (c.get(f"/v1/responses/{second.json()['id']}"),
                  c.post("/v1/responses", json={**ASK, "previous_response_id": second.json()["id"]})):
            assert r.status_code == 404 and "removed" in r.json()["error"]["message"]


def test_a_turn_whose_server_refuses_the_connection_is_a_502_naming_the_field() -> None:
    # no health poll after the first, so the request (not a poll) finds the server gone
    with Fleet(stubs=2, policy="round-robin", metrics_interval_s=600) as f, \
            httpx.Client(base_url=f.url, timeout=10) as c:
        made = {r.headers["x-cadencerl-worker"]: r.json()["id"] for r in (c.post("/v1/responses", json=ASK)
                                                                           for _ in range(2))}
        f.stubs[1].stop()
        r = c.post("/v1/responses", json={**ASK, "previous_response_id": made["1"]})
        err = r.json()["error"]
        assert r.status_code == 502 and err["param"] == "previous_response_id" and made["1"] in err["message"]
        assert sum(f.states[0].served.values()) == 1, "not retried on a server that does not hold it"
        assert "cadencerl_router_retries_total 0.0" in c.get("/metrics").text, "nor counted as retried"
        assert c.post("/v1/responses", json={**ASK, "previous_response_id": made["0"]}).status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"model": "tiny"}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [1]}, "input[0]"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
    ({"input": "x", "instructions": ["x"]}, "instructions"),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),     # vLLM: "max_tokens must be at least 1"
    ({"input": "x", "previous_response_id": 5}, "previous_response_id"),
    ({"input": "x", "store": "no"}, "store"),
    ({"input": "x" * 4 * 64}, "input"),
    ({"input": "x", "instructions": "x" * 4 * 64}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x" * 4 * 64}]}]}, "input"),
])
def test_a_bad_responses_body_is_a_400_naming_the_field(body: dict, param: str) -> None:
    with Fleet(stubs=1, kv_capacity=64) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert sum(f.states[0].served.values()) == 0
        assert 'cadencerl_router_errors_total{kind="bad_request"} 1.0' in c.get("/metrics").text
        assert c.post("/v1/responses", json=ASK).status_code == 200


def test_the_map_of_stored_responses_is_bounded() -> None:
    with Fleet(stubs=2, max_response_ids=3) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        ids = []
        for i in range(5):      # learned from JSON answers and from streams alike
            r = c.post("/v1/responses", json={**ASK, "stream": i % 2 == 1})
            ids.append(_events(r.text)[0]["response"]["id"] if i % 2 else r.json()["id"])
        assert len(f.service.owners) == 3
        assert [c.get(f"/v1/responses/{rid}").status_code for rid in ids] == [404, 404, 200, 200, 200]


def test_a_stream_reader_learns_the_id_and_counts_usage_not_events() -> None:
    from cadencerl.router.stored import MAX_EVENT_BYTES, ResponseOwners, ResponseStream

    def event(kind: str, **data) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    owners = ResponseOwners(limit=8)
    created = event("response.created", response={"id": "resp_x", "usage": None})
    framing = [event(k) for k in ("response.in_progress", "response.output_item.added", "response.content_part.added")]
    deltas = [event("response.output_text.delta", delta=" t") for _ in range(2)]
    done = event("response.completed", response={"id": "resp_x", "usage": {"output_tokens": 5}})
    reader = ResponseStream(owners, 2)
    stream = b"".join([created, *framing, *deltas, done])
    for i in range(0, len(stream), 7):      # the id and the usage split across chunks
        assert not reader.ended, "ended before its last event"
        reader.feed(stream[i:i + 7])
    assert owners.get("resp_x") == 2 and reader.generated == 5, "vLLM sends fewer deltas than tokens"
    assert reader.ended, "response.completed ends a Responses stream (it has no [DONE])"
    broken = ResponseStream(None, 1)        # store false: counts, learns nothing
    for chunk in (event("response.created", response={"id": "resp_y"}), b"x" * (MAX_EVENT_BYTES + 1), b"x\n",
                  *framing, *deltas, b"data: [DONE]\n\n"):
        broken.feed(chunk)
    assert broken.generated == 2 and owners.get("resp_y") is None and len(owners) == 1
    assert not broken.ended, "[DONE] is not a Responses stream's end"
    huge = ResponseStream(None, 1)          # a final response object past MAX_EVENT_BYTES: skipped, yet the end
    for chunk in (created, b"event: response.completed\ndata: {" + b"x" * MAX_EVENT_BYTES, b"x}\n\n"):
        assert not huge.ended
        huge.feed(chunk)
    assert huge.ended


@pytest.mark.parametrize("stream", [False, True])
def test_a_session_counts_a_responses_turn_by_its_output_tokens(stream: bool) -> None:
    # The stub's stream is response.created, 3 deltas, response.completed (usage 3): 5 events.
    with Fleet(stubs=1, session_ttl_s=30) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        r = c.post("/v1/responses", json={**ASK, "stream": stream}, headers={"X-Session-Id": "s"})
        assert r.status_code == 200
        assert _settle(lambda: f.service.state.session("s").traj.tokens == 3), \
            f"tokens {f.service.state.session('s').traj.tokens}, not the reply's 3"
        if stream:
            f.states[0].break_after = 3         # response.created and two deltas, then the stream breaks
            rid = _events(r.text)[0]["response"]["id"]
            r = c.post("/v1/responses", json={**ASK, "stream": True, "previous_response_id": rid},
                       headers={"X-Session-Id": "s"})
            assert r.status_code == 200 and "upstream_error" in r.text
            assert _settle(lambda: f.service.state.session("s").traj.tokens == 5), "a broken stream: its deltas"


def test_a_pass_through_counts_in_its_servers_load_until_it_ends() -> None:
    embed = {"model": "tiny", "input": "hello"}
    with Fleet(stubs=2, policy="least-loaded-router") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        workers = f.service.state.workers
        for s in f.states:
            s.pooled_delay_s = 0.6
        for fail in (None, 500):
            for s in f.states:
                s.fail_status = fail
            done = []
            slow = threading.Thread(target=lambda: done.append(c.post("/v1/embeddings", json=embed)))
            slow.start()
            assert _settle(lambda: sum(w.load for w in workers) == 1), "counted while it runs"
            # the router counts it before the stub reads it: the stub decides its answer on reading
            assert _settle(lambda: sum(s.running for s in f.states) == 1), "the stub has read it"
            busy = next(w.id for w in workers if w.load == 1)
            for s in f.states:
                s.fail_status = None
            r = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
            assert r.headers["x-cadencerl-worker"] == str(1 - busy), "least-loaded sees the embedding"
            slow.join()
            assert done[0].status_code == (fail or 200)
            assert _settle(lambda: sum(w.load for w in workers) == 0), f"released after {fail or 200}"
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/embeddings", json=embed, timeout=0.2)
        assert _settle(lambda: sum(w.load for w in workers) == 0), "released when the client leaves"
        f.stubs[0].stop()
        for s in f.states:
            s.pooled_delay_s = 0.0
        codes = {c.post("/v1/embeddings", json={**embed, "input": f"x{i}"}).status_code for i in range(4)}
        assert codes == {200} and sum(w.load for w in workers) == 0, "released when the connection fails"


@pytest.mark.parametrize("why", ["left", "too_long"])
def test_a_waiting_turn_no_decision_can_place_on_its_server_is_refused_at_the_poll_and_holds_no_one_up(
        why: str) -> None:
    """A turn pinned to a server waits at the head of the hold queue while that server is out of
    rotation, and every new session waits behind it. The next poll refuses it (503 or 400, naming
    the field) when its server is still out, or back with a KV too small for it (one too small on
    arrival is refused at once), and the sessions behind it are admitted."""
    import asyncio

    from cadencerl.router.requests import ApiError
    from cadencerl.router.service import Rejected, RouterService
    from cadencerl.router.settings import make_settings

    svc = RouterService(make_settings(workers=["http://127.0.0.1:9", "http://127.0.0.1:10"], policy="round-robin"))
    pinned_to = svc.state.workers[0]

    async def run():
        pinned_to.alive = False
        pinned = asyncio.ensure_future(svc.acquire(None, "rlvr", 100, 1, field="input", pin=0))
        behind = asyncio.ensure_future(svc.acquire(None, "rlvr", 100, 2))
        await asyncio.sleep(0.05)
        assert not pinned.done() and not behind.done(), "the pinned head holds the session behind it"
        if why == "too_long":
            pinned_to.alive, pinned_to.kv_capacity = True, 64     # back, with a KV too small for it
        svc._refuse_unfittable(svc.now())
        svc.decide()
        session = await asyncio.wait_for(behind, 1.0)
        assert session.traj.worker == 1
        with pytest.raises((Rejected, ApiError)) as info:
            await asyncio.wait_for(pinned, 1.0)
        return info.value

    exc = asyncio.run(run())
    if why == "left":
        assert isinstance(exc, Rejected) and (exc.status, exc.param) == (503, "previous_response_id")
        assert exc.retry_after == svc.retry_after()
        assert svc.metrics.rejections.labels("no_worker")._value.get() == 1
    else:
        assert isinstance(exc, ApiError) and (exc.status, exc.param) == (400, "input") and "63 at most" in exc.message
    assert not svc.waiters and len(svc.state.live) == 1


@pytest.mark.parametrize("cut_event", [None, 20, -1])
def test_a_stored_response_streamed_again_that_breaks_ends_with_the_responses_error_event(cut_event: int | None) -> None:
    """Broken inside an event (`cut_event`: mid-line, or all but its blank line), the part sent is
    not passed on (it would spoil the error event), and the error event is numbered after what was."""
    with Fleet(stubs=1) as f, httpx.Client(base_url=f.url, timeout=10) as c:
        f.states[0].cut_event = cut_event
        rid = c.post("/v1/responses", json=ASK).json()["id"]
        r = c.get(f"/v1/responses/{rid}", params={"stream": "true"})
        assert r.status_code == 200 and r.text.rstrip().split("\n\n")[-1].startswith("event: response.completed")
        f.states[0].break_after = 2             # response.created and one delta, then the stream breaks
        r = c.get(f"/v1/responses/{rid}", params={"stream": "true"})
        last = r.text.rstrip().split("\n\n")[-1]
        assert r.status_code == 200 and last.startswith("event: error\ndata: ") and "[DONE]" not in r.text
        error = json.loads(last.split("data: ", 1)[1])
        assert error["type"] == "error" and error["code"] == "upstream_error" and error["sequence_number"] == 2
        assert r.text.count("\n\n") == 3, "whole events only: response.created, one delta, the error"
