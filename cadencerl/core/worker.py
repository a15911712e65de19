"""The controller's record of one inference worker (an engine instance)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cadencerl.core.trajectory import Trajectory


@dataclass(eq=False, slots=True)
class Worker:
    id: int
    accelerator: str
    cluster: str
    tp: int
    kv_capacity: int             # tokens
    max_num_seqs: int
    rank: int                    # affinity rank, 0 the highest: the preferred home of long-context tail work
    version: int = 0
    alive: bool = True
    residents: dict[int, Trajectory] = field(default_factory=dict)
    kv_used: int = 0             # tokens committed to residents (running, queued or loading)
    sessions: int = 0            # unfinished trajectories whose home (KV or prefix cache) is here
    outside: int = 0             # requests in flight that are no trajectory (a live router's embeddings)
    # what the engine itself reports (vLLM's /metrics), refreshed at every decision
    engine_kv: int = 0           # KV tokens the engine holds (running requests, and prefilling ones so far)
    num_waiting: int = 0
    preemptions: int = 0
    # the residents that may leave, longest context first (equal ones in residence order), from a
    # backend that keeps that order as they grow (the simulator's engines); None: read every context
    longest_first: Callable[[], Iterator[Trajectory]] | None = None

    @property
    def headroom(self) -> int:
        return self.kv_capacity - self.kv_used

    @property
    def load(self) -> int:
        """Requests in flight here, as a router counts load: residents and those outside sessions."""
        return len(self.residents) + self.outside

    def compatible(self, other: "Worker") -> bool:
        """KV can move between workers of one type in one cluster; otherwise re-prefill."""
        return self.accelerator == other.accelerator and self.cluster == other.cluster and self.tp == other.tp
