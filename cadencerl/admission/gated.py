"""An admission layer in front of a placement policy, seen by the backend as that policy.

The layer (MISA-T, a fixed session cap) only holds new sessions back. Everything the backends and
the controller read of a policy to set up a run is the placement policy's own: a wrapper that
forgot one (CadenceRL's late-bound KV staging, a relay's weight prefetch) would run the placement
policy without its mechanism and charge the loss to admission.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from cadencerl.core.policy import AdmissionGate, Policy


@mypyc_attr(allow_interpreted_subclasses=True)
class Gated(Policy):
    """`gate` decides which new sessions may start; `inner` places them and owns every other trait."""

    def __init__(self, gate: AdmissionGate, inner: Policy, name: str) -> None:
        self._gate = gate
        self.inner = inner
        self.name = name
        self.kv_transfer = inner.kv_transfer
        self.kv_staging = inner.kv_staging
        self.weight_sync = inner.weight_sync
        self.queues_at_engine = inner.queues_at_engine

    @property
    def gate(self) -> AdmissionGate:
        return self._gate

    @property
    def updates_in_place(self) -> bool:
        """Read live: a tuned router's switch is set after wrapping."""
        return self.inner.updates_in_place


def placement_of(policy: Policy) -> Policy:
    """The placement policy behind an admission layer (the policy itself when it has none)."""
    return policy.inner if isinstance(policy, Gated) else policy
