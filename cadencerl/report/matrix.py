"""What the report runs: its policies, pools and models, how big each run is, and the planned runs.

Every scenario the report simulates is built here from a built-in one, so the matrix reads in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadencerl.config import Scenario, builtin_scenario


HOMOGENEOUS_POLICIES = ("cadence", "sync", "one-off", "dora", "laminar", "areal", "least-loaded")
HETEROGENEOUS_POLICIES = tuple(p for p in HOMOGENEOUS_POLICIES if p != "dora")  # DORA* assumes homogeneous hardware
ASYNC_BASELINES = ("dora", "laminar", "areal")
HOMOGENEOUS_MODELS = (("Qwen3-8B", 1), ("Qwen3-14B", 1), ("Qwen3-32B", 2))
HETEROGENEOUS_POOLS = ("32a", "32b", "16a16b", "16a8h", "16b8h", "16a16b8h")
DETAIL_POOL = "16a16b8h"  # specialization, KV-share trace and the eta / delta sweeps run here

_GROUPS = {"a": dict(accelerator="A910X", tp=2, cluster="a910x"),
           "b": dict(accelerator="BI-V150", tp=2, cluster="bi-v150"),
           "h": dict(accelerator="H800", tp=1, cluster="h800")}
EXTRA_POOLS = {"16a": (("a", 16),), "16b": (("b", 16),), "8h": (("h", 8),)}  # starting points for composability
COMPOSITIONS = (  # (from pool, to pool, what the added devices are)
    ("16a", "16a8h", "high-bandwidth"), ("16b", "16b8h", "high-bandwidth"), ("16a16b", "16a16b8h", "high-bandwidth"),
    ("8h", "16a8h", "cost-efficient"), ("8h", "16b8h", "cost-efficient"),
    ("16a8h", "16a16b8h", "cost-efficient"), ("16b8h", "16a16b8h", "cost-efficient"),
)
PAPER_NON_RESIDENT_P95 = {"32a": 0.399, "32b": 0.809, "16a16b8h": 0.403}  # 2nd-hand, shared/reference/hardware.md
MIXED_SCENARIOS = ("mixed-h200", "mixed-h100", "mixed-16a8h", "mixed-h200-235b")  # section 10 (MISA-T); --quick runs the first
MIXED_POLICIES = ("misa+cache-aware-tuned", "cache-aware-tuned", "round-robin", "least-loaded-router")


@dataclass(frozen=True)
class Settings:
    """How big each run is. `None` keeps the scenario's own value (16384 trajectories, batch 4096, seed 0).

    The eta / delta sweeps (cadence only, cheap) have their own size: with only two iterations an
    eta sweep says nothing, so --quick runs them at the scenario's own size.
    """

    quick: bool = False
    trajectories: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    etas: tuple[int, ...] = (1, 2, 3, 4, 6)
    deltas: tuple[int, ...] = (512, 1024, 2048, 4096)
    sweep_trajectories: int | None = None
    sweep_batch_size: int | None = None


QUICK_TRAJECTORIES = 8192  # with the full batch (4096): as many trajectories in flight as the full report, half the work
FULL_SWEEP_TRAJECTORIES = 32768  # 8 iterations of the built-in batch


def make_settings(quick: bool = False, trajectories: int | None = None, seed: int | None = None) -> Settings:
    """--quick: 8192 trajectories (batch kept), three sweep points; `trajectories` overrides (batch = a quarter)."""
    if trajectories is not None:
        batch = max(1, trajectories // 4)
        sized = dict(trajectories=trajectories, batch_size=batch, sweep_trajectories=trajectories,
                     sweep_batch_size=batch)
    elif quick:
        sized = dict(trajectories=QUICK_TRAJECTORIES)
    else:  # the full report sweeps over 8 iterations, so that eta up to 6 still leaves work to pace
        sized = dict(sweep_trajectories=FULL_SWEEP_TRAJECTORIES)
    sweeps = dict(etas=(1, 3, 6), deltas=(512, 1024, 4096)) if quick else {}
    return Settings(quick=quick, seed=seed, **sized, **sweeps)


def _scaled(s: Scenario, settings: Settings, sweep: bool = False) -> Scenario:
    trajectories = settings.sweep_trajectories if sweep else settings.trajectories
    batch = settings.sweep_batch_size if sweep else settings.batch_size
    changes: dict = {}
    if trajectories is not None:
        changes["workload"] = {"trajectories": trajectories}
    if batch is not None:
        changes["trainer"] = {"batch_size": batch}
    if settings.seed is not None:
        changes["seed"] = settings.seed
    return s.with_overrides(**changes) if changes else s


def homogeneous_scenario(model: str, tp: int, settings: Settings) -> Scenario:
    """16 H800 devices serving `model` at `tp`; Qwen3-8B at TP1 is the built-in h800-16."""
    base = builtin_scenario("h800-16")
    if model != base.model:
        base = base.with_overrides(
            name=f"h800-16-{model.removeprefix('Qwen3-').lower()}", model=model, pool=[dict(_GROUPS["h"], devices=16, tp=tp)],
            description=f"Homogeneous pool of 16 H800 (TP={tp}) serving {model}.")
    return _scaled(base, settings)


def pool_scenario(name: str, settings: Settings, sweep: bool = False) -> Scenario:
    """A built-in pool, or one of EXTRA_POOLS built from the same workload as DETAIL_POOL."""
    if name in EXTRA_POOLS:
        groups = [dict(_GROUPS[g], devices=n) for g, n in EXTRA_POOLS[name]]
        text = " + ".join(f"{n} {_GROUPS[g]['accelerator']} (TP={_GROUPS[g]['tp']})" for g, n in EXTRA_POOLS[name])
        base = builtin_scenario(DETAIL_POOL).with_overrides(
            name=name, pool=groups, description=f"{text}, Qwen3-8B; the built-in pools' workload and knobs.")
    else:
        base = builtin_scenario(name)
    return _scaled(base, settings, sweep)


def planned_runs(settings: Settings) -> list[tuple[Scenario, str]]:
    """Every (scenario, policy) run of the matrix, for the progress bar (the two traced runs come on top)."""
    runs = [(homogeneous_scenario(m, tp, settings), p) for m, tp in HOMOGENEOUS_MODELS for p in HOMOGENEOUS_POLICIES]
    runs += [(pool_scenario(n, settings), p) for n in (*HETEROGENEOUS_POOLS, *EXTRA_POOLS) for p in HETEROGENEOUS_POLICIES]
    detail = pool_scenario(DETAIL_POOL, settings, sweep=True)
    runs += [(detail.with_overrides(policy={"eta": e}), "cadence") for e in settings.etas]
    runs += [(detail.with_overrides(policy={"delta": d}), "cadence") for d in settings.deltas]
    return list({(s.model_dump_json(), p): (s, p) for s, p in runs}.values())


def all_pools(settings: Settings) -> list[Scenario]:
    """Every pool the matrix ran, homogeneous first."""
    return ([homogeneous_scenario(m, tp, settings) for m, tp in HOMOGENEOUS_MODELS]
            + [pool_scenario(n, settings) for n in (*HETEROGENEOUS_POOLS, *EXTRA_POOLS)])


def mixed_scenario(name: str, settings: Settings) -> Scenario:
    """The built-in mixed scenario, sized like the other runs (--quick: 8192 sessions) in four batches,
    so that as in the full run (12288 in batches of 2048) the pool is under load, where MISA-T matters."""
    s = builtin_scenario(name)
    if settings.trajectories is not None:
        n = settings.trajectories
        s = s.with_overrides(workload={"trajectories": n}, trainer={"batch_size": max(1, n // 4)})
    return s.with_overrides(seed=settings.seed) if settings.seed is not None else s
