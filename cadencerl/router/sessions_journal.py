"""The router's session state in a journal (core/journal.py), so a restarted router keeps each
multi-turn session on the worker that holds its prefix cache, its class counts and its cohorts.

Recorded: a session parked after a reply (key, class, group, context, home worker), a session gone,
a class finished, the admission layer's books when they change (MISA-T: admitted per class and per
version). Restored: each parked session on its home at that worker's current version, the counts,
the books. Sessions without a key cannot be found again by a client and are not recorded. The
journal is rewritten as what its records leave (one record per live session, one of the class
counts, one of the books) on open and whenever the records since outnumber twice the live sessions
and `compact_after`."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cadencerl.core.journal import Journal, Record
from cadencerl.core.residency import attach, start, to_tool
from cadencerl.core.view import AdmissionGate

log = logging.getLogger("cadencerl.router")
RECENT = 256          # the finished classes kept in order (LiveState.recent's length)


def parked_body(session) -> dict:
    t = session.traj
    return dict(key=session.key, cls=t.workload_class, group=t.group, context=t.context, home=t.home,
                route_key=t.spec.route_key, resumable=t.resumable)


@dataclass
class SessionRecords:
    """What a router journal's records leave: the parked sessions by key (oldest park first), the
    finished sessions per class and the latest finished classes in order."""

    parked: OrderedDict = field(default_factory=OrderedDict)
    counts: Counter = field(default_factory=Counter)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    books: dict = field(default_factory=dict)      # the admission layer's (AdmissionGate.books)

    def apply(self, kind: str, body: dict) -> None:
        if kind == "session":
            self.parked.pop(body["key"], None)
            self.parked[body["key"]] = body
        elif kind == "session-gone":
            self.parked.pop(body["key"], None)
        elif kind == "class-finished":
            self.counts[body["cls"]] += 1
            self.recent.append(body["cls"])
        elif kind == "classes":             # a compaction's base: the counts up to it
            self.counts, self.recent = Counter(body["counts"]), deque(body["recent"], maxlen=RECENT)
        elif kind == "admission":
            self.books = body

    def records(self) -> list[Record]:
        """The fewest records that leave this state."""
        base = [Record("classes", None, {"counts": dict(self.counts), "recent": list(self.recent)})]
        books = [Record("admission", None, self.books)] if self.books else []
        return base + books + [Record("session", None, b) for b in self.parked.values()]


def replay_sessions(records: Iterable[Record]) -> SessionRecords:
    out = SessionRecords()
    for r in records:
        out.apply(r.kind, r.body)
    return out


def restore_sessions(state, records: Sequence[Record], now: float = 0.0) -> dict:
    """Put `state` (a LiveState with its workers, no session yet) back: every parked session on its
    home, the finished-class counts, the admission layer's books. Returns what was restored."""
    replayed = replay_sessions(records)
    ctl, restored, skipped = state.controller, 0, 0
    for b in replayed.parked.values():
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
    state.completed.update(replayed.counts)
    state.recent.extend(replayed.recent)
    gate = state.controller.gate
    if replayed.books and gate is not None:
        gate.take_up(replayed.books)
    return {"sessions_restored": restored, "sessions_skipped": skipped,
            "finished_classes": sum(replayed.counts.values()), "admission_books": bool(replayed.books)}


@dataclass
class SessionsJournal:
    """The router's sink (LiveState.journal): each record goes to `journal` and into the state it
    leaves (`mirror`), which the journal is rewritten as once it holds too many records. The
    admission layer's books (`gate`) are recorded at a flush when they changed."""

    journal: Journal
    mirror: SessionRecords = field(default_factory=SessionRecords)
    compact_after: int = 1024
    gate: AdmissionGate | None = None
    compactions: int = 0
    _written: int = 0           # records written since the last compaction

    def log(self, kind: str, traj: int | None = None, **body: object) -> None:
        self.journal.log(kind, traj, **body)
        self.mirror.apply(kind, body)
        self._written += 1

    def flush(self, force: bool = False) -> None:
        books = self.gate.books() if self.gate is not None else {}
        if books != self.mirror.books:
            self.log("admission", **books)
        if self._written > max(self.compact_after, 2 * len(self.mirror.parked)):
            self.compact()
        else:
            self.journal.flush(force)

    def published(self, version: int, consumed: Sequence[int]) -> None:
        self.journal.published(version, consumed)

    def compact(self) -> None:
        """Rewrite the journal as the state its records leave (durable when this returns)."""
        records = self.mirror.records()
        self.journal.rewrite(records)
        self._written = len(records)
        self.compactions += 1

    @property
    def path(self) -> Path:
        return self.journal.path

    def size_bytes(self) -> int:
        return self.journal.size_bytes()

    def close(self) -> None:
        self.journal.close()


def open_sessions_journal(state, path: str | None, compact_after: int = 1024) -> SessionsJournal | None:
    """Own the journal at `path` for `state` (None: no journal), taking up the sessions it holds,
    and compact it to them."""
    if path is None:
        return None
    journal = Journal.open(path)
    if journal.recovered.dropped:
        log.warning("router journal %s: %s", path, journal.recovered.dropped)
    report = restore_sessions(state, journal.recovered.records)
    if journal.recovered.records:
        log.warning("router journal %s: %s", path, report)
    mirror = replay_sessions(journal.recovered.records)
    for key in [k for k in mirror.parked if state.session(k) is None]:    # not restored: gone
        del mirror.parked[key]
    sink = SessionsJournal(journal, mirror, compact_after, state.controller.gate)
    sink.compact()
    state.journal = sink
    return sink
