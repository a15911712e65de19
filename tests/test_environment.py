"""The environment both backends play (core/environment.py): turn ends, tool calls, completions."""

from __future__ import annotations

from cadencerl.core.backend import Finished, TurnEnded
from cadencerl.core.environment import Environment, ToolCall
from cadencerl.core.spec import HiddenLength, SealedTurns, TrajectorySpec, Turn
from cadencerl.core.trajectory import Trajectory

KEY = object()


def two_turns() -> Trajectory:
    later = SealedTurns((Turn(observation_len=7, tool_latency_s=2.5, response=HiddenLength(30, KEY)),), KEY)
    return Trajectory(TrajectorySpec(1, 1, 10, HiddenLength(20, KEY), later_turns=later))


def test_a_turn_with_more_to_come_ends_in_a_tool_call_at_its_latency():
    env, traj = Environment(KEY), two_turns()
    traj.tokens = 20
    ended = env.reply_ended(traj, now=4.0)
    assert ended == (TurnEnded(traj, 4.0), ToolCall(traj, 6.5, 7))
    assert env.completions == {} and env.verify() == []


def test_the_last_turn_finishes_once_at_its_target():
    env, traj = Environment(KEY), two_turns()
    traj.turn, traj.tokens = 1, 50
    assert env.target(traj) == 50
    assert env.reply_ended(traj, now=9.0) == Finished(traj, 9.0)
    assert env.verify() == []


def test_a_wrong_length_and_a_second_completion_are_both_reported():
    env, traj = Environment(KEY), two_turns()
    traj.turn, traj.tokens = 1, 49
    env.reply_ended(traj, now=1.0)
    env.reply_ended(traj, now=2.0)
    problems = env.verify()
    assert problems[0] == "trajectory 1 ended with 49 tokens, target 50"
    assert problems[-1] == "trajectories completed more than once: [1]"
