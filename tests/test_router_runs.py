"""`router/runs.py`: a stream's chunks grouped in the runs that were ready together, with nothing
held back, and a chunk still being waited for given up cleanly when the reader stops."""

from __future__ import annotations

import asyncio

import pytest

from cadencerl.router.coalesce import ready_runs


class Feed:
    """An upstream whose chunks arrive in bursts: `arrive` hands over a burst, the stream yields its
    chunks at once and then waits (a future) for the next burst; `None` ends it, an exception breaks it."""

    def __init__(self) -> None:
        self.bursts: asyncio.Queue = asyncio.Queue()
        self.closed = self.cancelled = False

    def arrive(self, *chunks) -> None:
        self.bursts.put_nowait(chunks)

    async def stream(self):
        try:
            while True:
                for chunk in await self.bursts.get():
                    if chunk is None:
                        return
                    if isinstance(chunk, Exception):
                        raise chunk
                    yield chunk
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


async def collect(feed: Feed, bursts: list[tuple]) -> list[list[bytes]]:
    """The runs read while `bursts` arrive one by one, each only once the reader waits for it."""
    runs = ready_runs(feed.stream())
    got = []
    task = asyncio.ensure_future(_read(runs, got))
    for burst in bursts:
        await asyncio.sleep(0.01)
        feed.arrive(*burst)
    await task
    return got


async def _read(runs, got) -> None:
    async for run in runs:
        got.append(run)


def test_a_burst_is_one_run_and_a_lone_chunk_its_own() -> None:
    feed = Feed()
    got = asyncio.run(collect(feed, [(b"a", b"b", b"c"), (b"d",), (b"e", b"f", None)]))
    assert got == [[b"a", b"b", b"c"], [b"d"], [b"e", b"f"]]
    assert feed.closed


def test_a_run_goes_out_before_the_next_chunk_is_waited_for() -> None:
    async def main() -> None:
        feed = Feed()
        runs = ready_runs(feed.stream())
        feed.arrive(b"a", b"b")
        assert await anext(runs) == [b"a", b"b"]     # not held back until c arrives
        feed.arrive(b"c", None)
        assert await anext(runs) == [b"c"]
        with pytest.raises(StopAsyncIteration):
            await anext(runs)
    asyncio.run(main())


def test_a_break_comes_after_the_chunks_before_it() -> None:
    async def main() -> list:
        feed = Feed()
        got: list = []
        feed.arrive(b"a", b"b", OSError("broken"))
        with pytest.raises(OSError, match="broken"):
            async for run in ready_runs(feed.stream()):
                got.append(run)
        return got
    assert asyncio.run(main()) == [[b"a", b"b"]]


def test_a_cancel_while_waiting_reaches_the_stream() -> None:
    async def main() -> Feed:
        feed = Feed()
        got: list = []
        task = asyncio.ensure_future(_read(ready_runs(feed.stream()), got))
        feed.arrive(b"a")
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert got == [[b"a"]]
        return feed
    feed = asyncio.run(main())
    assert feed.cancelled and feed.closed


def test_closing_it_after_a_run_gives_up_the_chunk_being_waited_for() -> None:
    async def main() -> Feed:
        feed = Feed()
        runs = ready_runs(feed.stream())
        feed.arrive(b"a", b"b")
        assert await anext(runs) == [b"a", b"b"]      # the stream now waits for its next burst
        await runs.aclose()
        return feed
    feed = asyncio.run(main())
    assert feed.cancelled and feed.closed


def test_a_reader_that_stops_reading_stops_the_stream_after_the_bound() -> None:
    """Back-pressure: the stream is read at most `limit` chunks ahead of its reader (plus the one
    waiting to be queued), never to its end into memory; closing the runs then closes the stream."""
    made = 0
    closed = asyncio.Event()

    async def endless():
        nonlocal made
        try:
            while True:
                made += 1
                yield b"x"
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def main() -> int:
        runs = ready_runs(endless(), limit=4)
        await anext(runs)
        await asyncio.sleep(0.05)           # the reader stops reading: the stream may not run on
        ahead = made
        await runs.aclose()
        assert closed.is_set()
        return ahead
    assert asyncio.run(main()) <= 2 * 4 + 1


def test_a_server_silent_mid_stream_still_times_out_through_the_relay() -> None:
    """The read timeout fires inside a step `ready_runs` waits on, as it fired in the relay's own read."""
    import httpx
    from router_stub import Fleet

    with Fleet(stubs=1, request_timeout_s=1.0) as f, httpx.Client(base_url=f.url, timeout=20) as c:
        f.states[0].token_delay_s = 0.02
        body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 200, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            f.states[0].token_delay_s = 5.0          # the server goes silent past the read timeout
            rest = [line for line in lines if line.startswith("data: ")]
        assert "the upstream stream broke: ReadTimeout" in rest[-2] and rest[-1] == "data: [DONE]"
        assert 'cadencerl_router_errors_total{kind="midstream"} 1.0' in c.get("/metrics").text


def test_a_relay_given_up_before_its_first_chunk_still_releases_and_closes() -> None:
    """The client leaves while the response's head waits to be written (uvicorn's send waits for a
    paused transport): the relay's body was never iterated, yet its session is released and the
    upstream stream closed (an async generator closed unstarted runs no `finally`)."""
    from types import SimpleNamespace

    import httpx

    from cadencerl.router.proxy import _attempt
    from cadencerl.router.requests import Routed

    class Upstream(httpx.AsyncBaseTransport):
        closed = False

        async def handle_async_request(self, request):
            async def body():
                try:
                    yield b'data: {"text": "a"}\n\n'
                    await asyncio.Event().wait()        # the server streams on
                finally:
                    Upstream.closed = True
            return httpx.Response(200, stream=Stream(body()))

    class Stream(httpx.AsyncByteStream):
        def __init__(self, gen) -> None:
            self.gen = gen

        def __aiter__(self):
            return self.gen

        async def aclose(self) -> None:
            await self.gen.aclose()

    released = []
    svc = SimpleNamespace(transport=Upstream(), forward_timeout=None, release=lambda s, n, last: released.append(n))
    session = SimpleNamespace(traj=SimpleNamespace(context=3))
    req = Routed(raw=b"{}", stream=True, session_key=None, route_key="", workload_class="c", last=True,
                 prompt_len=3, group=0)

    async def main() -> None:
        reply = await _attempt(svc, session, httpx.URL("http://up/v1/completions"), req, [], 0)
        disconnected = asyncio.Event()

        async def receive():
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                disconnected.set()
                await asyncio.Event().wait()            # the head never goes out
        await asyncio.wait_for(reply({"type": "http"}, receive, send), 5)

    asyncio.run(main())
    assert released == [0] and Upstream.closed


def test_the_framer_gives_whole_events_and_keeps_the_start_of_the_next() -> None:
    from cadencerl.router.framing import EventFramer, whole_events_end

    framer = EventFramer()
    assert framer.whole(b"data: 1\n\ndata: 2\n\n") == b"data: 1\n\ndata: 2\n\n" and framer.partial == b""
    assert framer.whole(b"data: 3\n\ndata: {\"te") == b"data: 3\n\n" and framer.partial == b"data: {\"te"
    assert framer.whole(b"xt\": 1}\n") == b"" and framer.partial == b"data: {\"text\": 1}\n"
    assert framer.whole(b"\nevent: e\r\ndata: 5\r\n\r\n") == b"data: {\"text\": 1}\n\nevent: e\r\ndata: 5\r\n\r\n"
    assert framer.partial == b"" and framer.whole(b"") == b""
    assert whole_events_end(b"data: a\r\rdata: b") == len(b"data: a\r\r") and whole_events_end(b"data: a\n") == 0


def test_the_framer_knows_every_line_ending_and_passes_on_an_event_too_large_to_keep() -> None:
    from cadencerl.router.framing import EventFramer, whole_events_end
    from cadencerl.router.stored import MAX_EVENT_BYTES

    assert whole_events_end(b"data: a\n\r\ndata: b") == len(b"data: a\n\r\n")      # LF then CRLF
    assert whole_events_end(b"data: a\r\ndata: b\r\n") == 0, "one CRLF is one line ending, not two"
    assert whole_events_end(b"data: a\r\n\ndata: b") == len(b"data: a\r\n\n")
    framer = EventFramer()
    assert framer.whole(b"data: a\r\n\r") == b"data: a\r\n\r" and framer.whole(b"\ndata: b\r\n") == b""
    assert framer.whole(b"\r\n") == b"\ndata: b\r\n\r\n", "a blank line split across chunks"
    big = b"data: " + b"x" * MAX_EVENT_BYTES
    assert framer.whole(big[:100]) == b"" and framer.whole(big[100:]) == big, "kept no further than the bound"
