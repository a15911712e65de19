"""Python's cycle collector paused for the length of one simulation.

A run allocates millions of small objects that live until it ends, and the collector's passes
over them grew faster than the run itself (a quarter of a 16x run's CPU). A run leaves no cyclic
garbage behind mid-run that matters: its peak memory is the same either way (docs/simulator.md), and
what it drops at its end is collected once the collector is back on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Off inside, back to what it was outside (nested uses leave it off until the outermost ends)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
