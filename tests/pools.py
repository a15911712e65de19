"""Hand-built pools for unit tests of the policies, routers and controller.

`pool(...)` is a controller holding exactly the given state; `Pool.decide()` runs one decision of
the policy on the view that controller builds, applying each action as the controller does, so a
test sees the actions a policy proposes and that the controller accepts them (a batch's, in order).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cadencerl.config import CadenceSpec, ControllerSpec
from cadencerl.config.scenario import merged
from cadencerl.policies.cadence import Cadence
from cadencerl.core.actions import Action, Batch
from cadencerl.core.controller import Controller
from cadencerl.core.policy import Policy
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker

KEY = object()
PARAMS = CadenceSpec(delta=100, headroom_floor=0.1)
CONTROL = ControllerSpec(eta=1)


def cadence(**options) -> Cadence:
    """CadenceRL at the test knobs with `options` changed (a section given as a mapping, field by field)."""
    return Cadence(CadenceSpec.model_validate(merged(PARAMS.model_dump(), options)), CONTROL.tick_s)


def traj(tid: int, ctx: int, group: int | None = None, version: int = 0, prompt: int = 10,
         cls: str = "rlvr") -> Trajectory:
    """A trajectory of `ctx` tokens of context (prompt + generated) started under `version`."""
    spec = TrajectorySpec(tid, tid if group is None else group, prompt, HiddenLength(99999, KEY), workload_class=cls)
    t = Trajectory(spec)
    t.tokens = ctx - prompt
    t.tag = version
    t.versions = [version]
    return t


def worker(wid: int, cap: int = 10_000, rank: int = 0, version: int = 0, residents: Iterable[Trajectory] = (),
           seqs: int = 64) -> Worker:
    w = Worker(wid, f"acc{rank}", f"c{rank}", 1, cap, seqs, rank, version=version)
    for t in residents:
        t.state, t.worker, t.home = State.RESIDENT, wid, wid
        w.residents[t.id] = t
        w.sessions += 1
    w.kv_used = sum(t.context for t in w.residents.values())
    return w


@dataclass
class StubBackend:
    """Accepts every action and records it; the controller's own bookkeeping is what policies see."""

    calls: list[tuple] = field(default_factory=list)

    def place(self, traj, worker, restore, delay):
        self.calls.append(("place", traj.id, worker, restore))

    def evict(self, traj):
        self.calls.append(("evict", traj.id))

    def set_version(self, worker, version, keep_kv=False):
        self.calls.append(("set_version", worker, version) + (("keep_kv",) if keep_kv else ()))


@dataclass
class Pool:
    policy: Policy
    controller: Controller
    now: float = 0.0

    @property
    def view(self) -> PoolView:
        return self.controller.view(self.now)

    def decide(self) -> list[Action]:
        """One decision, each action applied as the controller applies it."""
        out = []
        for action in self.policy.decide(self.view):
            self.controller.apply(action, self.now)
            out.extend(action.actions if isinstance(action, Batch) else [action])
        return out


def pool(policy: Policy, workers: list[Worker], pending: Iterable[Trajectory] = (),
         fresh: Iterable[Trajectory] = (), trainer_version: int = 0, admitted: int = 0, total: int = 1000,
         batch: int = 100, tags: dict[int, int] | None = None, consumed: int = 0, trainer_busy: bool = False,
         done: int = 0, tool_waiting: dict[int, int] | None = None, params: ControllerSpec = CONTROL) -> Pool:
    """A controller holding this state. `tags` (default {0: admitted}) counts the trajectories
    started under each version and not yet consumed by the trainer, `consumed` those started and
    already consumed; `done` of all of them completed. The next batch is `trainer_version`, or one
    more while the trainer is busy."""
    ctl = Controller(policy, StubBackend(), workers, list(fresh), batch_size=batch, params=params,
                     train_time_s=1.0)
    ctl.credits.total = total
    for tag, n in (tags if tags is not None else {0: admitted}).items():
        if n:
            ctl.credits.record(tag, n)
    ctl.credits.admitted += consumed
    ctl.trainer.consumed = consumed
    ctl.done = done
    ctl.trainer.version = trainer_version
    ctl.trainer.busy_until = 1.0 if trainer_busy else None
    for t in pending:
        t.state = State.PENDING
        ctl.trajectories[t.id] = t
        ctl.pending.add(t)
    for w in workers:
        for t in w.residents.values():
            ctl.trajectories[t.id] = t
    ctl.tool_waiting.update(tool_waiting or {})
    return Pool(policy, ctl)
