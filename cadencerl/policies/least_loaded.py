"""The naive floor: fresh work to the worker with the fewest residents, no migration ever."""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action, Place
from cadencerl.core.view import PoolView
from cadencerl.policies.base import admit_fresh, advance_idle, fits


class LeastLoaded:
    name = "least-loaded"
    kv_transfer = False

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        for traj in sorted(view.pending, key=lambda t: t.context):  # lost workers, tool returns
            ws = [w for w in view.alive() if w.version == traj.version and fits(w, traj.context)]
            if ws:
                yield Place(traj.id, min(ws, key=lambda w: (w.load, w.id)).id)
        yield from admit_fresh(view, lambda ws, _t: min(ws, key=lambda w: (w.load, w.id)))
