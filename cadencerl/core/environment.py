"""The world both backends play around the engines: where a reply ends, the tool call that may
follow it, and the one count of completions a conservation check reads.

It alone opens the sealed lengths (it holds the key), so a backend asks it instead of reading a
trajectory's future itself; the simulator and the real path then end turns by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.core.backend import Finished, TurnEnded
from cadencerl.core.trajectory import Trajectory, turn_target


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A turn ended and the trajectory waits on a tool: it returns `observation_len` tokens at `returns_at`."""

    traj: Trajectory
    returns_at: float
    observation_len: int


@dataclass
class Environment:
    key: object
    completions: dict[int, int] = field(default_factory=dict)     # trajectory id -> times it finished
    problems: list[str] = field(default_factory=list)

    def target(self, traj: Trajectory) -> int:
        """Generated tokens at which the current turn ends."""
        return turn_target(traj, self.key)

    def tool_call(self, traj: Trajectory, now: float) -> ToolCall | None:
        """The tool call that follows `traj`'s current turn, made at `now` (None: its last turn)."""
        later = traj.spec.later_turns.reveal(self.key)
        if traj.turn < len(later):
            turn = later[traj.turn]
            return ToolCall(traj, now + turn.tool_latency_s, turn.observation_len)
        return None

    def reply_ended(self, traj: Trajectory, now: float) -> tuple[TurnEnded, ToolCall] | Finished:
        """`traj`'s reply reached its turn's target: a tool call when more turns follow, else done
        (its length checked against the target and its completion counted)."""
        call = self.tool_call(traj, now)
        if call is not None:
            return TurnEnded(traj, now), call
        expected = self.target(traj)
        if traj.tokens != expected:
            self.problems.append(f"trajectory {traj.id} ended with {traj.tokens} tokens, target {expected}")
        self.completions[traj.id] = self.completions.get(traj.id, 0) + 1
        return Finished(traj, now)

    def verify(self) -> list[str]:
        """Lengths that missed their target, and trajectories completed other than once."""
        dup = [tid for tid, n in self.completions.items() if n != 1]
        return self.problems + ([f"trajectories completed more than once: {dup[:5]}"] if dup else [])
