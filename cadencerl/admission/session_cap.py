"""A fixed cap on sessions in flight: the static admission a rollout driver already has.

`cap<N>+<policy>` (`runs/registry.py`) puts one number for the whole pool, blind to classes and to
KV, in front of any placement policy, as AReaL's `max_concurrent_rollouts` does. It is the baseline
MISA-T's adaptive admission must beat, N swept as a deployment would (docs/policies/misa-t.md).
A session counts from its admission until it completes, tool waits included, as a driver counts the
rollouts it has open. Continuations are never held.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from cadencerl.admission.gated import Gated
from cadencerl.config import ConfigError
from cadencerl.core.actions import Action
from cadencerl.core.policy import Policy
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker

LABEL = re.compile(r"cap(\d+)")


class SessionCap:
    """An AdmissionGate that lets a new session start only while fewer than `max_sessions` are open."""

    def __init__(self, max_sessions: int) -> None:
        if max_sessions < 1:
            raise ConfigError(f"admission: a session cap must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions

    def _open(self, view: PoolView) -> int:
        # active_by_class is the controller's live count: it moves as each Admit is applied
        return sum(view.active_by_class.values())

    def open_classes(self, view: PoolView, version: int | None = None) -> set[str]:
        return set(view.fresh.classes()) if self._open(view) < self.max_sessions else set()

    def accepting(self, view: PoolView, workers: list[Worker]) -> list[bool]:
        return [self._open(view) < self.max_sessions] * len(workers)

    def accepts(self, view: PoolView, worker: Worker | None) -> bool:
        return self.accepting(view, [worker])[0]

    def remaining(self, view: PoolView) -> int:
        return max(0, self.max_sessions - self._open(view))

    def books(self) -> dict:
        return {}            # it counts the controller's open sessions, nothing of its own

    def take_up(self, books: dict) -> None:
        pass


class Capped(Gated):
    """cap<N>+PLACEMENT: `inner` places; the cap only holds new sessions back."""

    def __init__(self, cap: SessionCap, inner: Policy) -> None:
        super().__init__(cap, inner, f"cap{cap.max_sessions}+{inner.name}")

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from self.inner.decide(view)


def parse_cap(label: str) -> int | None:
    """N for an admission label `cap<N>`, None for any other label."""
    match = LABEL.fullmatch(label)
    return int(match.group(1)) if match else None
