"""The router's session state through a journal: a router process that dies and starts again on
it keeps each parked multi-turn session on its worker (the prefix cache there) and its class
counts. In-process, on the router's session state (no HTTP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadencerl.core.actions import Place
from cadencerl.core.journal import Journal, read_records
from cadencerl.core.trajectory import State
from cadencerl.router.sessions_journal import open_sessions_journal, restore_sessions
from tests.test_router_live import _state

pytestmark = pytest.mark.timeout(30)


def test_parked_sessions_and_class_counts_survive_a_restart_on_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "router.journal"
    first = _state(workers=3)
    first.journal = Journal.open(path)
    sessions = [first.new_session(f"k{i}", "agent", 100 + i, group=i) for i in range(5)]
    first.decide(0.0)
    homes = {s.key: s.traj.worker for s in sessions}
    assert len(set(homes.values())) > 1           # the sessions are spread: locality is worth keeping
    for s in sessions:
        first.turn_ended(s, 40, 0.5)
    first.end_parked(sessions[0])                 # one ends: it is not restored, its class is counted
    first.journal.close()      # what it had flushed is what a killed router leaves (each park is flushed at once)

    second = _state(workers=3)
    second.journal = Journal.open(path)
    report = restore_sessions(second, read_records(path).records, now=0.0)
    assert report == {"sessions_restored": 4, "sessions_skipped": 0, "finished_classes": 1, "admission_books": False}
    assert second.completed["agent"] == 1 and second.session("k0") is None
    for s in sessions[1:]:
        again = second.session(s.key)
        assert again is not None and again.traj.state is State.TOOL and again.traj.home == homes[s.key]
        assert again.traj.context == s.traj.context
        second.continuation(again, again.traj.context + 20, 1.0)
    placed = second.decide(1.0)
    assert sorted(placed, key=lambda a: a.traj) == sorted(
        (Place(second.session(s.key).traj.id, homes[s.key]) for s in sessions[1:]), key=lambda a: a.traj)
    for s in sessions[1:]:
        second.finished(second.session(s.key), 10, 1.5)
    assert second.live == {} and all(w.sessions == 0 for w in second.workers) and second.completed["agent"] == 5
    second.journal.close()


def test_the_router_service_takes_up_its_journal_and_a_second_router_is_refused(tmp_path: Path, monkeypatch) -> None:
    import socket

    from typer.testing import CliRunner

    from cadencerl.cli.main import app
    from cadencerl.router import serve
    from cadencerl.router.service import RouterService
    from cadencerl.router.settings import make_settings

    path = tmp_path / "router.journal"
    settings = make_settings(workers=["http://127.0.0.1:9", "http://127.0.0.1:10"], journal=str(path))
    first = RouterService(settings)
    s = first.state.new_session("chat-1", next(iter(settings.target_mix)), 80, group=0)
    first.state.decide(0.0)
    home = s.traj.worker
    first.state.turn_ended(s, 30, 0.2)
    served = []
    monkeypatch.setattr(serve, "bind", lambda host, port, reuse_port=False: [socket.socket()])
    monkeypatch.setattr(serve, "serve", lambda settings, socks: served.append(settings) or socks[0].close())
    refused = CliRunner().invoke(app, ["router", "--workers", "http://127.0.0.1:9", "--journal", str(path)])
    assert refused.exit_code != 0 and "in use by another process" in refused.output and not served
    first.journal.close()                      # the first router is gone
    second = RouterService(settings)
    again = second.state.session("chat-1")
    assert again is not None and again.traj.state is State.TOOL and again.traj.home == home
    second.journal.close()


def serve_sessions(st, n: int, t0: float = 1.0) -> None:
    """`n` keyed sessions one after another, each parked once between its two turns, then finished."""
    for i in range(n):
        now = t0 + i
        s = st.new_session(f"short-{i}", "agent", 100, group=i % 4, now=now)
        st.decide(now)
        st.turn_ended(s, 20, now + 0.1)
        st.continuation(s, s.traj.context + 10, now + 0.2)
        st.decide(now + 0.2)
        st.finished(s, 10, now + 0.3)


def test_the_router_journal_stays_bounded_by_its_live_sessions_and_a_restart_restores_them(tmp_path: Path) -> None:
    """3000 sessions served beside 5 that stay parked: compacted, the journal holds about the live
    sessions' records, not the served ones' (the same sessions through an uncompacted journal: its
    size grows with them); a restart restores the 5 and the finished-class count."""
    sizes = {}
    for compacted in (True, False):
        path = tmp_path / f"router-{compacted}.journal"
        st = _state(workers=3)
        sink = open_sessions_journal(st, str(path), compact_after=64) if compacted else Journal.open(path)
        st.journal = sink
        keep = [st.new_session(f"long-{i}", "agent", 100 + i, group=i) for i in range(5)]
        st.decide(0.0)
        for s in keep:
            st.turn_ended(s, 40, 0.5)
        rows = []
        for _ in range(6):
            serve_sessions(st, 500, t0=1.0 + 500 * len(rows))
            rows.append(len(read_records(path).records))
        sink.close()
        sizes[compacted] = path.stat().st_size       # closed: the WAL is checkpointed into the file
        if compacted:
            assert sink.compactions >= 6000 // 64 // 2 and max(rows) <= 64 + 5 + 2, rows
            homes = {s.key: s.traj.home for s in keep}
            again = _state(workers=3)
            reopened = open_sessions_journal(again, str(path))
            assert len(read_records(path).records) == 2 + 5      # compacted on open: classes, books, the 5
            assert all(again.session(k) is not None and again.session(k).traj.home == h for k, h in homes.items())
            assert again.completed["agent"] == 3000 and again.session("short-0") is None
            reopened.close()
        else:
            assert rows[-1] >= 3 * 3000          # uncompacted: a park, a gone and a class record a session
    assert sizes[True] * 10 < sizes[False], sizes


def test_misa_ts_cohorts_survive_a_restart_on_the_journal(tmp_path: Path) -> None:
    """What MISA-T admitted, per class and per version (the cohorts each batch's mix is kept in),
    is what a router started on the journal goes on from; sessions admitted after it add to it."""
    path = str(tmp_path / "router.journal")
    first = _state(workers=3)
    sink = open_sessions_journal(first, path)
    sessions = [first.new_session(f"k{i}", ("agent", "rlvr", "rlhf")[i % 3], 100 + i, group=i) for i in range(7)]
    first.decide(0.0)
    for s in sessions:
        first.turn_ended(s, 40, 0.5)
    first.end_parked(sessions[0])                 # one ends: its class is counted, its admission stays
    books = first.controller.gate.books()
    assert sum(books["admitted"].values()) == 7 and books["cohorts"]
    sink.close()

    second = _state(workers=3)
    assert second.controller.gate.books() != books
    reopened = open_sessions_journal(second, path)
    assert second.controller.gate.books() == books
    late = second.new_session("late", "rlhf", 50, group=99)
    second.decide(1.0)
    assert late.traj.worker is not None
    after = second.controller.gate.books()
    assert after["admitted"]["rlhf"] == books["admitted"]["rlhf"] + 1
    reopened.close()
