"""The controller's journal: every state change it makes, on disk, so a restarted process resumes.

One SQLite file in WAL mode, one writer (an exclusive lock file beside it refuses a second process),
records buffered in memory and committed in one transaction per flush (an explicit BEGIN: the
connection autocommits), so the cost per token is a list append. Each record carries a CRC: reading
stops at the first record that is unreadable or fails its check and says how many it dropped. What the records mean, and the restore: journal_state.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

SCHEMA = ("CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
          "traj INTEGER, body TEXT NOT NULL, crc INTEGER NOT NULL)")


class JournalError(RuntimeError):
    """The journal cannot be used (locked by another process, not writable); the message says why."""


@dataclass(frozen=True, slots=True)
class Record:
    kind: str                 # admit, tokens, version, tool, returned, complete, batch, publish, worker, run
    traj: int | None
    body: dict


class JournalSink(Protocol):
    """Where the controller writes its state changes (a `Journal`, or nothing)."""

    def log(self, kind: str, traj: int | None = None, **body: object) -> None: ...

    def flush(self, force: bool = False) -> None: ...

    def published(self, version: int, consumed: Sequence[int]) -> None: ...


class NullJournal:
    """No journal: every call does nothing."""

    def log(self, kind: str, traj: int | None = None, **body: object) -> None:
        pass

    def flush(self, force: bool = False) -> None:
        pass

    def published(self, version: int, consumed: Sequence[int]) -> None:
        pass


@dataclass
class Recovered:
    """What reading a journal gave back: the records up to the last complete one, and what was not."""

    records: list[Record]
    dropped: str = ""          # empty: the whole file was read


_encode = json.JSONEncoder(separators=(",", ":")).encode   # json.dumps(..., separators=) builds one a call


def _crc(kind: str, traj: int | None, body: str) -> int:
    return zlib.crc32(f"{kind}|{traj}|{body}".encode())


def _lock(path: Path) -> int:
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise JournalError(f"journal: cannot create the lock file {path}.lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise JournalError(f"journal: {path} is in use by another process (pid {holder}); "
                           "one process at a time may own a journal") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def read_records(path: Path) -> Recovered:
    """Every record of the journal at `path` in order, up to the first that cannot be read."""
    if not path.exists() or path.stat().st_size == 0:
        return Recovered([])
    out: list[Record] = []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return Recovered([], f"the journal could not be opened ({exc}): nothing recovered")
    try:
        total = None
        try:
            total = db.execute("SELECT count(*) FROM records").fetchone()[0]
        except sqlite3.Error:
            pass
        for seq, kind, traj, body, crc in db.execute("SELECT seq, kind, traj, body, crc FROM records ORDER BY seq"):
            if _crc(kind, traj, body) != crc:
                return Recovered(out, f"record {seq} fails its checksum: it and {_rest(total, out)} after it dropped")
            out.append(Record(kind, traj, json.loads(body)))
    except (sqlite3.Error, ValueError) as exc:
        return Recovered(out, f"reading stopped after {len(out)} records ({exc}); {_rest(total, out)} dropped")
    finally:
        db.close()
    return Recovered(out)


def _rest(total: int | None, read: list[Record]) -> str:
    return "an unknown number" if total is None else str(max(0, total - len(read) - 1))


@dataclass
class Journal:
    """The journal at `path`, owned by this process from `open()` until `close()`."""

    path: Path
    flush_every_s: float = 0.2            # a flush commits at most this often, unless forced
    _db: sqlite3.Connection | None = None
    _lock_fd: int | None = None
    _buffer: list[tuple[str, int | None, str, int]] = field(default_factory=list)
    _tokens: dict[int, list[int]] = field(default_factory=dict)   # chunks since the last flush, by trajectory
    _last_flush: float = 0.0
    busy_s: float = 0.0       # wall time inside flush() and published(), its cost beside a list append a token
    cpu_s: float = 0.0        # ... and this thread's CPU time there
    recovered: Recovered = field(default_factory=lambda: Recovered([]))

    @classmethod
    def open(cls, path: str | Path, flush_every_s: float = 0.2) -> Journal:
        """Lock the journal, read what it holds (`recovered`), and rewrite it from those records
        when part of it was lost (the damaged file is kept beside it, `.damaged`)."""
        path = Path(path)
        if not path.parent.is_dir():
            raise JournalError(f"journal: the folder of {path} does not exist")
        if path.is_dir():
            raise JournalError(f"journal: {path} is a folder; give a file path")
        j = cls(path, flush_every_s)
        j._lock_fd = _lock(path)
        j.recovered = read_records(path)
        if j.recovered.dropped:
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{path}{suffix}").exists():
                    os.replace(f"{path}{suffix}", f"{path}.damaged{suffix}")
        try:
            j._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            j._db.execute("PRAGMA journal_mode=WAL")
            j._db.execute("PRAGMA synchronous=NORMAL")
            j._db.execute(SCHEMA)
        except sqlite3.Error as exc:
            j.close()
            raise JournalError(f"journal: cannot write {path}: {exc}") from None
        if j.recovered.dropped:
            for r in j.recovered.records:
                j.log(r.kind, r.traj, **r.body)
            j.flush(force=True)
        return j

    def log(self, kind: str, traj: int | None = None, **body: object) -> None:
        text = _encode(body)
        self._buffer.append((kind, traj, text, _crc(kind, traj, text)))

    def tokens(self, traj: int, ids: list[int]) -> None:
        """Token ids a trajectory received: one record per trajectory and flush, whatever the chunks
        (replay reads a trajectory's tokens in order, in any place among its other records)."""
        kept = self._tokens.get(traj)
        if kept is None:
            self._tokens[traj] = list(ids)
        else:
            kept.extend(ids)

    def flush(self, force: bool = False) -> None:
        """Commit what was logged, if `flush_every_s` passed since the last commit (or `force`)."""
        started, cpu = time.perf_counter(), time.thread_time()
        now = time.monotonic()
        if (self._buffer or self._tokens) and (force or now - self._last_flush >= self.flush_every_s) \
                and self._db is not None:
            self._commit(self._take())
            self._last_flush = now
        self.busy_s += time.perf_counter() - started
        self.cpu_s += time.thread_time() - cpu

    def _take(self) -> list[tuple[str, int | None, str, int]]:
        """The buffered records, the token chunks as one `tokens` record per trajectory (its body
        written here, without an encoder, as `json.dumps` would write it)."""
        for traj, ids in self._tokens.items():
            text = '{"ids":[' + ",".join(map(str, ids)) + "]}"
            self._buffer.append(("tokens", traj, text, _crc("tokens", traj, text)))
        rows, self._buffer, self._tokens = self._buffer, [], {}
        return rows

    def rewrite(self, records: Iterable[Record]) -> None:
        """Replace every record, the buffered ones included, by `records`, in one commit: compaction
        by an owner that knows what its records leave (router/sessions_journal.py)."""
        self._buffer, self._tokens = [], {}
        for r in records:
            self.log(r.kind, r.traj, **r.body)
        self._commit(self._take(), everything=True)
        self._last_flush = time.monotonic()

    def _commit(self, rows: list[tuple[str, int | None, str, int]], delete: Sequence[int] = (),
                everything: bool = False) -> None:
        """`rows` written and the records of trajectories `delete` (or, `everything`, all records
        before them) deleted, in one transaction (the connection is in autocommit mode: without
        BEGIN each row would be a commit of its own)."""
        if self._db is None or not (rows or delete or everything):
            return
        try:
            self._db.execute("BEGIN")
            try:
                if everything:
                    self._db.execute("DELETE FROM records")
                self._db.executemany("INSERT INTO records (kind, traj, body, crc) VALUES (?, ?, ?, ?)", rows)
                if delete:
                    ids = list(delete)
                    self._db.execute(f"DELETE FROM records WHERE traj IN ({','.join('?' * len(ids))})", ids)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise JournalError(f"journal: cannot write {self.path}: {exc}") from None

    def published(self, version: int, consumed: Sequence[int]) -> None:
        """Version `version` is out, its batch consumed: durable now, and the consumed trajectories'
        records go (their batch's record holds what a restart needs of them): the journal stays
        bounded. One commit for both."""
        started, cpu = time.perf_counter(), time.thread_time()
        self.log("publish", v=version)
        self._commit(self._take(), consumed)
        self._last_flush = time.monotonic()
        self.busy_s += time.perf_counter() - started
        self.cpu_s += time.thread_time() - cpu

    def size_bytes(self) -> int:
        return sum(Path(f"{self.path}{s}").stat().st_size for s in ("", "-wal") if Path(f"{self.path}{s}").exists())

    def close(self) -> None:
        if self._db is not None:
            try:
                self.flush(force=True)
            finally:
                self._db.close()
                self._db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
