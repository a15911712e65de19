"""Where a trajectory lives: the bookkeeping of placing it on a worker, taking it off and ending
its session.

One statement of these rules, for the simulator's controller and for the live router's adapter
(router/live.py), so the two cannot drift apart: the router's decisions are the simulator's only
while both keep the same books.
"""

from __future__ import annotations

from cadencerl.core.actions import ActionError
from cadencerl.core.pending import PendingSet
from cadencerl.core.trajectory import State, Trajectory, admitted_version
from cadencerl.core.worker import Worker


def live_worker(workers: list[Worker], wid: int) -> Worker:
    """The worker an action names, which must exist and be up."""
    if not 0 <= wid < len(workers) or not workers[wid].alive:
        raise ActionError(f"worker {wid} does not exist or is lost")
    return workers[wid]


def start(traj: Trajectory, version: int, active_by_class: dict[str, int], now: float) -> None:
    """A new session is admitted under `version` (its staleness counts from it); its class has one more."""
    traj.tag = version
    traj.versions.append(version)
    traj.admitted_at = now
    cls = traj.workload_class
    active_by_class[cls] = active_by_class.get(cls, 0) + 1


def attach(traj: Trajectory, w: Worker, workers: list[Worker], now: float) -> None:
    """Make `traj` resident on `w`, moving its session home there."""
    traj.state = State.RESIDENT
    traj.worker = w.id
    traj.placed_at = now
    traj.placements += 1
    if traj.home != w.id:
        if traj.home is not None:
            workers[traj.home].sessions -= 1
        traj.home = w.id
        w.sessions += 1
    w.residents[traj.id] = traj
    w.kv_used += traj.context


def detach(traj: Trajectory, workers: list[Worker], now: float) -> None:
    """Take `traj` off its worker, giving back its KV; it keeps its session home and its KV home there."""
    wid = traj.worker
    assert wid is not None, f"detach: trajectory {traj.id} is on no worker"
    w = workers[wid]
    del w.residents[traj.id]
    w.kv_used -= traj.context
    traj.resident_time += now - traj.placed_at
    traj.kv_home = w.id
    traj.worker = None


def to_tool(traj: Trajectory, workers: list[Worker], tool_waiting: dict[int, int], now: float) -> None:
    """A turn ended and the session waits on a tool: off its worker, counted under its version."""
    detach(traj, workers, now)
    traj.state = State.TOOL
    v = admitted_version(traj)
    tool_waiting[v] = tool_waiting.get(v, 0) + 1


def back_from_tool(traj: Trajectory, observation_tokens: int, tool_waiting: dict[int, int], pending: PendingSet,
                   now: float) -> None:
    """The tool answered: its observation joins the context, and the next turn waits to be placed."""
    tool_waiting[admitted_version(traj)] -= 1
    traj.observation_tokens += observation_tokens
    traj.turn += 1
    traj.state = State.PENDING
    traj.departed_at = now
    pending.add(traj)


def retire(traj: Trajectory, workers: list[Worker], active_by_class: dict[str, int], when: float) -> None:
    """`traj`'s session is over (it is on no worker): its home forgets it, its class has one fewer."""
    home = traj.home
    assert home is not None, f"retire: trajectory {traj.id} has no home worker"
    workers[home].sessions -= 1
    traj.home = None
    active_by_class[traj.workload_class] -= 1
    traj.state = State.DONE
    traj.completed_at = when
