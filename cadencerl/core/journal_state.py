"""What a journal's records say about a run, and a fresh controller put back in that state.

Records (core/journal.py) are replayed into `JournalState`: trajectories admitted (tag, versions,
tokens so far, tool calls made and returned), completed in order, batches formed and versions
published, each worker's version. `restore` applies it to a controller that has not decided yet:
consumed trajectories are done, completed-unconsumed ones wait for their batch (a batch formed but
not published is formed again with the same samples), one waiting on a tool waits on it again
(the call made anew), every other admitted one is pending with its tokens and observations so far
(resumed by token transfer + re-prefill), credits and versions carry on.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cadencerl.core.journal import Record
from cadencerl.core.trainer import TrainingBatch
from cadencerl.core.trajectory import State, Trajectory


@dataclass
class Admitted:
    tag: int
    versions: list[int]
    ids: list[int] = field(default_factory=list)   # generated token ids so far
    completed: bool = False
    turn_ends: list[int] = field(default_factory=list)      # generated tokens at each tool call made
    observations: list[int] = field(default_factory=list)   # each returned tool's observation length

    @property
    def on_tool(self) -> bool:
        """A tool call made and not returned when the journal ends (it is made again)."""
        return len(self.turn_ends) > len(self.observations)


@dataclass
class FormedBatch:
    index: int
    ids: list[int]
    tags: list[int]
    tokens: list[int]
    versions: list[list[int]]


@dataclass
class JournalState:
    fingerprint: str | None = None
    admitted: dict[int, Admitted] = field(default_factory=dict)
    completion_order: list[int] = field(default_factory=list)
    batches: list[FormedBatch] = field(default_factory=list)
    published: int = 0
    worker_versions: dict[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.fingerprint is None


def fingerprint(specs: Iterable, batch_size: int, eta: int, prompts: dict[int, list[int]] | None = None,
                seed: int = 0) -> str:
    """What must match for a journal to belong to this run: the workload (its prompts, or the seed
    of its synthetic ones) and the trainer's knobs."""
    text = repr([(s.id, s.group, s.prompt_len, s.workload_class) for s in specs]) + f"|{batch_size}|{eta}|{seed}"
    if prompts:
        text += repr(sorted((k, zlib.crc32(repr(v).encode())) for k, v in prompts.items()))
    return f"{zlib.crc32(text.encode()):08x}"


def replay(records: Iterable[Record]) -> JournalState:
    """The state the records leave: pure, in record order."""
    st = JournalState()
    for r in records:
        b = r.body
        if r.kind == "run":
            st.fingerprint = b["fingerprint"]
        elif r.kind == "admit":
            st.admitted[r.traj] = Admitted(b["tag"], [b["tag"]])
        elif r.kind == "tokens" and r.traj in st.admitted:
            st.admitted[r.traj].ids.extend(b["ids"])
        elif r.kind == "tool" and r.traj in st.admitted:
            st.admitted[r.traj].turn_ends.append(b["n"])
        elif r.kind == "returned" and r.traj in st.admitted:
            st.admitted[r.traj].observations.append(b["obs"])
        elif r.kind == "version" and r.traj in st.admitted:
            st.admitted[r.traj].versions.append(b["v"])
        elif r.kind == "complete" and r.traj in st.admitted:
            st.admitted[r.traj].completed = True
            st.completion_order.append(r.traj)
        elif r.kind == "batch":
            st.batches.append(FormedBatch(b["k"], b["ids"], b["tags"], b["tokens"], b["versions"]))
        elif r.kind == "publish":
            st.published = b["v"]
        elif r.kind == "worker":
            st.worker_versions[b["w"]] = b["v"]
    return st


def batch_body(batch: TrainingBatch, trajectories: dict[int, Trajectory]) -> dict:
    """A formed batch's record: enough to restore its samples once their own records are compacted."""
    ts = [trajectories[i] for i in batch.trajectory_ids]
    return dict(k=batch.index, ids=list(batch.trajectory_ids), tags=[t.tag for t in ts], tokens=[t.tokens for t in ts],
                versions=[list(t.versions) for t in ts])


SeedTokens = Callable[[Trajectory, list[int], bool, list[int], list[int]], None]


def restore(ctl, st: JournalState, seed_tokens: SeedTokens, set_version: Callable[[int, int], None],
            call_tool: Callable[[Trajectory], None]) -> dict:
    """Put controller `ctl` (built, not yet run) in the state `st` records. `seed_tokens(traj, ids,
    completed, turn_ends, observations)` hands a trajectory's generated ids to the backend, with
    where each returned tool's observation (of that length) goes among them; `set_version(worker,
    v)` moves a worker to its journaled version; `call_tool(traj)` makes the tool call of `traj`'s
    current turn again. Returns counts of what was restored."""
    trainer, credits = ctl.trainer, ctl.credits
    done_batches = [b for b in st.batches if b.index < st.published]
    open_batch = next((b for b in st.batches if b.index == st.published), None)
    consumed: set[int] = set()
    taken: list[Trajectory] = []
    for b in done_batches:
        for tid, tag, n, versions in zip(b.ids, b.tags, b.tokens, b.versions):
            t = ctl.trajectories[tid]
            t.tag, t.versions, t.tokens, t.state, t.admitted_at, t.completed_at = tag, versions, n, State.DONE, 0.0, 0.0
            credits.record(tag)
            credits.consumed(tag)
            trainer.staleness[b.index - tag] += 1
            consumed.add(tid)
            taken.append(t)
        trainer.batches.append(TrainingBatch(b.index, tuple(b.ids)))
        trainer.batch_classes.append(Counter(ctl.trajectories[i].workload_class for i in b.ids))
    pending = on_tool = 0
    for tid, a in st.admitted.items():
        if tid in consumed:
            continue
        t = ctl.trajectories[tid]
        t.tag, t.versions, t.tokens, t.admitted_at = a.tag, list(a.versions), len(a.ids), 0.0
        t.turn, t.observation_tokens = len(a.observations), sum(a.observations)
        credits.record(a.tag)
        taken.append(t)
        seed_tokens(t, a.ids, a.completed, a.turn_ends[: len(a.observations)], a.observations)
        if a.completed:
            continue
        ctl.active_by_class[t.workload_class] = ctl.active_by_class.get(t.workload_class, 0) + 1
        t.departed_at = 0.0
        if a.on_tool:
            t.state = State.TOOL
            ctl.tool_waiting[t.version] = ctl.tool_waiting.get(t.version, 0) + 1
            call_tool(t)
            on_tool += 1
        else:
            t.state = State.PENDING
            ctl.pending.add(t)
            pending += 1
    for tid in st.completion_order:
        if tid not in consumed:
            t = ctl.trajectories[tid]
            t.state, t.completed_at = State.DONE, 0.0
            trainer.finished(t)
    ctl.fresh.take_all(taken)
    trainer.consumed = len(consumed)
    trainer.version = st.published
    trainer.publish_times = [0.0] * st.published
    ctl.done = len(consumed) + sum(1 for tid in st.completion_order if tid not in consumed)
    for w in ctl.workers:
        v = st.worker_versions.get(w.id, 0)
        if v > w.version:
            w.version = v
            set_version(w.id, v)
    if open_batch is not None:
        publish_at = trainer.reform(open_batch.ids, 0.0)
        ctl.backend.publish_at(publish_at)
    return {"consumed": len(consumed), "completed_unconsumed": ctl.done - len(consumed), "resumed_trajectories": pending,
            "tool_calls_made_again": on_tool, "published": st.published, "batch_handed_again": open_batch is not None}
