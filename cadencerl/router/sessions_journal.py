"""The router's session state in a journal (core/journal.py), so a restarted router keeps each
multi-turn session on the worker that holds its prefix cache, and its class counts.

Recorded: a session parked after a reply (its key, class, group, context, home worker), a session
gone (ended, withdrawn), a class finished. Restored: each parked session, parked again on its home
at that worker's current version; the finished-class counts (the mix the admission layer steers).
Sessions without a key cannot be found again by a client and are not recorded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from cadencerl.core.journal import Journal, Record
from cadencerl.core.residency import attach, start, to_tool

log = logging.getLogger("cadencerl.router")


def parked_body(session) -> dict:
    t = session.traj
    return dict(key=session.key, cls=t.workload_class, group=t.group, context=t.context, home=t.home,
                route_key=t.spec.route_key, resumable=t.resumable)


def replay_sessions(records: list[Record]) -> tuple[OrderedDict, list[str]]:
    """The parked sessions by key (oldest park first) and the finished classes in order."""
    parked: OrderedDict = OrderedDict()
    finished: list[str] = []
    for r in records:
        if r.kind == "session":
            parked.pop(r.body["key"], None)
            parked[r.body["key"]] = r.body
        elif r.kind == "session-gone":
            parked.pop(r.body["key"], None)
        elif r.kind == "class-finished":
            finished.append(r.body["cls"])
    return parked, finished


def restore_sessions(state, records: list[Record], now: float = 0.0) -> dict:
    """Put `state` (a LiveState with its workers, no session yet) back: every parked session on its
    home, the finished-class counts. Returns what was restored."""
    parked, finished = replay_sessions(records)
    ctl, restored, skipped = state.controller, 0, 0
    for b in parked.values():
        if b["home"] is None or not 0 <= b["home"] < len(state.workers):
            skipped += 1
            continue
        w = state.workers[b["home"]]
        session = state.new_session(b["key"], b["cls"], b["context"], b["group"], now, route_key=b["route_key"],
                                    resumable=b["resumable"])
        traj = session.traj
        ctl.fresh.take(traj)
        start(traj, w.version, ctl.active_by_class, now)
        ctl.credits.record(w.version)
        attach(traj, w, state.workers, now)
        to_tool(traj, state.workers, ctl.tool_waiting, now)
        session.parked_at = now
        state.parked[traj.id] = session
        restored += 1
    for cls in finished:
        state.completed[cls] += 1
        state.recent.append(cls)
    return {"sessions_restored": restored, "sessions_skipped": skipped, "finished_classes": len(finished)}


def open_sessions_journal(state, path: str | None) -> Journal | None:
    """Own the journal at `path` for `state` (None: no journal), taking up the sessions it holds."""
    if path is None:
        return None
    journal = Journal.open(path)
    if journal.recovered.dropped:
        log.warning("router journal %s: %s", path, journal.recovered.dropped)
    report = restore_sessions(state, journal.recovered.records)
    if journal.recovered.records:
        log.warning("router journal %s: %s", path, report)
    state.journal = journal
    return journal
