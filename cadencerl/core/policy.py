"""The policy contract, whole: every trait a policy may declare, with its default, and `decide`.

As vLLM's `SchedulerInterface` is for its scheduler, this is the one place that says what a
controller, a backend or a run may ask of a policy. Every policy subclasses `Policy` and overrides
only the traits it changes; nothing reads a policy through `getattr` (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from mypy_extensions import mypyc_attr

from cadencerl.core.actions import Action
from cadencerl.core.view import AdmissionGate, PoolView

WeightSync = Literal["on-demand", "prefetch"]
PLACEMENT_TRAITS = ("kv_transfer", "kv_staging", "weight_sync", "queues_at_engine", "updates_in_place")
"""The traits an admission layer in front of a policy takes from it (admission/gated.py)."""


@mypyc_attr(allow_interpreted_subclasses=True)     # compiled (`make native`), subclassed by plain Python ones
class Policy:
    """A placement policy: observable state in, actions out; each trait below has its default.

    `decide` is a generator: the controller applies each action as it is yielded, so the policy
    sees the effect of its earlier actions (headroom, pending) in the same view."""

    # Each trait is a property over a field: compiled (`make native`), the contract's fields are read
    # natively, and a plain-Python policy's class attribute (`kv_transfer = True`) would be missed;
    # a property is looked up as Python does, and its setter serves a trait set in `__init__`.
    _name: str = "policy"
    _kv_transfer: bool = False
    _kv_staging: bool = False
    _weight_sync: WeightSync = "on-demand"
    _queues_at_engine: bool = False

    @property
    def name(self) -> str:
        """What tables, results and errors call it."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def kv_transfer(self) -> bool:
        """A move may restore KV over the cluster link instead of re-prefilling (when that is faster)."""
        return self._kv_transfer

    @kv_transfer.setter
    def kv_transfer(self, value: bool) -> None:
        self._kv_transfer = value

    @property
    def kv_staging(self) -> bool:
        """Departed KV is staged on relays before a destination is chosen (late-bound KV preparation)."""
        return self._kv_staging

    @kv_staging.setter
    def kv_staging(self, value: bool) -> None:
        self._kv_staging = value

    @property
    def weight_sync(self) -> WeightSync:
        """How a new version's weights reach a worker: pulled when it advances, or prefetched to relays."""
        return self._weight_sync

    @weight_sync.setter
    def weight_sync(self, value: WeightSync) -> None:
        self._weight_sync = value

    @property
    def queues_at_engine(self) -> bool:
        """Placements may exceed a worker's free KV: the engine queues them (a request router)."""
        return self._queues_at_engine

    @queues_at_engine.setter
    def queues_at_engine(self, value: bool) -> None:
        self._queues_at_engine = value

    @property
    def updates_in_place(self) -> bool:
        """The policy moves workers with `UpdateInPlace`: a real weight hook must accept `keep_kv`."""
        return False

    @property
    def gate(self) -> AdmissionGate | None:
        """The admission layer in front of placement; the controller hands it to every view it builds.
        A policy gets one by being wrapped in `admission.gated.Gated` (a property, not a field: mypyc
        leaves a protocol-typed class default of None unset)."""
        return None

    def decide(self, view: PoolView) -> Iterable[Action]:
        """The actions for this decision, given what the pool shows now."""
        raise NotImplementedError
