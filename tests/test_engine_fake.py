"""EngineBackend and the trainer API on in-process fake vLLM servers: no vLLM needed, seconds.

The fakes (tests/fake_vllm.py) speak vLLM's token-in/token-out HTTP API over real sockets and
generate deterministic tokens (a function of the whole context), so every check here is exact:
a trajectory evicted, broken or lost mid-stream must end with the very ids it would have had in
one uninterrupted stream, and the server must have been asked to continue from its last token.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cadencerl.api import RolloutPool
from cadencerl.config import builtin_scenario
from cadencerl.core.backend import Backend, Finished, Restore, ToolReturned, TurnEnded, WorkerLost
from cadencerl.core.controller import StallError
from cadencerl.core.spec import NO_TURNS, HiddenLength, SealedTurns, TrajectorySpec, Turn
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.devpool.weights import WeightPushError
from cadencerl.engine import client as client_module
from cadencerl.engine.backend import EngineBackend
from cadencerl.engine.client import VLLMClient
from cadencerl.engine.clock import EngineRunError
from cadencerl.engine.errors import EngineError, EngineHTTPError
from cadencerl.engine.prompts import synthetic_observation, synthetic_prompt
from cadencerl.engine.streams import Streams
from tests.fake_vllm import PREFIX, FakeVLLM, reference
from tests.server_thread import ServerThread

pytestmark = pytest.mark.timeout(60)
PROMPT_LEN, TARGET = 40, 300


@pytest.fixture
def pair() -> Iterator[tuple[FakeVLLM, FakeVLLM]]:
    with FakeVLLM() as a, FakeVLLM() as b:
        yield a, b


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not seen within {timeout_s} s: {what}"
        time.sleep(0.01)


def test_engine_backend_has_every_protocol_method_with_its_parameters() -> None:
    methods = [n for n, f in vars(Backend).items() if callable(f) and not n.startswith("_")]
    assert "advance" in methods and "place" in methods
    for name in methods:
        want = list(inspect.signature(getattr(Backend, name)).parameters)
        assert list(inspect.signature(getattr(EngineBackend, name)).parameters) == want, name


# --- the client against the fake -----------------------------------------------------------------

def test_client_streams_aborts_and_reads_metrics(pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    a, b = pair
    prompt = list(range(1, 81))

    async def scenario() -> None:
        async with VLLMClient(a.url, model="tiny") as ca, VLLMClient(b.url, model="tiny") as cb:
            assert await ca.check_model() == 2048 and await ca.kv_capacity() == 8192
            chunks: list[list[int]] = []
            whole = await ca.generate("one", prompt, 48, chunks.append)
            assert whole.finish_reason == "length" and whole.token_ids == reference(prompt, 48)
            assert [t for c in chunks for t in c] == whole.token_ids

            streamed: list[int] = []
            task = asyncio.create_task(ca.generate("two", prompt, 1500, streamed.extend))
            while len(streamed) < 8:
                await asyncio.sleep(0.005)
            await ca.abort("two")
            first = await task
            assert first.finish_reason == "aborted" and 8 <= len(first.token_ids) < 1500
            rest = await cb.generate("two-resumed", prompt + first.token_ids, 30)
            assert first.token_ids + rest.token_ids == reference(prompt, len(first.token_ids) + 30)

            m = await ca.metrics()
            assert m.prefix_cache_queries_total == 160 and m.prefix_cache_hits_total == 64  # 2 blocks again
            wrong = await VLLMClient(a.url, model="other").generate("x", prompt, 4)
            assert isinstance(wrong.error, EngineHTTPError) and wrong.error.status_code == 404

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert a.state.aborted == [PREFIX + "two"]


def test_an_idle_connection_is_dropped_well_before_the_server_would_close_it() -> None:
    """vLLM closes a connection idle for 5 s (uvicorn's keep-alive); a request written on one as it
    closes breaks with a ReadError on a healthy server. The client must not keep one nearly that long."""
    ports: list[int] = []

    async def health(request: Request) -> Response:
        ports.append(request.client.port)
        return Response()

    server = ServerThread(Starlette(routes=[Route("/health", health)]), timeout_keep_alive=5).start()

    async def scenario() -> float:
        """The three calls; returns how long the second took from the end of the first."""
        async with VLLMClient(server.url, model="tiny") as client:
            assert await client.health()
            first_done = time.monotonic()
            assert await client.health()
            second_s = time.monotonic() - first_done
            await asyncio.sleep(2.0)   # idle for less than half the server's keep-alive
            assert await client.health()
            return second_s

    try:
        second_s = asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        server.stop()
    assert ports[2] != ports[1]            # a new connection after idling 2 s
    if second_s < 0.5:                     # a stalled machine may have let the first one expire
        assert ports[0] == ports[1]        # ... else a fresh one is reused


# --- EngineBackend, driven by hand as the controller would ---------------------------------------

@contextlib.contextmanager
def streaming(urls: list[str], worker: int, tokens: int,
              later: Callable[[object], SealedTurns] = lambda key: NO_TURNS) -> Iterator[tuple[EngineBackend, Trajectory]]:
    """A backend over `urls` with one trajectory placed on `worker` that has `tokens` or more;
    `later(key)` gives its later turns (sealed with the run's key)."""
    key = object()
    traj = Trajectory(TrajectorySpec(0, 0, PROMPT_LEN, HiddenLength(TARGET, key), later_turns=later(key)))
    traj.versions.append(0)
    backend = EngineBackend(urls, "tiny", key, metrics_every_s=0.05)
    try:
        backend.start([Worker(i, "cpu-tiny", "local", 1, 8192, 32, i) for i in range(len(urls))])
        backend.place(traj, worker, Restore.PREFILL, 0.0)
        advance_until(backend, lambda _: traj.generated >= tokens)
        yield backend, traj
    finally:
        backend.close()


def advance_until(backend: EngineBackend, cond: Callable[[list], bool], timeout_s: float = 10.0) -> list:
    """Advance in 20 ms steps until `cond(events so far)` holds; returns the events."""
    seen: list = []
    deadline = time.monotonic() + timeout_s
    while not cond(seen):
        assert time.monotonic() < deadline, f"condition not met; events {seen}"
        seen += backend.advance(backend.now() + 0.02)
    return seen


def finished(events: list) -> bool:
    return any(isinstance(e, Finished) for e in events)


def expected_ids() -> list[int]:
    prompt = synthetic_prompt(0, 0, PROMPT_LEN)
    return prompt + reference(prompt, TARGET)


def test_evicted_trajectory_resumes_elsewhere_from_its_last_token() -> None:
    with FakeVLLM(hold_after_tokens=30) as a, FakeVLLM() as b, streaming([a.url, b.url], 0, 30) as (backend, traj):
        backend.evict(traj)
        kept = traj.tokens
        assert kept == 30 and traj.meter is None and backend.kv_committed(0) == 0
        advance_until(backend, lambda _: a.running == 0)   # the abort reached the server
        ((rid, _, _),) = a.state.requests            # ended by the abort call, the disconnect, or both
        assert set(a.state.aborted + a.state.disconnected) == {PREFIX + rid}

        backend.place(traj, 1, Restore.PREFILL, 0.0)
        events = advance_until(backend, finished)
        ((_, sent, max_tokens),) = b.state.requests
        assert sent == expected_ids()[: PROMPT_LEN + kept] and max_tokens == TARGET - kept
        assert traj.tokens == TARGET and backend.token_ids(0) == expected_ids()
        assert [type(e) for e in events] == [Finished]
        assert (backend.counts.resumes, backend.counts.resumes_accepted, backend.counts.aborts) == (1, 1, 1)
        assert backend.verify() == [] and backend.env.completions == {0: 1}


def test_broken_stream_on_a_live_server_is_reissued_from_its_last_token() -> None:
    with FakeVLLM(break_after_tokens=20) as a, streaming([a.url], 0, 0) as (backend, traj):
        advance_until(backend, finished)
        assert backend.counts.retries == 1 and backend.counts.retries_unsent == 0 and backend.lost == []
        assert backend.counts.retries_timed_out == 0 and len(backend.counts.sent_retry_errors) == 1
        assert backend.counts.sent_retry_errors[0].startswith("trajectory 0: ")
        (_, first, _), (_, second, rest) = a.state.requests
        assert len(second) > len(first) and second == expected_ids()[: len(second)]
        assert rest == TARGET - (len(second) - PROMPT_LEN)
        assert backend.token_ids(0) == expected_ids() and backend.verify() == []


def test_a_request_that_never_connected_is_reissued_and_counted_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved machine can time out a connect to a live server: the request was never sent."""
    send = httpx.AsyncClient.send
    timeouts = []

    async def flaky_send(self, request: httpx.Request, **kwargs):
        if request.url.path.endswith("/generate") and len(timeouts) < 2:   # both of the client's tries
            timeouts.append(request.url.path)
            raise httpx.ConnectTimeout("timed out", request=request)
        return await send(self, request, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", flaky_send)
    with FakeVLLM() as a, streaming([a.url], 0, 0) as (backend, traj):
        advance_until(backend, finished)
        assert len(timeouts) == 2 and len(a.state.requests) == 1      # the server saw one request
        assert (backend.counts.retries, backend.counts.retries_unsent) == (1, 1) and backend.lost == []
        assert backend.token_ids(0) == expected_ids() and backend.verify() == []


def test_a_stream_that_timed_out_is_reissued_and_counted_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved machine can also time out a sent request's stream: re-issued, and told apart from a
    stream that broke, which the real-server tests count as a fault."""
    read = client_module._read_stream
    stalled: list[str] = []

    async def stalling(response, url, received, on_tokens):
        if not stalled:
            stalled.append(url)
            raise httpx.ReadTimeout("no data", request=response.request)
        return await read(response, url, received, on_tokens)

    monkeypatch.setattr(client_module, "_read_stream", stalling)
    with FakeVLLM() as a, streaming([a.url], 0, 0) as (backend, traj):
        advance_until(backend, finished)
        counts = backend.counts
        assert (counts.retries, counts.retries_unsent, counts.retries_timed_out) == (1, 0, 1)
        assert len(stalled) == 1 and "no stream data" in counts.sent_retry_errors[0]
        assert backend.lost == [] and backend.token_ids(0) == expected_ids() and backend.verify() == []


def test_dead_server_is_one_lost_worker_and_its_trajectory_finishes_elsewhere() -> None:
    with FakeVLLM() as a, FakeVLLM(die_after_tokens=40) as b, streaming([a.url, b.url], 1, 0) as (backend, traj):
        events = advance_until(backend, lambda evs: any(isinstance(e, WorkerLost) for e in evs))
        assert [e.worker for e in events if isinstance(e, WorkerLost)] == [1]
        assert backend.lost == [1] and not backend.records[1].alive and backend.counts.retries == 0
        backend.evict(traj)                       # what the controller does with a lost worker's residents
        kept = traj.tokens
        assert kept <= 40                         # what reached the client before the server died
        backend.place(traj, 0, Restore.PREFILL, 0.0)
        advance_until(backend, finished)
        ((_, sent, max_tokens),) = a.state.requests   # the survivor continues from the last token
        assert sent == expected_ids()[: PROMPT_LEN + kept] and max_tokens == TARGET - kept
        assert backend.token_ids(0) == expected_ids() and backend.verify() == []


def test_a_slow_health_answer_is_not_a_dead_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved machine answers /health late: probe again, re-issue the stream, lose nothing."""
    monkeypatch.setattr(Streams, "PROBE_TIMEOUT_S", 0.3)
    with FakeVLLM(break_after_tokens=20, slow_health_probes=2) as a, streaming([a.url], 0, 0) as (backend, traj):
        advance_until(backend, finished)
        assert a.slow_health_probes == 0            # both slow probes were made and outwaited
        assert backend.lost == [] and backend.counts.retries == 1
        assert backend.token_ids(0) == expected_ids() and backend.verify() == []


@pytest.mark.parametrize("in_stream", [False, True], ids=["status", "in-stream"])
def test_a_rejected_request_ends_the_run_and_loses_no_worker(in_stream: bool) -> None:
    """A 4xx is a bad request, not a dead server: re-sending it to every worker would lose them all.
    vLLM 0.32 answers a streamed request it rejects (e.g. a token id out of vocabulary) with 200 and
    an error event carrying the 400, which counted as a broken stream and lost every worker in turn."""
    with FakeVLLM(reject_status=400, reject_in_stream=in_stream) as a, FakeVLLM() as b:
        with pytest.raises(EngineRunError, match=r"worker 0 .*rejected trajectory 0's request: HTTP 400.*out of range"):
            with streaming([a.url, b.url], 0, 1):
                pass
        assert len(a.state.requests) == 1 and b.state.requests == []


def test_a_refused_server_at_connect_leaves_no_check_of_the_others_running(caplog: pytest.LogCaptureFixture) -> None:
    """One server refuses while another is still being checked: the refusal is the one error. The
    other check was left running, hit the closed client, and asyncio logged its traceback ('Task
    exception was never retrieved') into the trainer's output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with FakeVLLM(slow_health_probes=1) as a:
        backend = EngineBackend([a.url, dead], "tiny", object())
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            with pytest.raises(EngineError, match="refused"):
                backend.connect(10)
            backend.close()
            del backend
            gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_url_where_no_vllm_server_answers_fails_at_connect_at_once() -> None:
    """Something that is no vLLM server (another service, a wrong path) answers 404 at /health; the
    connect check waited out its whole timeout for a 200 that could never come."""
    server = ServerThread(Starlette(routes=[])).start()
    backend = EngineBackend([server.url], "tiny", object())
    try:
        started = time.monotonic()
        with pytest.raises(EngineError, match="404: no vLLM server serves this URL"):
            backend.connect(20)
        assert time.monotonic() - started < 10
    finally:
        backend.close()
        server.stop()


def test_every_worker_lost_says_so_and_why() -> None:
    with FakeVLLM(die_after_tokens=150) as a, FakeVLLM(die_after_tokens=150) as b:
        with pytest.raises(StallError, match=r"every worker is lost.*worker \d: its /health answered an error"):
            run_pool([a.url, b.url], kv_tokens=1024)


def one_tool_turn(key: object) -> tuple[Turn, ...]:
    return SealedTurns((Turn(observation_len=8, tool_latency_s=0.05, response=HiddenLength(20, key)),), key)


def test_a_tool_turn_appends_its_observation_and_the_next_reply_follows_it(
        pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    a, _ = pair
    with streaming([a.url], 0, 0, later=one_tool_turn) as (backend, traj):
        ended = advance_until(backend, lambda evs: any(isinstance(e, TurnEnded) for e in evs))
        assert [type(e) for e in ended] == [TurnEnded] and traj.tokens == TARGET
        returned = advance_until(backend, lambda evs: any(isinstance(e, ToolReturned) for e in evs))
        assert returned[0].observation_tokens == 8 and returned[0].time >= ended[0].time + 0.05
        traj.turn, traj.observation_tokens = 1, 8          # what the controller does on ToolReturned
        backend.place(traj, 0, Restore.PREFILL, 0.0)
        advance_until(backend, finished)
        context = expected_ids() + synthetic_observation(0, 0, 1, 8)
        (_, _, _), (_, sent, max_tokens) = a.state.requests
        assert sent == context and max_tokens == 20
        assert backend.token_ids(0) == context + reference(context, 20) and traj.tokens == TARGET + 20
        assert backend.verify() == [] and backend.env.completions == {0: 1}


# --- a whole run through the trainer API -----------------------------------------------------------

TRAJECTORIES = 32


def shrunk_cpu_pair(**overrides):
    """The `cpu-pair` scenario with TRAJECTORIES short trajectories in batches of 8."""
    return builtin_scenario("cpu-pair").with_overrides(
        workload={"trajectories": TRAJECTORIES, "response": {"median": 60, "sigma": 1.0, "cap": 400}},
        trainer={"batch_size": 8}, **overrides)


def run_pool(urls: list[str], kv_tokens: int, weight_update=None) -> tuple[dict, RolloutPool, list]:
    """The `cpu-pair` scenario, shrunk, through the trainer API with a zero-time trainer."""
    s = shrunk_cpu_pair(cadence={"delta": 32, "headroom_floor": 0.15})
    with RolloutPool.from_scenario(s, urls, policy="cadence", kv_tokens=kv_tokens, deadline_s=45,
                                   weight_update=weight_update) as pool:
        batches = []
        for batch in pool.batches():
            batches.append(batch)
            assert pool.publish() == batch.index + 1
        return pool.result(), pool, batches


def check_every_trajectory_once_and_exact(result: dict, pool: RolloutPool, batches: list) -> None:
    ctl, key = pool.controller, pool._key
    assert [b.index for b in batches] == list(range(TRAJECTORIES // 8))
    handed = [x.id for b in batches for x in b.samples]
    assert sorted(handed) == list(range(TRAJECTORIES))             # none lost, none twice
    assert [tuple(x.id for x in b.samples) for b in batches] == [b.trajectory_ids for b in ctl.trainer.batches]
    for b in batches:
        assert all(0 <= b.index - x.tag <= pool.scenario.controller.eta for x in b.samples)
        for x in b.samples:
            target = ctl.trajectories[x.id].spec.response.reveal(key)
            assert x.prompt_ids == synthetic_prompt(pool.scenario.seed, x.group, len(x.prompt_ids))
            assert x.completion_ids == reference(x.prompt_ids, target), x.id
    assert result["trajectories_completed"] == TRAJECTORIES and pool.backend.verify() == []
    assert set(pool.backend.env.completions.values()) == {1}


def test_rollout_pool_on_a_fake_pair_hands_out_every_trajectory_once(pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    result, pool, batches = run_pool([f.url for f in pair], kv_tokens=1024)
    check_every_trajectory_once_and_exact(result, pool, batches)
    # only a request that never reached its server (a starved machine's connect timeout) is re-sent
    assert result["lost_workers"] == [] and result["stream_retries"] == result["stream_retries_unsent"]
    assert all(w["samples"] > 0 and w["tokens_generated"] > 0 for w in result["workers"])


def test_a_weight_pusher_puts_the_servers_on_the_base_weights_before_the_pool_s_run(
        pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    """An earlier run may have left them on its last version; the samples of version 0 must not."""
    calls = []

    class Pusher:
        def __call__(self, worker, url, version):
            calls.append(("push", worker, version))

        def start_at_base(self, urls):
            calls.append(("base", list(urls)))

    result, _, _ = run_pool([f.url for f in pair], kv_tokens=1024, weight_update=Pusher())
    assert calls[0] == ("base", [f.url for f in pair]) and ("base", [f.url for f in pair]) not in calls[1:]
    assert result["trajectories_completed"] == TRAJECTORIES


def test_rollout_pool_survives_a_server_dying_mid_run() -> None:
    with FakeVLLM() as a, FakeVLLM(die_after_tokens=300) as b:
        result, pool, batches = run_pool([a.url, b.url], kv_tokens=1024)
        assert b.dead
    check_every_trajectory_once_and_exact(result, pool, batches)
    assert result["lost_workers"] == [1] and [w["alive"] for w in result["workers"]] == [True, False]
    assert result["resumes"] >= 1   # the dead worker's residents continued on the survivor


@pytest.mark.parametrize("fault", ["dead", "restarting", "silent"])
def test_a_server_found_dead_by_its_weight_push_is_a_lost_worker_not_a_failed_run(
        fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker advances once it is empty, so a server that died while idle is first noticed by the
    push of its new version: that is one lost worker (as a broken stream is), not the end of the run.
    So is one that answers an error and then comes back (a restart: it lost the pushed weights; it
    used to be kept, generating on the old ones under the new version's label), and one that does
    not answer at all (a node gone: it used to end the run)."""
    monkeypatch.setattr(Streams, "PROBE_TIMEOUT_S", 0.5)
    pushes: list[tuple[int, int]] = []
    with FakeVLLM() as a, FakeVLLM() as b:
        def push(worker: int, url: str, version: int) -> None:
            pushes.append((worker, version))
            if worker == 1:       # what WeightPusher meets: its /pause fails
                if fault == "dead":
                    b.dead = True
                elif fault == "restarting":
                    b.failing_health_probes = 1
                else:
                    b.slow_health_probes = 1_000
                raise WeightPushError(f"weights: /pause failed on {url}: ConnectError")
        result, pool, batches = run_pool([a.url, b.url], kv_tokens=1024, weight_update=push)
    check_every_trajectory_once_and_exact(result, pool, batches)
    assert result["lost_workers"] == [1] and "weight push" in result["lost_why"]["1"]
    assert len([v for w, v in pushes if w == 1]) == 1              # never pushed to again


def test_a_weight_push_refused_by_a_live_server_still_ends_the_run() -> None:
    """A server that answers refused the version (no dev-mode routes, a bad folder): not a lost worker."""
    def push(worker: int, url: str, version: int) -> None:
        raise WeightPushError(f"weights: /pause on {url} answered 404 (start the server with VLLM_SERVER_DEV_MODE=1)")

    with FakeVLLM() as a, FakeVLLM() as b:
        with pytest.raises(WeightPushError, match="answered 404"):
            run_pool([a.url, b.url], kv_tokens=1024, weight_update=push)


def test_asking_for_the_next_batch_without_publishing_says_so_instead_of_waiting(
        pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    """The next batch is formed only once the last one's version is published, so a trainer that
    forgets `publish()` used to wait forever on the next batch."""
    s = shrunk_cpu_pair()
    with RolloutPool.from_scenario(s, [f.url for f in pair], policy="cadence", kv_tokens=1024,
                                   deadline_s=45) as pool:
        batches = pool.batches()
        first = next(batches)
        with pytest.raises(RuntimeError, match=f"batch {first.index} is not published; call pool.publish"):
            next(batches)


def test_the_last_batch_needs_no_publish_for_the_run_to_end(pair: tuple[FakeVLLM, FakeVLLM]) -> None:
    s = shrunk_cpu_pair()
    with RolloutPool.from_scenario(s, [f.url for f in pair], policy="cadence", kv_tokens=1024,
                                   deadline_s=45) as pool:
        indices = []
        for batch in pool.batches():
            indices.append(batch.index)
            if batch.index < TRAJECTORIES // 8 - 1:
                pool.publish()
        assert indices == list(range(TRAJECTORIES // 8))
        assert pool.result()["trajectories_completed"] == TRAJECTORIES and pool.backend.verify() == []


def test_closing_the_clock_closes_a_stream_generator_left_suspended() -> None:
    """A trainer that leaves `batches()` early closes a run whose streams' generators may sit
    between two reads; closed only by the garbage collector once the loop is gone, they printed
    "Task was destroyed but it is pending!" on the trainer's stderr."""
    from cadencerl.engine.clock import WallClock

    clock, closed = WallClock(), []

    async def lines():
        try:
            while True:
                yield b"data: x"
        finally:
            closed.append(True)

    async def reader(gen) -> None:
        await anext(gen)
        await asyncio.sleep(3600)           # between two reads: the generator is suspended at its yield

    gen = lines()

    async def start() -> None:
        clock.spawn(reader(gen))
        await asyncio.sleep(0.01)

    clock.run(start())
    clock.close()
    assert closed == [True]


def test_a_run_that_loses_every_worker_still_writes_what_it_got_to_its_json(tmp_path: Path) -> None:
    """The error named the cause, but --json was never written: the completed trajectories' record
    was lost with the run."""
    from typer.testing import CliRunner

    from cadencerl.cli.main import app

    out = tmp_path / "run.json"
    with FakeVLLM(die_after_tokens=400) as a, FakeVLLM(die_after_tokens=400) as b:
        r = CliRunner().invoke(app, ["run", "-s", "cpu-pair", "--workers", f"{a.url},{b.url}", "--trajectories",
                                     "32", "--batch-size", "8", "--kv-tokens", "1024", "--deadline", "60",
                                     "--json", str(out)])
    assert r.exit_code == 2 and "every worker is lost" in r.output, r.output
    record = json.loads(out.read_text())
    assert record["finished"] is False and "every worker is lost" in record["error"]
    assert record["trajectories_submitted"] == 32 and 0 < record["tokens_generated"] <= 2 * 400 + 64
    assert sorted(record["lost_workers"]) == [0, 1] and set(record["lost_why"]) == {"0", "1"}
    assert record["trajectories_completed"] <= 32


def test_calibration_clips_a_prompt_to_the_server_s_longest_request() -> None:
    """`--prompts 99999` was clipped to the KV cache only, and the request then failed its
    max_model_len check as an internal error."""
    from cadencerl.engine.calibrate import measure

    with FakeVLLM(max_model_len=256, kv_tokens=8192) as server:
        samples, _ = asyncio.run(measure([server.url], "tiny", batches=[1], prompts=[99_999], new_tokens=16,
                                         repeat=1))
    assert samples and all(s.context <= 256 for s in samples)
