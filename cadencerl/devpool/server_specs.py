"""A scenario's pool as servers to start: one spec per worker, whoever starts them (locally or Ray)."""

from __future__ import annotations

from dataclasses import dataclass

from cadencerl.config import Scenario
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import make_perf


@dataclass(frozen=True)
class ServerSpec:
    """One worker of the pool as a server: its type, TP devices, KV tokens, batch limit and CPU share."""

    accelerator: str
    tp: int
    kv_tokens: int
    max_num_seqs: int
    cpu_share: float = 1.0      # < 1 only for the local CPU stand-ins of slower accelerators


def server_specs(scenario: Scenario) -> list[ServerSpec]:
    """One spec per worker, in the controller's worker order; KV as the catalog sizes it."""
    model = catalog.model(scenario.model)
    out = []
    for g in scenario.pool:
        kv = make_perf(catalog.accelerator(g.accelerator), model, g.tp).kv_capacity_tokens()
        share = catalog.CPU_SHARES.get(g.accelerator, 1.0)
        out += [ServerSpec(g.accelerator, g.tp, kv, g.max_num_seqs, share)] * g.workers
    return out
