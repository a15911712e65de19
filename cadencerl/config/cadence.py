"""CadenceRL's own knobs (the scenario's `cadence:` section), read by policies/cadence.py alone.

The paper's knobs sit at the top; the choices it leaves open are grouped by the decision they
shape (`spread`, `drain`), each named for what it does. What each one changes, and what was
measured for it, is in docs/policies/cadence.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadencerl.config.fields import MAX_TOKENS, Strict


class SpreadSpec(Strict):
    """How fresh work goes out while a version has nothing pending (KV does not bind)."""

    when_underloaded: bool = True
    """Spread to the least-loaded feasible worker while nothing is pending (off: tight fit always)."""
    home: Literal["tie-break", "capped", "first"] = "tie-break"
    """How far a prompt's home is followed while spreading: only if it ties the least-loaded
    worker, up to the mean load, or whenever it is feasible."""
    home_first_when: Literal["kv-stays-bound", "kv-binds", "never"] = "kv-stays-bound"
    """From when on the home is taken whenever feasible: once a worker shed below its floor under
    two versions in a row, under the version or the one before it, or never."""
    fair_share: float = Field(default=1.5, ge=0, le=1000)
    """Until the home is taken whenever feasible, a worker admits fresh work only up to this multiple
    of its share (by `share_by`) of the pool's residents plus the admissible work; 0: no limit."""
    share_by: Literal["kv", "decode"] = "kv"
    """What a worker's fair share follows: its KV capacity, or the tokens per second it decodes with
    its KV and slots full at the pool's mean context (the pool's perf models; if a worker has none,
    such as in a router's uniform fleet, every share follows KV)."""


class DrainSpec(Strict):
    """When concentration drains a version's workers onto higher-affinity ones."""

    needs_kv_bind: bool = True
    """Only once KV bound under the version (a worker shed below its floor): before, no tail was displaced."""
    bind_while_pacing: bool = True
    """With `needs_kv_bind`, only a shed while the version paced counts (not one while it concentrated)."""
    needs_fresh_ahead: bool = True
    """Only while a newer version has fresh work for the drained worker to take."""
    whole_source: bool = False
    """Only if the targets can take every resident of the source at once."""
    within_one_rank: bool = False
    """A version whose workers all share one affinity rank drains too (onto fuller equals)."""


class CadenceSpec(Strict):
    """The paper's knobs and mechanisms (section 4, App. B), then the open choices."""

    delta: int = Field(default=1024, ge=0, le=MAX_TOKENS)
    """The decode reserve: tokens a pacing placement keeps free above the floor."""
    headroom_floor: float = Field(default=0.05, ge=0, lt=1)
    """KV headroom a worker keeps, as a fraction of its capacity; below it pacing evicts."""
    growth_ticks: float = Field(default=1.0, ge=0, le=100)   # beyond, the floor outgrows any worker's KV
    """Decisions of context growth the floor also covers (the rate observed between decisions)."""
    growth_window_s: float | None = Field(default=None, ge=0, le=60)
    """Shortest span a growth measurement covers. None: as the backend counts, every decision in
    the simulator (its counts are exact), a tick where tokens are counted live, as reads bring them
    in bursts (`runs/registry.live_scenario`): there a millisecond's burst would read as the rate."""
    pacing: bool = True
    """Long out, short in: a worker below its floor evicts its longest resident."""
    concentration: bool = True
    """Once a version's budget is spent, its residual tail drains up the affinity order."""
    prompt_affinity: bool = True
    """A prompt's samples go where its last one went, when feasible (its prefix is cached there)."""
    kv_preparation: bool = True
    """Departed KV is staged before a destination is chosen, so a compatible move skips re-prefill."""
    spread: SpreadSpec = SpreadSpec()
    drain: DrainSpec = DrainSpec()
