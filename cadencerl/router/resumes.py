"""The books of resumable requests: each one's eviction signal while it runs, and each evicted one
until its client re-sends it (matched by the prompt it will send: the old one and the tokens it was
handed, `prompt_keys.resume_group`; samples of one prompt handed back alike are interchangeable, so
each re-send takes the oldest of them). A re-send that never comes ends, without a sample, at the
session TTL."""

from __future__ import annotations

import asyncio
from collections import deque

from cadencerl.core.trajectory import State, Trajectory
from cadencerl.router.live import LiveState, Session
from cadencerl.router.prompt_keys import resume_group


class Resumes:
    def __init__(self) -> None:
        self.running: dict[int, asyncio.Event] = {}             # traj id -> set when it is evicted
        self.evicted_at: dict[int, deque[tuple[Session, float]]] = {}   # resume group -> (session, when), oldest first
        self.paused: set[int] = set()                           # traj ids handed back by a pause

    def start(self, session: Session) -> asyncio.Event:
        """A resumable request goes to its server: the event its relay waits on besides its stream."""
        self.running[session.traj.id] = event = asyncio.Event()
        return event

    def evicted(self, traj: Trajectory) -> None:
        """The engines' hook: the policy (or a version switch) took `traj` off its worker."""
        if (event := self.running.get(traj.id)) is not None:
            event.set()

    def pause(self) -> None:
        """A weight update is coming: every running request is handed back to its client."""
        self.paused.update(self.running)
        for event in self.running.values():
            event.set()

    def ended(self, session: Session) -> None:
        self.running.pop(session.traj.id, None)
        self.paused.discard(session.traj.id)

    def handed_back(self, session: Session, prompt_ids: tuple[int, ...], tokens: list[int], now: float) -> str:
        """Its client got `tokens` and "abort": it will re-send prompt + tokens. Why it was: "pause" or "evicted"."""
        why = "pause" if session.traj.id in self.paused else "evicted"
        self.ended(session)
        self.evicted_at.setdefault(resume_group(prompt_ids, tokens), deque()).append((session, now))
        return why

    def take(self, group: int) -> Session | None:
        """The evicted session a request resumes, if it is one (its prompt's group names it)."""
        waiting = self.evicted_at.get(group)
        if not waiting:
            return None
        session = waiting.popleft()[0]
        if not waiting:
            del self.evicted_at[group]
        return session

    def end_unsent(self, state: LiveState, now: float, ttl_s: float) -> None:
        """End the evicted sessions whose client did not re-send within `ttl_s`: no sample comes of them."""
        for group in list(self.evicted_at):
            waiting = self.evicted_at[group]
            while waiting and now - waiting[0][1] >= ttl_s:
                session = waiting.popleft()[0]
                if session.traj.state is State.RESIDENT:    # placed again (or kept through a pause), never re-sent
                    state.bounce(session, now)
                if session.traj.state is State.PENDING:
                    state.drop_pending(session, now)
            if not waiting:
                del self.evicted_at[group]
