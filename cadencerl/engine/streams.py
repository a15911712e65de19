"""Per-request streaming on real servers: one placement of a turn, its retries, resume and abort.

Every trajectory's token ids are kept here, so an evicted or lost trajectory resumes on any worker
from its last received token. A broken stream is not a broken run: a dead server is lost (its
residents go back to pending), a live one gets the request re-issued; a 4xx ends the run with the
server's message. Each placement is the trajectory's meter while it runs. The fault rules in full:
docs/internals.md, "engine".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from cadencerl.core.backend import WorkerLost
from cadencerl.core.trajectory import Meter, Trajectory
from cadencerl.engine.client import Liveness, VLLMClient
from cadencerl.engine.clock import EngineRunError, WallClock
from cadencerl.engine.errors import EngineError, EngineHTTPError, EngineTimeoutError, EngineUnreachableError
from cadencerl.engine.records import WorkerRecord


@dataclass(eq=False)
class Placement:
    """One placement of a trajectory's current turn on a worker; also the trajectory's meter."""

    traj: Trajectory
    worker: int
    start: int                   # generated tokens when placed
    target: int                  # generated-token count at which the turn ends
    received: list[int] = field(default_factory=list)
    live: bool = True            # False once evicted or completed: later tokens are dropped
    failed: bool = False         # the stream broke; awaiting the worker's probe
    attempts: int = 0
    cause: EngineError | None = None   # why the stream last broke (None: the server aborted it)
    request_id: str = ""
    task: asyncio.Task | None = None

    def generated(self) -> int:
        return self.start + len(self.received)

    @property
    def error(self) -> str:
        return str(self.cause) if self.cause else "the server aborted the request"

    @property
    def unsent(self) -> bool:
        """The stream broke before its request reached the server (no connection opened)."""
        return isinstance(self.cause, EngineUnreachableError)

    @property
    def timed_out(self) -> bool:
        """The stream broke on a client timeout (no answer or no stream data in time)."""
        return isinstance(self.cause, EngineTimeoutError)


@dataclass
class StreamCounts:
    resumes: int = 0             # placements that continued from generated tokens
    resumes_accepted: int = 0    # ... whose continued ids the server took and extended
    aborts: int = 0
    retries: int = 0             # streams re-issued on a worker that answered its probe
    retries_unsent: int = 0      # ... of which the request had never reached the server
    retries_timed_out: int = 0   # ... of which a sent request's stream timed out (a starved machine)
    sent_retry_errors: list[str] = field(default_factory=list)   # why each sent request broke


class Streams:
    """The placements in flight, one client per worker; `on_turn_end` hears each completed turn."""

    MAX_ATTEMPTS = 3            # stream failures on a healthy worker before it counts as lost
    PROBE_TIMEOUT_S = 5.0        # one /health probe
    PROBE_WINDOW_S = 30.0        # a server that answers no probe for this long counts as lost
    ABORT_TIMEOUT_S = 5.0

    def __init__(self, clock: WallClock, clients: list[VLLMClient], tag: str,
                 on_turn_end: Callable[[Placement], None]) -> None:
        self._clock = clock
        self._clients = clients
        self._tag = tag                      # request ids stay unique across runs on one server
        self._on_turn_end = on_turn_end
        self.records: list[WorkerRecord] = []   # set when the run starts
        self.by_traj: dict[int, Placement] = {}
        self.by_worker: list[dict[int, Placement]] = [{} for _ in clients]
        self.ids: dict[int, list[int]] = {}  # traj id -> prompt + every token so far (not in flight)
        self.probing: set[int] = set()
        self.dead: set[int] = set()
        self.lost: list[int] = []
        self.lost_reasons: dict[int, str] = {}
        self.problems: list[str] = []
        self.counts = StreamCounts()
        self.on_tokens: Callable[[int, list[int]], None] | None = None   # each chunk kept (a journal)

    def kv_committed(self, worker: int) -> int:
        return sum(p.traj.context for p in self.by_worker[worker].values())

    def token_ids(self, traj_id: int) -> list[int]:
        """Prompt + generated (+ observation) ids of a trajectory so far, in flight included."""
        ids = list(self.ids.get(traj_id, ()))
        p = self.by_traj.get(traj_id)
        return ids + p.received if p is not None else ids

    def open(self, traj: Trajectory, worker: int, target: int, delay_s: float) -> None:
        """Place the trajectory's current turn: stream the tokens left up to `target`."""
        if worker in self.dead:
            raise EngineRunError(f"placement on lost worker {worker}")
        p = Placement(traj, worker, traj.tokens, target)
        traj.meter = Meter(p)
        self.by_traj[traj.id] = p
        self.by_worker[worker][traj.id] = p
        if p.start:
            self.counts.resumes += 1
        if p.generated() >= p.target:        # nothing left of this turn (it ended as it departed)
            self._complete(p)
            return
        self._launch(p, delay_s)

    def evict(self, traj: Trajectory) -> None:
        """Abort the trajectory's stream; its tokens so far stay in `ids` and `traj.tokens`."""
        p = self.by_traj.get(traj.id)
        if p is None:
            raise EngineRunError(f"evict of trajectory {traj.id}, which is not placed")
        self._release(p)
        self.counts.aborts += 1
        if p.task is not None and not p.task.done():
            p.task.cancel()                  # closing the stream aborts it server-side too
            if p.worker not in self.dead:
                self._clock.spawn(self._abort(p.worker, p.request_id))

    # -- one stream --------------------------------------------------------------------------------

    def _launch(self, p: Placement, delay_s: float = 0.0) -> None:
        p.attempts += 1
        p.failed = False
        p.request_id = f"crl-{self._tag}-t{p.traj.id}-{self._clock.next_id()}"
        p.task = self._clock.spawn(self._run(p, delay_s))

    async def _run(self, p: Placement, delay_s: float) -> None:
        try:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            prompt = self.ids[p.traj.id] + p.received
            self.records[p.worker].prompt_tokens_sent += len(prompt)

            def on_tokens(new: list[int]) -> None:
                if p.live:
                    self._receive(p, new)

            outcome = await self._clients[p.worker].generate(p.request_id, prompt, p.target - p.generated(),
                                                             on_tokens)
            if not p.live:
                return
            if _rejected(outcome.error):
                url = self._clients[p.worker].base_url
                self._clock.fail(EngineRunError(f"worker {p.worker} ({url}) rejected trajectory {p.traj.id}'s "
                                                f"request: {outcome.error}"))
            elif outcome.finish_reason in ("error", "aborted"):   # nobody here asked for an abort
                self._failed(p, outcome.error)
            else:
                self.problems.append(f"trajectory {p.traj.id}: stream ended ({outcome.finish_reason}) at "
                                     f"{p.generated()} of {p.target} tokens")
                self._complete(p)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug or bad input must end the run, not hang it
            url = self._clients[p.worker].base_url
            self._clock.fail(EngineRunError(f"worker {p.worker} ({url}), trajectory {p.traj.id}: {exc}"))

    def _receive(self, p: Placement, new: list[int]) -> None:
        if p.start and not p.received:   # on whichever attempt first got a token (a retry re-sends the same ids)
            self.counts.resumes_accepted += 1   # the server took the continued ids and extended them
        if self.on_tokens is not None:
            self.on_tokens(p.traj.id, new[: max(0, p.target - p.generated())])
        p.received.extend(new)
        self.records[p.worker].tokens_generated += len(new)
        if p.generated() >= p.target:
            if p.generated() > p.target:
                self.problems.append(f"trajectory {p.traj.id}: {p.generated()} tokens, target {p.target}")
                del p.received[p.target - p.start:]
            self._complete(p)

    def _release(self, p: Placement) -> None:
        """The placement ends: its tokens join the trajectory's record and its meter stops."""
        p.live = False
        traj = p.traj
        self.by_traj.pop(traj.id, None)
        self.by_worker[p.worker].pop(traj.id, None)
        self.ids[traj.id] += p.received
        traj.tokens = p.generated()
        traj.meter = None

    def _complete(self, p: Placement) -> None:
        self._release(p)
        self._on_turn_end(p)

    # -- failures ----------------------------------------------------------------------------------

    def _failed(self, p: Placement, error: EngineError | None) -> None:
        p.failed = True
        p.cause = error
        if p.worker not in self.probing and p.worker not in self.dead:
            self.probing.add(p.worker)
            self._clock.spawn(self._probe(p.worker))

    def condemn(self, worker: int, why: str) -> None:
        """A call beside the streams (a weight push) failed on a server that then did not answer as
        healthy: it is lost whatever a later probe says (a server that comes back has restarted
        without the pushed weights), through the usual event, between decisions."""
        if worker not in self.dead:
            self._clock.spawn(self._lose_now(worker, why))

    async def _lose_now(self, worker: int, why: str) -> None:
        self.lose(worker, why)
        self._clock.poke()

    async def _probe(self, worker: int) -> None:
        """A stream broke: is the server alive? Re-issue its broken streams, or report it lost."""
        try:
            verdict = await self._liveness(worker)
            broken = [p for p in self.by_worker[worker].values() if p.failed]
            worn = [p for p in broken if p.attempts >= self.MAX_ATTEMPTS]
            if verdict == "healthy" and not worn:
                for p in broken:
                    self.counts.retries += 1
                    self.counts.retries_unsent += p.unsent
                    if not p.unsent:
                        self.counts.retries_timed_out += p.timed_out
                        self.counts.sent_retry_errors.append(f"trajectory {p.traj.id}: {p.error}")
                    self._launch(p)
            elif verdict == "healthy":
                self.lose(worker, f"{self.MAX_ATTEMPTS} streams of trajectory {worn[0].traj.id} broke on a healthy "
                                  f"server, the last: {worn[0].error}")
            else:
                self.lose(worker, {"refused": "its /health refused the connection",
                                   "unhealthy": "its /health answered an error (the engine is down)",
                                   "slow": f"no /health answer for {self.PROBE_WINDOW_S:.0f} s"}[verdict]
                          + f" after a stream broke ({broken[0].error if broken else 'no stream left'})")
        finally:
            self.probing.discard(worker)
            self._clock.poke()

    async def _liveness(self, worker: int) -> Liveness:
        """Probe until the server answers one way or the other, for at most PROBE_WINDOW_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.PROBE_WINDOW_S
        while True:
            verdict = await self._clients[worker].liveness(self.PROBE_TIMEOUT_S)
            if verdict != "slow" or loop.time() >= deadline:
                return verdict
            await asyncio.sleep(0.5)

    def lose(self, worker: int, why: str) -> None:
        """The worker is gone: one WorkerLost event (the controller evicts its residents)."""
        if worker in self.dead:
            return
        self.dead.add(worker)
        self.lost.append(worker)
        self.lost_reasons[worker] = why
        if self.records:
            self.records[worker].alive = False
        self._clock.emit(WorkerLost(worker, self._clock.now(), why))

    async def _abort(self, worker: int, request_id: str) -> None:
        try:
            await asyncio.wait_for(self._clients[worker].abort(request_id), self.ABORT_TIMEOUT_S)
        except (EngineError, TimeoutError):
            pass  # the disconnect aborts it anyway


def _rejected(error: EngineError | None) -> bool:
    """The server refused the request itself (4xx other than a timeout or back-pressure)."""
    return isinstance(error, EngineHTTPError) and 400 <= error.status_code < 500 and error.status_code not in (408, 429)
