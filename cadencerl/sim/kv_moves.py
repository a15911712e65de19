"""Moving a departed trajectory's KV to its next worker, or deciding not to.

Two mechanisms over shared links (`links.py`): late-bound KV preparation (CadenceRL section 4.4,
`staging=True`: snapshot to host, striped over relays, fan-in at placement) and direct GPU-to-GPU
transfer (Laminar's and DORA*'s moves). KV only moves between compatible workers and when it beats
re-prefilling; otherwise the caller sees None (tokens and re-prefill). docs/internals.md, "sim".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.core.worker import Worker
from cadencerl.hardware.catalog import KV_RELAYS_PER_CLUSTER, LINKS
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.sim.links import LinkQueue, Links, transfer, transfer_finish


@dataclass
class KvMoves:
    workers: list[Worker]
    perfs: list[WorkerPerf]
    links: Links
    staging: bool
    relays: int = KV_RELAYS_PER_CLUSTER
    staged: dict[int, tuple[int, float]] = field(default_factory=dict)   # traj -> (source worker, staged at)
    snapshots: dict[int, tuple[int, float]] = field(default_factory=dict)  # traj -> (source worker, on host at)
    fallbacks: int = 0
    _queues: dict = field(default_factory=dict, repr=False)   # (kind, worker or cluster) -> its link queues


    def depart(self, traj: int, worker: int, tokens: int, now: float) -> None:
        """Late-bound preparation starts as the trajectory departs: a host snapshot, then the relays.
        Without staging the KV stays put until a placement pulls it (GPU to GPU)."""
        if not self.staging:
            self.snapshots[traj] = (worker, now)
            return
        w = self.workers[worker]
        nbytes = tokens * self.perfs[worker].kv_bytes_per_token
        host = self._link("host", worker)
        on_host = host.send(now, nbytes)
        self.snapshots[traj] = (worker, on_host)
        self.staged[traj] = (worker, transfer(on_host, nbytes, [self._nic_out(worker)], self._relays(w.cluster),
                                              counted=1))

    def fetch(self, traj: int, src: Worker, dst: Worker, tokens: int, now: float, reprefill: float) -> float | None:
        """Seconds until the KV is loaded on `dst`, or None: re-prefilling (`reprefill` seconds) is faster."""
        snap = self.snapshots.pop(traj, None)
        staged = self.staged.pop(traj, None)
        if snap is None or not src.compatible(dst):
            return None
        nbytes = tokens * self.perfs[dst.id].kv_bytes_per_token
        nic_in = [self._nic_in(dst.id)]
        if staged is not None:
            start, legs = max(now, staged[1]), [self._relays(src.cluster), nic_in]
        else:
            start, legs = max(now, snap[1]), [[self._nic_out(src.id)], nic_in]
        if transfer_finish(start, nbytes, *legs) - now > reprefill:
            self.fallbacks += 1
            return None
        return transfer(start, nbytes, *legs) - now

    def _relays(self, cluster: str) -> list[LinkQueue]:
        return self._link("relays", cluster)

    def _nic_out(self, worker: int) -> LinkQueue:
        return self._link("nic-out", worker)

    def _nic_in(self, worker: int) -> LinkQueue:
        return self._link("nic-in", worker)

    def _link(self, kind: str, at: int | str):
        """The queue (the relays: the list of queues) of `kind` at a worker (a cluster, for the relays),
        looked up in `links` on first use and kept (a lookup builds its name)."""
        found = self._queues.get((kind, at))
        if found is None:
            found = self._queues[(kind, at)] = self._look_up(kind, at)
        return found

    def _look_up(self, kind: str, at: int | str):
        if kind == "relays":
            return [self.links.get(f"relay:{at}:{i}", LINKS["intra-cluster"], report=f"intra-cluster:{at}")
                    for i in range(self.relays)]
        assert isinstance(at, int), f"{kind} is a worker's link: at a worker id, not {at!r}"
        w = self.workers[at]
        if kind == "host":
            return self.links.get(f"host:{at}", LINKS["host"], w.tp, report="host")
        return self.links.get(f"{kind}:{at}", LINKS["intra-cluster"], w.tp, report=f"intra-cluster:{w.cluster}")
