"""The clairvoyant reference: an ORACLE that sees every trajectory's length. Not a baseline.

It exists to show the best a scheduler could plausibly do on a pool, so a report can say how far
each policy is from it. It reads sealed lengths only through the key `runs/reference.py` hands
it (no registered policy name resolves to it). Within each version's admission budget it takes the
admissible fresh trajectories (up to `WINDOW` arrivals ahead) longest first (longest-processing-time
order) and puts each on the
worker where it would finish soonest, packing KV so that the worker's peak KV (every resident
growing one token per step until it ends, which the oracle knows) stays within capacity. It never migrates; new weights are prefetched at publish.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cadencerl.core.actions import Action, Admit
from cadencerl.core.policy import Policy
from cadencerl.core.spec import TrajectorySpec, total_tokens
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.policies.base import advance_idle, place_pending

WINDOW = 1024   # arrivals reordered at most this far ahead (taking from deep in the fresh queue costs its depth)


class Clairvoyant(Policy):
    name = "oracle"
    kv_transfer = False
    weight_sync = "prefetch"

    def __init__(self, key: object, specs: list[TrajectorySpec], perfs: list[WorkerPerf]) -> None:
        self._final = {s.id: total_tokens(s, key) for s in specs}     # final context of each trajectory
        self._length = {s.id: self._final[s.id] - s.prompt_len for s in specs}
        self._waiting = [s.id for s in specs]     # not yet admitted, in arrival order (the fresh queue's)
        self._looked = 0                          # the last window's size: admissions happen only in it
        self._min_prompt = min((s.prompt_len for s in specs), default=0)
        self._admitted: set[int] = set()
        self._perfs = perfs
        self._state: dict[int, list] = {}     # worker -> [contexts, remaining tokens, longest remaining, KV now]

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        versions = {w.version for w in view.alive()}
        if not view.pending and not any(view.admissible(v) for v in versions):
            return
        view.next_fresh()   # lets the fresh queue drop what was admitted out of order
        self._state = {}
        yield from place_pending(view, lambda ws, t: min(ws, key=lambda w: self._finish(w, t.id)))
        for v in sorted(versions):
            workers = [w for w in view.alive() if w.version == v and w.load < w.max_num_seqs
                       and w.headroom > self._min_prompt]
            if not workers:
                continue
            window = self._window(min(view.admissible(v), WINDOW))
            for tid in sorted(window, key=lambda t: -self._length[t]):
                w = self._best(workers, tid)
                if w is None:
                    break
                self._admitted.add(tid)
                ctxs, rems, _longest, kv = self._of(w)
                ctxs.append(self._final[tid] - self._length[tid])
                rems.append(self._length[tid])
                self._state[w.id] = [ctxs, rems, max(rems), kv + ctxs[-1]]
                yield Admit(w.id, tid)

    def _of(self, w: Worker) -> list:
        """The worker's residents as this decision sees them, measured on first use."""
        st = self._state.get(w.id)
        if st is None:
            ctxs, rems, length = [], [], self._length
            for tid, t in w.residents.items():        # the hot loop of a reference run: each figure read once
                generated = t.generated
                ctxs.append(t.spec.prompt_len + t.observation_tokens + generated)   # t.context
                rems.append(length[tid] - generated)   # at least 1 where used (_peak, _finish)
            st = self._state[w.id] = [ctxs, rems, max(1, max(rems)) if rems else 0, w.kv_used]
        return st

    def _load(self, w: Worker) -> tuple[int, int]:
        """(residents, KV used) as this decision sees them, without measuring the residents."""
        st = self._state.get(w.id)
        return (w.load, w.kv_used) if st is None else (len(st[1]), st[3])

    def _window(self, n: int) -> list[int]:
        """The next `n` fresh trajectories in arrival order."""
        self._waiting[:self._looked] = [t for t in self._waiting[:self._looked] if t not in self._admitted]
        self._looked = n
        return self._waiting[:n]

    def _best(self, workers: list[Worker], tid: int) -> Worker | None:
        """The worker where `tid` would finish soonest, among those whose peak KV stays in capacity."""
        ctx = self._final[tid] - self._length[tid]
        fits = [w for w in workers if (load := self._load(w))[0] < w.max_num_seqs and load[1] + ctx < w.kv_capacity]
        for w in sorted(fits, key=lambda w: (self._finish(w, tid), w.id)):
            if self._peak(w, ctx, self._length[tid]) <= w.kv_capacity:
                return w
        return None

    def _peak(self, w: Worker, ctx: int, rem: int) -> int:
        """The most KV `w` will hold if it takes a trajectory of context `ctx` with `rem` tokens to go:
        just before each departure, every resident still there has grown by that many tokens."""
        ctxs, rems, _longest, _kv = self._of(w)
        r = np.maximum(np.array(rems + [rem]), 1)
        order = np.argsort(r)
        c = np.array(ctxs + [ctx])[order]
        r = r[order]
        suffix = np.cumsum(c[::-1])[::-1]
        return int((suffix + (len(r) - np.arange(len(r))) * r).max())

    def _finish(self, w: Worker, tid: int) -> float:
        """Projected finish of `w` with `tid` added: its longest remaining reply at the step time of
        the batch it would then hold."""
        _ctxs, rems, longest, kv = self._of(w)
        added = self._final[tid] - self._length[tid]
        return max(longest, self._length[tid]) * self._perfs[w.id].decode_step_time(len(rems) + 1, kv + added)
