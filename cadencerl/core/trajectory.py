"""The controller's record of one trajectory: observable facts only, plus where it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Protocol

from cadencerl.core.spec import TrajectorySpec


class State(Enum):
    FRESH = "fresh"          # not yet admitted
    PENDING = "pending"      # departed, waiting in P_v for a destination
    RESIDENT = "resident"    # placed on a worker (queued, loading, prefilling or decoding)
    TOOL = "tool"            # between turns, waiting on a tool call
    DONE = "done"


class TokenMeter(Protocol):
    """A live count of tokens generated while resident (the sim computes it from the step counter)."""

    def generated(self) -> int: ...


class Meter:
    """What a resident trajectory shows of the engine request running it: its token count. The
    request (which knows where the turn ends) stays private to the meter, by the same convention
    as a HiddenLength's value. A backend sets `traj.meter = Meter(request)`."""

    __slots__ = ("generated",)

    def __init__(self, request: TokenMeter) -> None:
        # the request's own bound method: one call per read, not two (policies read every resident's)
        self.generated = request.generated


@dataclass(eq=False, slots=True)
class Trajectory:
    spec: TrajectorySpec
    state: State = State.FRESH
    worker: int | None = None
    tag: int | None = None                 # policy version it started under (staleness is counted from it)
    versions: list[int] = field(default_factory=list)  # every version that generated part of it
    tokens: int = 0                        # tokens generated, as of the last departure or turn end
    observation_tokens: int = 0            # tool observations appended so far (multi-turn)
    turn: int = 0
    meter: Meter | None = None
    kv_home: int | None = None             # worker whose KV snapshot it can be restored from
    home: int | None = None                # worker it last ran on, until it finishes (session affinity)
    pin: int | None = None                 # the one worker its request may run on (it holds the request's
                                           # state, e.g. a live router's stored response); None: any
    resumable: bool = True                 # its request may be evicted: its client resumes what it is handed
                                           # (every simulated one; a live router's AReaL-style requests)
    admitted_at: float = -1.0
    completed_at: float = -1.0
    placed_at: float = -1.0
    departed_at: float = -1.0
    resident_time: float = 0.0
    migrations: int = 0
    placements: int = 0
    id: int = field(init=False, repr=False)   # spec.id, kept here: the key of every lookup of a decision
    prompt_len: int = field(init=False, repr=False)   # spec.prompt_len, kept here: `context` reads no spec

    def __post_init__(self) -> None:
        self.id = self.spec.id
        self.prompt_len = self.spec.prompt_len

    @property
    def group(self) -> int:
        return self.spec.group

    @property
    def workload_class(self) -> str:
        return self.spec.workload_class

    @property
    def generated(self) -> int:
        return self.meter.generated() if self.meter is not None else self.tokens

    @property
    def context(self) -> int:
        """Tokens of KV this trajectory needs now: prompt + observations + generated. (`generated`
        inlined: policies read this for every resident they compare.)"""
        meter = self.meter
        return self.prompt_len + self.observation_tokens + (self.tokens if meter is None else meter.generated())

    @property
    def version(self) -> int | None:
        """The version it would run under next: its latest."""
        return self.versions[-1] if self.versions else None


def admitted_version(traj: Trajectory) -> int:
    """The version an admitted trajectory runs under (one it has from its admission on)."""
    v = traj.version
    if v is None:
        raise ValueError(f"trajectory {traj.id} was never admitted: it has no version")
    return v


def contexts(trajs: Iterable[Trajectory]) -> list[int]:
    """Each trajectory's `context`, by the same sum, in one comprehension rather than a property
    call each: a policy that sheds a worker reads every resident's."""
    return [t.prompt_len + t.observation_tokens + (t.tokens if t.meter is None else t.meter.generated())
            for t in trajs]


def turn_target(traj: Trajectory, key: object) -> int:
    """Total generated tokens at which the current turn ends (engine-side knowledge: needs the key).

    Shared by both backends, which play the environment the same way."""
    spec = traj.spec
    total = spec.response.reveal(key)
    for turn in spec.later_turns.reveal(key)[: traj.turn]:
        total += turn.response.reveal(key)
    return total
