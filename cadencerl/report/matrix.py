"""What the report runs: its policies, pools and models, how big each run is, and the planned runs.

Every scenario the report simulates is built here from a built-in one, so the matrix reads in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadencerl.config import Scenario, builtin_scenario
from cadencerl.runs.reference import REFERENCE

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


ABLATION_POLICIES = ("cadence", "cadence-no-pacing", "cadence-no-concentration", "cadence-no-affinity",
                     "cadence-no-kv-prep")
GROUPED_BASELINES = ("sync-grouped", "one-off-grouped", "laminar-grouped", "areal-grouped", "least-loaded-grouped")
# (runs labelled as their results are: registry.grouped_label builds each)
STEADY_ITERATIONS = 16  # every run: figures over iterations 2..15 (the first and the last are left out)
QUICK_SCALE = 4         # --quick: every pool at a quarter of its devices, with a quarter of the batch (1,024),
QUICK_BATCH = 4096 // QUICK_SCALE   # so each worker carries the full report's KV pressure, in under 5 minutes
LIGHT_BATCH = 512       # the light-load table: the whole pools at batch 512, where nothing is KV-bound


@dataclass(frozen=True)
class Settings:
    """How big each run is. `None` keeps the scenario's own value (batch 4096, seed 0).

    Every run lasts STEADY_ITERATIONS iterations and is judged over its steady window. --quick
    shrinks the batch (not the iteration count) and runs the ablation and the grouped baselines
    on DETAIL_POOL only.
    """

    quick: bool = False
    pool_scale: int = 1             # every pool at 1/pool_scale of its devices (--quick: QUICK_SCALE)
    trajectories: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    sized: bool = False             # `trajectories` was given (`--trajectories`), not the mode's
    etas: tuple[int, ...] = (1, 2, 3, 4, 6)
    deltas: tuple[int, ...] = (512, 1024, 2048, 4096)
    ablation_pools: tuple[str, ...] = ("32a", "32b", "16a16b", "16a8h", "16b8h", "16a16b8h")

    def __post_init__(self) -> None:
        if self.trajectories is None:  # 16 iterations of the scenarios' batch
            object.__setattr__(self, "trajectories", STEADY_ITERATIONS * (self.batch_size or 4096))

    @property
    def mode(self) -> str:
        return "sized" if self.sized else "quick" if self.quick else "full"

    @property
    def command(self) -> str:
        """The `cadencerl report` command that gives these settings (output folder aside)."""
        return " ".join(["cadencerl report", *(["--quick"] if self.quick else []),
                         *([f"--trajectories {self.trajectories}"] if self.sized else []),
                         *([f"--seed {self.seed}"] if self.seed is not None else [])])


def make_settings(quick: bool = False, trajectories: int | None = None, seed: int | None = None) -> Settings:
    """Full: 16 x 4096 trajectories per run. --quick: every pool at a quarter of its devices, 16 x 1024,
    three sweep points, ablation on one pool.
    `trajectories` overrides the size (batch = a sixteenth, so the iterations stay 16)."""
    if trajectories is not None:
        sized = dict(trajectories=trajectories, batch_size=max(1, trajectories // STEADY_ITERATIONS), sized=True)
    elif quick:
        sized = dict(batch_size=QUICK_BATCH, pool_scale=QUICK_SCALE)
    else:
        sized = {}
    sweeps = dict(etas=(1, 3, 6), deltas=(512, 1024, 4096)) if quick else {}
    pools = dict(ablation_pools=(DETAIL_POOL,)) if quick else {}
    return Settings(quick=quick, seed=seed, **sized, **sweeps, **pools)


def _scaled(s: Scenario, settings: Settings) -> Scenario:
    trajectories, batch, k = settings.trajectories, settings.batch_size, settings.pool_scale
    changes: dict = {}
    if k > 1:       # every group keeps its type, TP and cluster; the affinity order is unchanged
        changes.update(pool=[dict(g.model_dump(), devices=g.devices // k) for g in s.pool],    # its name kept:
                       description=f"{s.description} At 1/{k} of its devices.")    # the sections key by it
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


def pool_scenario(name: str, settings: Settings) -> Scenario:
    """A built-in pool, or one of EXTRA_POOLS built from the same workload as DETAIL_POOL."""
    if name in EXTRA_POOLS:
        groups = [dict(_GROUPS[g], devices=n) for g, n in EXTRA_POOLS[name]]
        text = " + ".join(f"{n} {_GROUPS[g]['accelerator']} (TP={_GROUPS[g]['tp']})" for g, n in EXTRA_POOLS[name])
        base = builtin_scenario(DETAIL_POOL).with_overrides(
            name=name, pool=groups, description=f"{text}, Qwen3-8B; the built-in pools' workload and knobs.")
    else:
        base = builtin_scenario(name)
    return _scaled(base, settings)


def light_scenario(name: str, settings: Settings) -> Scenario:
    """A whole built-in pool for STEADY_ITERATIONS iterations of LIGHT_BATCH (a sized report's batch when
    that is smaller): the light-load table."""
    batch = min(LIGHT_BATCH, settings.batch_size) if settings.sized and settings.batch_size else LIGHT_BATCH
    s = builtin_scenario(name).resized(STEADY_ITERATIONS * batch, batch)
    return s.with_overrides(seed=settings.seed) if settings.seed is not None else s


def planned_runs(settings: Settings) -> list[tuple[Scenario, str]]:
    """Every (scenario, policy) run of the matrix, for the progress bar (the two traced runs come on top)."""
    runs = [(homogeneous_scenario(m, tp, settings), p) for m, tp in HOMOGENEOUS_MODELS for p in HOMOGENEOUS_POLICIES]
    runs += [(pool_scenario(n, settings), p) for n in (*HETEROGENEOUS_POOLS, *EXTRA_POOLS) for p in HETEROGENEOUS_POLICIES]
    detail = pool_scenario(DETAIL_POOL, settings)
    runs += [(detail.with_knobs(eta=e), "cadence") for e in settings.etas]
    runs += [(detail.with_knobs(delta=d), "cadence") for d in settings.deltas]
    for name in settings.ablation_pools:
        s = pool_scenario(name, settings)
        runs += [(s, p) for p in (*ABLATION_POLICIES, *GROUPED_BASELINES)]
    runs += [(s, REFERENCE) for s in reference_pools(settings)]   # section 8: the clairvoyant reference
    runs += [(light_scenario(n, settings), p) for n in HETEROGENEOUS_POOLS for p in HETEROGENEOUS_POLICIES]
    return list({(s.model_dump_json(), p): (s, p) for s, p in runs}.values())


def all_pools(settings: Settings) -> list[Scenario]:
    """Every pool the matrix ran, homogeneous first."""
    return ([homogeneous_scenario(m, tp, settings) for m, tp in HOMOGENEOUS_MODELS]
            + [pool_scenario(n, settings) for n in (*HETEROGENEOUS_POOLS, *EXTRA_POOLS)])


def reference_pools(settings: Settings) -> list[Scenario]:
    """The pools section 8 runs the clairvoyant reference on: every pool, or (--quick) the detail pool
    alone (the reference costs several times a policy's run)."""
    return [pool_scenario(DETAIL_POOL, settings)] if settings.quick and not settings.sized else all_pools(settings)


def mixed_scenario(name: str, settings: Settings) -> Scenario:
    """The built-in mixed scenario for STEADY_ITERATIONS iterations of its own batch (--quick and
    --trajectories: sized like the other runs)."""
    s = builtin_scenario(name)
    if settings.quick or settings.batch_size is not None:   # --quick: the light batch (the pool is not scaled)
        n = STEADY_ITERATIONS * LIGHT_BATCH if settings.quick and not settings.sized else settings.trajectories
        s = s.with_overrides(workload={"trajectories": n}, trainer={"batch_size": max(1, n // STEADY_ITERATIONS)})
    else:
        s = s.with_overrides(workload={"trajectories": STEADY_ITERATIONS * s.trainer.batch_size})
    return s.with_overrides(seed=settings.seed) if settings.seed is not None else s
