"""An admission layer in front of a placement policy, seen by the backend as that policy.

The layer (MISA-T, a fixed session cap) only holds new sessions back. Everything the backends and
the controller read of a policy to set up a run is the placement policy's own: a wrapper that
forgot one (CadenceRL's late-bound KV staging, a relay's weight prefetch) would run the placement
policy without its mechanism and charge the loss to admission.
"""

from __future__ import annotations

from typing import Any

from cadencerl.core.view import AdmissionGate, Policy

# What a backend reads of a policy to set up a run (all but kv_transfer with getattr and a default).
PLACEMENT_TRAITS = ("kv_transfer", "kv_staging", "weight_sync", "weight_update")


class Gated:
    """`gate` decides which new sessions may start; `inner` places them and owns every trait."""

    def __init__(self, gate: AdmissionGate, inner: Policy, name: str) -> None:
        self.gate: AdmissionGate = gate
        self.inner = inner
        self.name = name
        self.queues_at_engine: bool = getattr(inner, "queues_at_engine", False)   # the layer reads it too

    def __getattr__(self, attr: str) -> Any:
        """The inner policy's trait (called only for what the wrapper does not set itself)."""
        if attr in PLACEMENT_TRAITS:
            return getattr(self.inner, attr)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {attr!r}")
