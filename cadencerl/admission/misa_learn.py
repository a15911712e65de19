"""What MISA-T learns of each workload class from sessions it saw finish: observable figures only.

A session's demand is block-time: the KV it holds times how long it holds it, tool gaps included
(MISA-T's residency-time-aware accounting). Neither is known when a session starts (lengths are
sealed): both are learned from completed sessions of the class, as the engine and router see them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.core.trajectory import State, Trajectory

WARMUP = 8          # completions of a class before its learned figures replace the prior
EWMA = 0.1          # weight of one completion once warmed up
RATE_EWMA = 0.2     # weight of one interval in the completion rate
PRIOR_REPLY = 1024  # tokens a reply is assumed to add before any session finished


@dataclass
class ClassStats:
    footprint: float = 0.0      # mean KV tokens a session holds over its residency
    duration: float = 0.0       # seconds from admission to completion (tool gaps included)
    completed: int = 0

    def observe(self, footprint: float, duration: float) -> None:
        if self.completed < WARMUP:
            n = self.completed
            self.footprint = (self.footprint * n + footprint) / (n + 1)
            self.duration = (self.duration * n + duration) / (n + 1)
        else:
            self.footprint += EWMA * (footprint - self.footprint)
            self.duration += EWMA * (duration - self.duration)
        self.completed += 1

    @property
    def warm(self) -> bool:
        return self.completed >= WARMUP


@dataclass
class Learner:
    """Sessions MISA-T admitted and has not seen finish; per-class figures of those that did."""

    stats: dict[str, ClassStats] = field(default_factory=dict)
    tracked: dict[int, Trajectory] = field(default_factory=dict)
    rate: float = 0.0               # completions per second (EWMA over look intervals)
    decoded: int = 0                # tokens the tracked sessions streamed back so far (goodput's count)
    _streamed: dict[int, int] = field(default_factory=dict)   # per tracked session, as of the last look
    _last_look: float | None = None

    def track(self, traj: Trajectory) -> None:
        self.tracked[traj.id] = traj

    def learn(self, now: float, count_streamed: bool = True) -> None:
        """Fold in every tracked session that finished since the last look and, `count_streamed`,
        count the tokens every tracked session streamed back since then (`decoded`: the goodput
        climber's figure; reading every session's meter was most of a large simulated pool's look,
        so it is skipped where nothing reads it)."""
        if count_streamed:
            for tid, traj in self.tracked.items():
                streamed = traj.generated
                self.decoded += streamed - self._streamed.get(tid, 0)
                self._streamed[tid] = streamed
        finished = State.DONE
        done = 0
        for traj in [t for t in self.tracked.values() if t.state is finished]:
            del self.tracked[traj.id]
            self._streamed.pop(traj.id, None)
            done += 1
            duration = max(traj.completed_at - traj.admitted_at, 1e-6)
            footprint = (traj.prompt_len + traj.context) / 2
            self.stats.setdefault(traj.workload_class, ClassStats()).observe(footprint, duration)
        if self._last_look is not None and now > self._last_look:
            sample = done / (now - self._last_look)
            self.rate = sample if self.rate == 0.0 else self.rate + RATE_EWMA * (sample - self.rate)
        self._last_look = now

    def held_off_engine(self) -> dict[int, int]:
        """KV tokens per worker held for sessions between turns (on a tool call, or back and not yet
        placed): their prefix stays cached on their home worker for the next turn to hit."""
        held: dict[int, int] = {}
        tool, pending = State.TOOL, State.PENDING
        for traj in self.tracked.values():
            home = traj.home
            if (traj.state is tool or traj.state is pending) and home is not None:
                held[home] = held.get(home, 0) + traj.context
        return held

    def footprint(self, cls: str, prompt_hint: int | None, reply_hint: int | None = None) -> float:
        """A session's mean KV footprint: learned, or before that the larger of a prior and the mean
        context its class's running sessions have already reached. The prior is its prompt plus the
        mean footprint finished sessions of any class showed (PRIOR_REPLY before any finished): a
        footprint, prompt included, standing in for a reply, so it errs high and the first caps low;
        no more than the reply its request allows (`reply_hint`: its max_tokens), where it names one
        (a later turn's growth, which that does not bound, is what the running sessions show)."""
        st = self.stats.get(cls)
        if st is not None and st.warm:
            return st.footprint
        seen = [s.footprint for s in self.stats.values() if s.completed]
        added = sum(seen) / len(seen) if seen else PRIOR_REPLY
        if reply_hint is not None:
            added = min(added, reply_hint)
        prior = (prompt_hint if prompt_hint is not None else 512) + added
        live = [t.context for t in self.tracked.values() if t.workload_class == cls and t.state is not State.DONE]
        return max(prior, sum(live) / len(live)) if live else prior

    def all_warm(self, classes) -> bool:
        """Has every class finished enough sessions for its figures to be measured ones?"""
        return all(c in self.stats and self.stats[c].warm for c in classes)

    def duration(self, cls: str) -> float | None:
        """Expected seconds from admission to completion, once learned."""
        st = self.stats.get(cls)
        return st.duration if st is not None and st.warm else None
