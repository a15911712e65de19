"""One recorded event sequence, fed to the simulator's controller and to the live router's adapter,
gives the same decisions: the router runs admission/'s decision code, not a second implementation.

The sequence is recorded once from a controller (sessions arrive, turns end, tools return, sessions
finish, the engines report KV use, waiting and preemptions), then replayed on a fresh controller and
on `LiveState`; every decision pass must yield the same Admit/Place actions in the same order.
"""

from __future__ import annotations

import random

import pytest

from cadencerl.config import ControllerSpec
from cadencerl.core.actions import Batch
from cadencerl.core.backend import EngineStats, Finished, ToolReturned, TurnEnded, refresh_each
from cadencerl.core.controller import Controller
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker
from cadencerl.engine.server_metrics import EngineMetrics
from cadencerl.router.live import LiveState
from cadencerl.router.policy import router_policy
from cadencerl.router.settings import make_settings

pytestmark = pytest.mark.timeout(60)

KV = 4096
MIX = {"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2}
KEY = object()
ETA = 10


class RecordedBackend:
    """Plays the engines for the controller: reports the recorded figures, runs nothing."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.figures = {w.id: EngineStats(0, 0, 0, 0) for w in workers}

    def refresh(self, workers, now): refresh_each(self, workers)
    def commit(self, now): pass
    def schedule(self, time, tag): pass
    def publish_at(self, time): pass
    def place(self, traj, worker, restore, delay_s): pass
    def evict(self, traj): pass
    def kv_committed(self, worker): return sum(t.context for t in self.workers[worker].residents.values())
    def stats(self, worker): return self.figures[worker]


def _workers() -> list[Worker]:
    """A fast worker (affinity rank 0) and a slow one, as a router's --config describes them."""
    return [Worker(id=i, accelerator=f"cpu-{i}", cluster="c", tp=1, kv_capacity=KV, max_num_seqs=16, rank=i)
            for i in range(2)]


def _specs(n: int, rng: random.Random) -> list[TrajectorySpec]:
    classes = ["agent", "rlvr", "rlvr", "rlhf", "agent"]
    out, group = [], 0
    for i in range(n):
        cls = classes[i % len(classes)]
        if not (cls == "rlvr" and i % 10 == 2):   # pairs of RLVR sessions share a prompt group
            group += 1
        out.append(TrajectorySpec(id=i, group=group, prompt_len=rng.randint(32, 512),
                                  response=HiddenLength(1, KEY), workload_class=cls))
    return out


class _Watched(Controller):
    """A controller that lists the actions it applies while `watching` is a list (a compiled
    controller's method takes no patch)."""

    watching: list | None = None

    def apply(self, action, now: float) -> None:
        if self.watching is not None:
            self.watching.extend(_keys(action))
        super().apply(action, now)


def _controller(policy_name: str, specs: list[TrajectorySpec]) -> tuple[_Watched, RecordedBackend]:
    workers = _workers()
    backend = RecordedBackend(workers)
    policy = router_policy(make_settings(workers=["http://a:1", "http://b:1"], policy=policy_name, classes=MIX))
    ctl = _Watched(policy, backend, workers, [Trajectory(s) for s in specs], batch_size=len(specs),
                     params=ControllerSpec(eta=ETA), train_time_s=0.0)
    return ctl, backend


def record(policy_name: str, specs: list[TrajectorySpec], steps: int, seed: int) -> list[tuple]:
    """Drive a controller with seeded events; the events, as plain tuples."""
    rng = random.Random(seed)
    ctl, backend = _controller(policy_name, specs)
    events: list[tuple] = [("decide", 0.0)]
    ctl._decide(0.0)
    preempted = [0, 0]
    for step in range(1, steps + 1):
        t = step * 0.25
        for traj in sorted(ctl.trajectories.values(), key=lambda tr: tr.id):
            if traj.state is State.RESIDENT and rng.random() < 0.5:     # its stream brought tokens
                events.append(("progress", t, traj.id, rng.randint(16, 128)))
                _apply_sim(ctl, events[-1])
            if traj.state is State.RESIDENT and rng.random() < 0.3:
                more = traj.workload_class == "agent" and traj.turn < 2
                ev = ("turn_end" if more else "finish", t, traj.id, rng.randint(16, 256))
            elif traj.state is State.TOOL and rng.random() < 0.5:
                ev = ("tool_return", t, traj.id, rng.randint(8, 128))
            else:
                continue
            events.append(ev)
            _apply_sim(ctl, ev)
        figures = []
        for w in ctl.workers:
            preempted[w.id] += rng.random() < 0.1
            figures.append((1024 * rng.randint(0, 8), len(w.residents), rng.choice([0, 0, 0, 1]), preempted[w.id]))
        events.append(("stats", t, tuple(figures)))
        _apply_sim(ctl, events[-1], backend)
        events.append(("decide", t))
        ctl._decide(t)
    return events


def _apply_sim(ctl: Controller, ev: tuple, backend: RecordedBackend | None = None) -> None:
    kind, t = ev[0], ev[1]
    if kind == "stats":
        for wid, fig in enumerate(ev[2]):
            backend.figures[wid] = EngineStats(*fig)
        return
    traj = ctl.trajectories[ev[2]]
    if kind == "tool_return":
        ctl._handle(ToolReturned(traj, t, ev[3]))
        return
    traj.tokens += ev[3]
    if kind == "progress":
        return
    ctl._handle(TurnEnded(traj, t) if kind == "turn_end" else Finished(traj, t))


def replay_sim(policy_name: str, specs: list[TrajectorySpec], events: list[tuple]) -> list[list[tuple]]:
    ctl, backend = _controller(policy_name, specs)
    decisions = []
    for ev in events:
        if ev[0] == "decide":
            ctl.watching = []
            ctl._decide(ev[1])
            decisions.append(ctl.watching)
            ctl.watching = None
        else:
            _apply_sim(ctl, ev, backend)
    return decisions


def replay_live(policy_name: str, specs: list[TrajectorySpec], events: list[tuple],
                resumable: bool = True) -> list[list[tuple]]:
    settings = make_settings(workers=["http://a:1", "http://b:1"], policy=policy_name, classes=MIX)
    live = LiveState(router_policy(settings), _workers(), settings.target_mix, session_ttl_s=1e9,
                     batch_size=len(specs), eta=ETA)  # the recording controller's trainer batch and budget
    sessions = [live.new_session(f"s{s.id}", s.workload_class, s.prompt_len, s.group, 0.0, resumable=resumable)
                for s in specs]            # by default, clients that resume an evicted request (AReaL's)
    decisions = []
    for ev in events:
        kind, t = ev[0], ev[1]
        if kind == "decide":
            decisions.append([k for a in live.decide(t) for k in _keys(a)])
        elif kind == "stats":
            for wid, (kv, running, waiting, preemptions) in enumerate(ev[2]):
                live.set_figures(wid, EngineMetrics(kv / KV, running, waiting, preemptions, 0, 0))
        else:
            session = sessions[ev[2]]
            if kind == "progress":
                session.traj.tokens += ev[3]            # what the service's `progress` counts
            elif kind == "tool_return":
                live.continuation(session, session.traj.context + ev[3], t)
            elif kind == "turn_end":
                live.turn_ended(session, ev[3], t)
            else:
                live.finished(session, ev[3], t)
    return decisions


def _keys(action) -> list[tuple]:
    """An action as comparable tuples, a batch as its steps."""
    steps = action.actions if isinstance(action, Batch) else (action,)
    return [(type(a).__name__, getattr(a, "worker", None), getattr(a, "traj", None)) for a in steps]


@pytest.mark.parametrize("policy_name", ["cadence", "misa+cadence", "areal", "least-loaded", "misa+cache-aware",
                                         "cache-aware", "sticky-least-loaded", "misa+round-robin", "consistent-hash"])
def test_live_adapter_makes_the_simulators_decisions(policy_name: str) -> None:
    specs = _specs(40, random.Random(1))
    events = record(policy_name, specs, steps=60, seed=7)
    sim = replay_sim(policy_name, specs, events)
    live = replay_live(policy_name, specs, events)
    assert len({a[2] for d in sim for a in d if a[0] == "Admit"}) >= len(specs) // 3   # sessions admitted,
    assert any(a[0] == "Place" for d in sim for a in d)  # and their next turns placed
    if policy_name == "cadence":                          # KV-bound: its residency control acted
        assert any(a[0] == "Evict" for d in sim for a in d)
    assert live == sim


def test_cadence_never_evicts_a_client_that_does_not_resume() -> None:
    """The same sequence from clients that would lose an aborted reply: no eviction, every session placed."""
    specs = _specs(40, random.Random(1))
    events = record("cadence", specs, steps=60, seed=7)
    live = replay_live("cadence", specs, events, resumable=False)
    kinds = {a[0] for d in live for a in d}
    assert "Evict" not in kinds and {a[2] for d in live for a in d if a[0] == "Admit"} == {s.id for s in specs}


def test_misa_holds_sessions_in_the_recorded_sequence() -> None:
    """The sequence exercises the gate: MISA-T admits fewer sessions at first than plain cache-aware."""
    specs = _specs(40, random.Random(1))
    first_misa = replay_live("misa+cache-aware", specs, [("decide", 0.0)])[0]
    first_plain = replay_live("cache-aware", specs, [("decide", 0.0)])[0]
    assert len(first_misa) < len(first_plain) == len(specs)
