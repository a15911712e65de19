"""The policy contract, whole: every trait a policy may declare, with its default, and `decide`.

As vLLM's `SchedulerInterface` is for its scheduler, this is the one place that says what a
controller, a backend or a run may ask of a policy. Every policy subclasses `Policy` and overrides
only the traits it changes; nothing reads a policy through `getattr` (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from cadencerl.core.actions import Action
from cadencerl.core.view import AdmissionGate, PoolView

WeightSync = Literal["on-demand", "prefetch"]
PLACEMENT_TRAITS = ("kv_transfer", "kv_staging", "weight_sync", "queues_at_engine", "updates_in_place")
"""The traits an admission layer in front of a policy takes from it (admission/gated.py)."""


class Policy:
    """A placement policy: observable state in, actions out; each trait below has its default.

    `decide` is a generator: the controller applies each action as it is yielded, so the policy
    sees the effect of its earlier actions (headroom, pending) in the same view."""

    name: str = "policy"
    """What tables, results and errors call it."""

    kv_transfer: bool = False
    """A move may restore KV over the cluster link instead of re-prefilling (when that is faster)."""

    kv_staging: bool = False
    """Departed KV is staged on relays before a destination is chosen (late-bound KV preparation)."""

    weight_sync: WeightSync = "on-demand"
    """How a new version's weights reach a worker: pulled when it advances, or prefetched to relays."""

    queues_at_engine: bool = False
    """Placements may exceed a worker's free KV: the engine queues them (a request router)."""

    updates_in_place: bool = False
    """The policy moves workers with `UpdateInPlace`: a real weight hook must accept `keep_kv`."""

    gate: AdmissionGate | None = None
    """The admission layer in front of placement; the controller hands it to every view it builds."""

    def decide(self, view: PoolView) -> Iterable[Action]:
        """The actions for this decision, given what the pool shows now."""
        raise NotImplementedError
