"""The journal on its own: records back in order, a damaged file recovered up to its last complete
record with what was dropped said (never a traceback), compaction of what was consumed, and the
replay of records into the state a restart restores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cadencerl.core.journal import Journal, JournalError, read_records
from cadencerl.core.journal_state import replay


def write(path: Path, n: int) -> None:
    j = Journal.open(path)
    j.log("run", fingerprint="f")
    for i in range(n):
        j.log("admit", i, tag=0)
        j.log("tokens", i, ids=[i, i + 1])
    j.close()


def test_records_come_back_in_order_and_replay_to_the_state(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = Journal.open(p)
    j.log("run", fingerprint="abc")
    j.log("admit", 3, tag=0)
    j.log("tokens", 3, ids=[5, 6])
    j.log("version", 3, v=1)
    j.log("tokens", 3, ids=[7])
    j.log("admit", 4, tag=1)
    j.log("complete", 4, n=0)
    j.log("batch", k=0, ids=[4], tags=[1], tokens=[0], versions=[[1]])
    j.log("worker", w=1, v=1)
    j.close()
    st = replay(Journal.open(p).recovered.records)
    assert st.fingerprint == "abc" and st.admitted[3].ids == [5, 6, 7] and st.admitted[3].versions == [0, 1]
    assert st.completion_order == [4] and st.batches[0].ids == [4] and st.worker_versions == {1: 1}
    assert st.published == 0 and not st.admitted[3].completed


def test_a_multi_turn_sessions_tool_calls_replay_to_its_turns(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = Journal.open(p)
    for tid in (1, 2):
        j.log("admit", tid, tag=0)
        j.tokens(tid, [10, 11, 12])
        j.log("tool", tid, n=3)
    j.log("returned", 1, obs=5)        # session 1 is on its second turn, session 2 still on its tool
    j.tokens(1, [13])
    j.close()
    st = replay(read_records(p).records)
    one, two = st.admitted[1], st.admitted[2]
    assert (one.ids, one.turn_ends, one.observations, one.on_tool) == ([10, 11, 12, 13], [3], [5], False)
    assert (two.ids, two.turn_ends, two.observations, two.on_tool) == ([10, 11, 12], [3], [], True)


def test_a_checksum_failure_keeps_what_came_before_and_says_what_was_dropped(tmp_path: Path) -> None:
    p = tmp_path / "j"
    write(p, 10)
    db = sqlite3.connect(p)
    with db:
        db.execute("UPDATE records SET body = '{\"ids\":[9,9]}' WHERE seq = 8")   # a torn write
    db.close()
    rec = read_records(p)
    assert len(rec.records) == 7 and "record 8 fails its checksum" in rec.dropped and "13 after it" in rec.dropped
    j = Journal.open(p)      # rewritten from what was recovered; the damaged file kept beside it
    assert len(j.recovered.records) == 7 and (tmp_path / "j.damaged").exists()
    j.close()
    assert len(read_records(p).records) == 7 and not read_records(p).dropped


def test_a_truncated_or_garbage_file_recovers_without_a_traceback(tmp_path: Path) -> None:
    p = tmp_path / "j"
    write(p, 3000)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])           # a main file cut short (a disk full, a bad copy)
    rec = read_records(p)
    assert rec.dropped and len(rec.records) < 6001   # SQLite may refuse the whole file: said, not raised
    Journal.open(p).close()
    g = tmp_path / "g"
    g.write_bytes(b"not a database at all" * 100)
    rec = read_records(g)
    assert rec.records == [] and rec.dropped
    j = Journal.open(g)
    assert j.recovered.dropped
    j.close()


def test_publishing_compacts_the_consumed_trajectories_records(tmp_path: Path) -> None:
    p = tmp_path / "j"
    j = Journal.open(p)
    for i in range(4):
        j.log("admit", i, tag=0)
        j.log("complete", i, n=1)
    j.log("batch", k=0, ids=[0, 1], tags=[0, 0], tokens=[1, 1], versions=[[0], [0]])
    j.published(1, [0, 1])
    j.close()
    kinds = [(r.kind, r.traj) for r in read_records(p).records]
    assert all(t not in (0, 1) for _, t in kinds) and ("batch", None) in kinds and ("publish", None) in kinds
    st = replay(read_records(p).records)
    assert st.published == 1 and sorted(st.admitted) == [2, 3]


def test_a_folder_or_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    for path, words in ((tmp_path, "is a folder"), (tmp_path / "none" / "j", "does not exist")):
        with pytest.raises(JournalError, match=words):
            Journal.open(path)
