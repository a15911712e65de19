"""`cadencerl report`: the paper's section-6 evaluation matrix, run on seeded workloads in the simulator.

`build_report(out)` writes `out/report.md` (tables, captions, the setup of every experiment and the
command that reproduces each row), `out/figures/*.png`, `out/results.json` (every run's figures, as
`simulate` returned them, plus the setup it ran under) and `out/scenarios/*.yaml` (every scenario
that is not a built-in one, so `cadencerl sim/compare --config` can rerun it).

Numbers are reported as measured. Ratios compare CadenceRL with the best of *all* other policies
run on the same pool (least-loaded included), so a loss anywhere shows up as a loss.

One function per experiment (`homogeneous`, `heterogeneous`, ...): each takes the `Report` context,
runs what it needs through its cached `Runner`, and returns its markdown section.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cadencerl.runs import bounds
from cadencerl.report import plots
from cadencerl.config import Scenario, builtin_names, builtin_scenario
from cadencerl.hardware.catalog import ACCELERATORS

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


class ReportError(RuntimeError):
    """A run of the matrix failed; the message names the scenario and policy."""


# --------------------------------------------------------------------------------------------- settings


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


# --------------------------------------------------------------------------------------------- running


def _setup(s: Scenario) -> dict:
    return {"model": s.model, "seed": s.seed, "pool": [g.model_dump() for g in s.pool],
            "trajectories": s.workload.trajectories, "batch_size": s.trainer.batch_size,
            "eta": s.policy.eta, "delta": s.policy.delta}


def simulate_one(scenario: Scenario, policy: str, trace: tuple[int, ...] = (), progress=None) -> dict:
    """simulate(), with a failing run turned into a ReportError naming it (top level: worker processes call it)."""
    from cadencerl.config import ConfigError
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.runs.registry import make_policy
    from cadencerl.runs.simulate import simulate

    try:
        return simulate(scenario, make_policy(policy, scenario), trace=trace, progress=progress)
    except (ConfigError, StallError, ActionError) as exc:
        raise ReportError(f"{scenario.name} / {policy}: {exc}") from None


class Runner:
    """Runs simulate() once per (scenario, policy, trace), caching, with a rich progress bar on stderr.

    `prefetch` runs a list of jobs on several processes up front; `run` serves from the cache or runs
    in this process (with a per-run bar).
    """

    def __init__(self, progress: Progress | None = None, planned: int = 0) -> None:
        self.progress = progress
        self.cache: dict[tuple, dict] = {}
        self.records: list[dict] = []
        self.overall = progress.add_task("report: runs", total=planned) if progress else None

    @staticmethod
    def key(scenario: Scenario, policy: str, trace: tuple[int, ...] = ()) -> tuple:
        return scenario.model_dump_json(), policy, trace

    def prefetch(self, jobs: list[tuple[Scenario, str]], processes: int) -> None:
        """Run the uncached (scenario, policy) jobs on `processes` worker processes; results land in the cache."""
        from concurrent.futures import ProcessPoolExecutor, as_completed

        todo = [(s, p) for s, p in jobs if self.key(s, p) not in self.cache]
        if processes <= 1 or len(todo) <= 1:
            for s, p in todo:
                self.run(s, p)
            return
        done: dict[tuple, dict] = {}
        with ProcessPoolExecutor(processes) as pool:
            futures = {pool.submit(simulate_one, s, p): (s, p) for s, p in todo}
            try:
                for future in as_completed(futures):
                    s, p = futures[future]
                    done[self.key(s, p)] = future.result()
                    self._advance()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        for s, p in todo:  # record in job order, whatever order they finished in
            self._store(s, p, (), done[self.key(s, p)])

    def run(self, scenario: Scenario, policy: str, trace: tuple[int, ...] = ()) -> dict:
        key = self.key(scenario, policy, trace)
        if key in self.cache:
            return self.cache[key]
        task = None
        if self.progress:
            task = self.progress.add_task(f"  {scenario.name} / {policy}", total=scenario.workload.trajectories)
        try:
            result = simulate_one(scenario, policy, trace, progress=(
                (lambda done, _total: self.progress.update(task, completed=done)) if task is not None else None))
        finally:
            if task is not None:
                self.progress.remove_task(task)
        self._advance()
        return self._store(scenario, policy, trace, result)

    def _store(self, scenario: Scenario, policy: str, trace: tuple[int, ...], result: dict) -> dict:
        self.cache[self.key(scenario, policy, trace)] = result
        self.records.append({**result, "setup": _setup(scenario)})
        return result

    def _advance(self) -> None:
        if not self.progress:
            return
        overall = self.progress.tasks[self.overall]
        if overall.completed >= (overall.total or 0):  # an unplanned run: grow the bar rather than overflow it
            self.progress.update(self.overall, total=(overall.total or 0) + 1)
        self.progress.advance(self.overall)


# --------------------------------------------------------------------------------------------- markdown helpers


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _tok(x: float) -> str:
    return f"{x:,.0f}"


def _sec(x: float) -> str:
    return f"{x:,.1f}"


def _change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f}%" if old else "n/a"


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def best_of(results: dict[str, dict], metric: str, among, maximize: bool) -> tuple[str, dict] | None:
    """The best (policy, result) among policies in `among` that ran."""
    cands = [(p, r) for p, r in results.items() if p in among]
    if not cands:
        return None
    pick = max if maximize else min
    return pick(cands, key=lambda pr: pr[1][metric])


def describe_pool(s: Scenario) -> str:
    return " + ".join(f"{g.devices}x {g.accelerator} (TP={g.tp}, {g.workers} workers, cluster {g.cluster})"
                      for g in s.pool)


def pool_price(s: Scenario) -> float | None:
    """Dollars per hour for the whole pool, or None if any device type has no listed price."""
    prices = [ACCELERATORS[g.accelerator].price_per_hour for g in s.pool]
    if any(p is None for p in prices):
        return None
    return sum(p * g.devices for p, g in zip(prices, s.pool))


# --------------------------------------------------------------------------------------------- the context


@dataclass
class Report:
    """What every experiment function needs: where to write, how big the runs are, the runner, the findings."""

    out: Path
    settings: Settings
    runner: Runner
    losses: list[str] = field(default_factory=list)  # CadenceRL measured worse than some baseline
    mismatches: list[str] = field(default_factory=list)  # a paper claim this simulator does not reproduce
    headline: str = ""  # the heterogeneous ratio table, set by `heterogeneous`

    def figure(self, name: str) -> tuple[Path, str]:
        """(file path, path relative to report.md) for a PNG."""
        return self.out / "figures" / f"{name}.png", f"figures/{name}.png"

    def run_all(self, scenario: Scenario, policies) -> dict[str, dict]:
        return {p: self.runner.run(scenario, p) for p in policies}

    def command(self, verb: str, scenario: Scenario, policies, *, eta: int | None = None,
                delta: int | None = None) -> str:
        """The `cadencerl sim/compare` command line that reproduces a row run on `scenario` (+ eta/delta)."""
        parts = ["cadencerl", verb, *self._scenario_args(scenario)]
        parts += ["-p", policies] if verb == "sim" else ["--policies", ",".join(policies)]
        parts += ["--seed", str(scenario.seed)]
        if eta is not None:
            parts += ["--eta", str(eta)]
        if delta is not None:
            parts += ["--delta", str(delta)]
        return "`" + " ".join(parts) + "`"

    def _scenario_args(self, s: Scenario) -> list[str]:
        """`-s NAME [--trajectories N]` if that rebuilds `s` exactly, else `--config DIR/scenarios/NAME.yaml`."""
        if s.name in builtin_names():
            builtin = builtin_scenario(s.name)
            if builtin.with_overrides(workload={"trajectories": s.workload.trajectories}, seed=s.seed) == s:
                extra = [] if s.workload.trajectories == builtin.workload.trajectories else \
                    ["--trajectories", str(s.workload.trajectories)]
                return ["-s", s.name, *extra]
        path = self.out / "scenarios" / f"{s.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(s.model_dump(exclude_none=True), sort_keys=False))
        return ["--config", str(path)]

    def setup_line(self, s: Scenario, **knobs) -> str:
        eta, delta = knobs.get("eta", s.policy.eta), knobs.get("delta", s.policy.delta)
        return (f"*Setup:* pool {describe_pool(s)}; model {s.model}; {s.workload.trajectories} trajectories, "
                f"trainer batch {s.trainer.batch_size}, seed {s.seed}; eta {eta}, delta {delta} tokens.")


# --------------------------------------------------------------------------------------------- experiments


def _results_table(ctx: Report, s: Scenario, results: dict[str, dict]) -> str:
    rows = [[p, _tok(r["throughput_tok_s"]), _sec(r["latency_p50_s"]), _sec(r["latency_p95_s"]),
             _sec(r["latency_p99_s"]), _pct(r["non_resident_p95"]), r["preemptions"], r["evictions"],
             r["migrations"], _pct(r["throughput_fraction_of_bound"]), _ratio(r["p95_multiple_of_bound"])]
            for p, r in results.items()]
    table = md_table(["policy", "throughput tok/s", "P50 s", "P95 s", "P99 s", "non-resident P95", "preemptions",
                      "evictions", "migrations", "throughput / bound", "P95 / bound"], rows)
    return f"{table}\n\nReproduce: {ctx.command('compare', s, list(results))}"


def _versus(ctx: Report, where: str, results: dict[str, dict]) -> tuple[dict, list[str]]:
    """CadenceRL against the best other policy (and the best asynchronous one) on one pool; losses are recorded."""
    me = results["cadence"]
    others = [p for p in results if p != "cadence"]
    tp_name, tp_best = best_of(results, "throughput_tok_s", others, maximize=True)
    lat_name, lat_best = best_of(results, "latency_p95_s", others, maximize=False)
    row = {"tp": me["throughput_tok_s"] / tp_best["throughput_tok_s"], "tp_by": tp_name,
           "p95": me["latency_p95_s"] / lat_best["latency_p95_s"], "p95_by": lat_name}
    notes = []
    if row["tp"] < 1:
        notes.append(f"{where}: CadenceRL's throughput is {_change(me['throughput_tok_s'], tp_best['throughput_tok_s'])} "
                     f"vs {tp_name} ({_tok(me['throughput_tok_s'])} vs {_tok(tp_best['throughput_tok_s'])} tok/s).")
    if row["p95"] > 1:
        notes.append(f"{where}: CadenceRL's P95 latency is {_change(me['latency_p95_s'], lat_best['latency_p95_s'])} "
                     f"vs {lat_name} ({_sec(me['latency_p95_s'])} vs {_sec(lat_best['latency_p95_s'])} s).")
    ctx.losses.extend(notes)
    async_best = best_of(results, "latency_p95_s", ASYNC_BASELINES, maximize=False)
    if async_best:
        row["p95_async"] = me["latency_p95_s"] / async_best[1]["latency_p95_s"]
        row["p95_async_by"] = async_best[0]
    return row, notes


def homogeneous(ctx: Report) -> str:
    """Section 1: 16 H800 devices, Qwen3-8B/14B/32B, every strategy plus the least-loaded floor."""
    parts = ["## 1. Homogeneous H800 pools\n",
             "Paper (section 6.2, via the summary): on homogeneous H800 pools CadenceRL's throughput is comparable to "
             "Laminar and AReaL at Qwen3-8B with a wider gap at 14B and 32B, and it has the lowest latency among the "
             "asynchronous strategies; Sync and One-off have the lowest latency overall. Below: what this simulator "
             "measures. DORA* runs here (homogeneous pools only); least-loaded is the naive floor.\n"]
    groups, tput, p95, summary = [], {}, {}, []
    for model, tp in HOMOGENEOUS_MODELS:
        s = homogeneous_scenario(model, tp, ctx.settings)
        results = ctx.run_all(s, HOMOGENEOUS_POLICIES)
        label = f"{model} TP{tp}"
        groups.append(label)
        for p, r in results.items():
            tput[(label, p)], p95[(label, p)] = r["throughput_tok_s"], r["latency_p95_s"]
        row, _ = _versus(ctx, f"16x H800, {model}", results)
        if row["p95_async"] > 1:
            ctx.mismatches.append(f"16x H800, {model}: CadenceRL does not have the lowest P95 among the asynchronous "
                                  f"strategies ({row['p95_async_by']} is {_change(1, row['p95_async'])} lower).")
        summary.append([label, _ratio(row["tp"]), row["tp_by"], _ratio(row["p95"]), row["p95_by"],
                        _ratio(row["p95_async"]), row["p95_async_by"]])
        parts += [f"### {model} (TP={tp}) on 16 H800\n", ctx.setup_line(s), "", _results_table(ctx, s, results), ""]
    path, rel = ctx.figure("homogeneous")
    plots.policy_bars(path, groups, list(HOMOGENEOUS_POLICIES), tput, p95, "model on 16 H800 devices")
    parts += ["### Summary: CadenceRL vs the best other policy\n",
              md_table(["model", "throughput ratio", "best-throughput baseline", "P95 ratio", "lowest-P95 baseline",
                        "P95 ratio vs best async (DORA*/Laminar/AReaL)", "lowest-P95 async"], summary),
              "\nThroughput ratio > 1 and P95 ratio < 1 mean CadenceRL is better.\n",
              f"![homogeneous]({rel})\n",
              "*Figure 1. Homogeneous 16-device H800 pools: aggregate decode throughput (top, thousands of tokens/s) "
              "and P95 trajectory latency from admission to completion (bottom, seconds) for every strategy, per "
              "model. CadenceRL's bars are outlined in black.*\n"]
    return "\n".join(parts)


def heterogeneous(ctx: Report) -> str:
    """Section 2: the six heterogeneous (and single-type) paper pools, DORA* excluded; ratios vs the best baseline."""
    parts = ["## 2. Heterogeneous pools\n",
             "Paper (section 6.2): across heterogeneous configurations CadenceRL matches or exceeds baseline "
             "throughput while substantially reducing trajectory latency (up to +48% throughput and -64% P95 vs the "
             "strongest baseline). DORA* is excluded (its reallocation model assumes homogeneous hardware). "
             "All pools run Qwen3-8B; A = A910X TP2, B = BI-V150 TP2, H = H800 TP1, each type in its own cluster.\n"]
    groups, tput, p95, ratio_rows = list(HETEROGENEOUS_POOLS), {}, {}, []
    for name in HETEROGENEOUS_POOLS:
        s = pool_scenario(name, ctx.settings)
        results = ctx.run_all(s, HETEROGENEOUS_POLICIES)
        for p, r in results.items():
            tput[(name, p)], p95[(name, p)] = r["throughput_tok_s"], r["latency_p95_s"]
        row, _ = _versus(ctx, name, results)
        me = results["cadence"]
        ratio_rows.append([name, _tok(me["throughput_tok_s"]), _tok(results[row["tp_by"]]["throughput_tok_s"]),
                           row["tp_by"], f"**{_ratio(row['tp'])}**", _sec(me["latency_p95_s"]),
                           _sec(results[row["p95_by"]]["latency_p95_s"]), row["p95_by"], f"**{_ratio(row['p95'])}**",
                           _ratio(row["p95_async"]), row["p95_async_by"]])
        parts += [f"### {name}\n", ctx.setup_line(s), "", _results_table(ctx, s, results), ""]
    path, rel = ctx.figure("heterogeneous")
    plots.policy_bars(path, groups, list(HETEROGENEOUS_POLICIES), tput, p95, "pool (Qwen3-8B)")
    parts += ["### CadenceRL vs the best baseline, per pool\n", HETEROGENEOUS_RATIO_TABLE_HEADER,
              md_table(RATIO_HEADERS, ratio_rows), "",
              f"![heterogeneous]({rel})\n",
              "*Figure 2. Heterogeneous pools (Qwen3-8B): aggregate decode throughput (top, thousands of tokens/s) "
              "and P95 trajectory latency (bottom, seconds) per pool and strategy; DORA* is not run. CadenceRL's bars "
              "are outlined in black.*\n"]
    ctx.headline = md_table(RATIO_HEADERS, ratio_rows)
    return "\n".join(parts)


RATIO_HEADERS = ["pool", "cadence tok/s", "best baseline tok/s", "best-throughput baseline", "throughput ratio",
                 "cadence P95 s", "best baseline P95 s", "lowest-P95 baseline", "P95 ratio",
                 "P95 ratio vs best async (Laminar/AReaL)", "lowest-P95 async"]
HETEROGENEOUS_RATIO_TABLE_HEADER = (
    "The best baseline is picked separately for each metric among *all* other policies run on the pool "
    "(sync, one-off, laminar, areal and the least-loaded floor). Throughput ratio = cadence / best (> 1: CadenceRL "
    "higher); P95 ratio = cadence / best (< 1: CadenceRL lower). The last two columns restrict the comparison to "
    "the asynchronous baselines, as the paper frames its latency claim.\n")


def composability(ctx: Report) -> str:
    """Section 3: adding high-bandwidth (H800) vs cost-efficient (A910X, BI-V150) devices, no knob changed."""
    parts = ["## 3. Composability: adding devices without touching any routing setting\n",
             "Paper claim: adding high-bandwidth accelerators (H800) reduces tail latency; adding cost-efficient ones "
             "(A910X, BI-V150) increases throughput. Each row extends a pool with devices of one kind and reruns with "
             "the same workload, eta, delta and affinity order. The starting pools 16a, 16b and 8h are not built-ins; "
             "their scenario files are in `scenarios/`.\n"]
    names = dict.fromkeys([n for move in COMPOSITIONS for n in move[:2]])
    results = {n: ctx.run_all(pool_scenario(n, ctx.settings), HETEROGENEOUS_POLICIES) for n in names}
    rows, per_policy = [], []
    for src, dst, kind in COMPOSITIONS:
        a, b = results[src]["cadence"], results[dst]["cadence"]
        metric_ok = (b["latency_p95_s"] < a["latency_p95_s"]) if kind == "high-bandwidth" else \
            (b["throughput_tok_s"] > a["throughput_tok_s"])
        if not metric_ok:
            ctx.mismatches.append(f"composability {src} -> {dst}: adding {kind} devices did not "
                              f"{'lower P95' if kind == 'high-bandwidth' else 'raise throughput'} for CadenceRL.")
        rows.append([f"{src} -> {dst}", kind, f"{_tok(a['throughput_tok_s'])} -> {_tok(b['throughput_tok_s'])} "
                     f"({_change(b['throughput_tok_s'], a['throughput_tok_s'])})",
                     f"{_sec(a['latency_p95_s'])} -> {_sec(b['latency_p95_s'])} "
                     f"({_change(b['latency_p95_s'], a['latency_p95_s'])})", "yes" if metric_ok else "**no**"])
        per_policy.append([f"{src} -> {dst}", kind] + [
            f"{_change(results[dst][p]['throughput_tok_s'], results[src][p]['throughput_tok_s'])} / "
            f"{_change(results[dst][p]['latency_p95_s'], results[src][p]['latency_p95_s'])}"
            for p in HETEROGENEOUS_POLICIES])
    path, rel = ctx.figure("composability")
    plots.composability(path, {n: (r["cadence"]["throughput_tok_s"], r["cadence"]["latency_p95_s"])
                               for n, r in results.items()}, list(COMPOSITIONS))
    setups = "\n".join(f"- {n}: {ctx.setup_line(pool_scenario(n, ctx.settings))} "
                       f"Reproduce: {ctx.command('compare', pool_scenario(n, ctx.settings), HETEROGENEOUS_POLICIES)}"
                       for n in names)
    parts += [setups, "", "### CadenceRL\n",
              md_table(["extension", "added devices", "throughput tok/s", "P95 s", "expected direction seen?"], rows),
              "\nExpected direction: lower P95 when high-bandwidth devices are added, higher throughput when "
              "cost-efficient ones are added. More devices of any kind usually help both; the column checks the "
              "claimed axis only.\n",
              "### Every policy: throughput change / P95 change\n",
              md_table(["extension", "added devices", *HETEROGENEOUS_POLICIES], per_policy), "",
              f"![composability]({rel})\n",
              "*Figure 3. CadenceRL on each pool in the throughput (x, thousands of tokens/s) vs P95 latency "
              "(y, seconds) plane. Red arrows add high-bandwidth H800 devices, blue arrows add cost-efficient "
              "A910X or BI-V150 devices; an arrow pointing down means lower tail latency, pointing right means higher "
              "throughput.*\n"]
    return "\n".join(parts)


def _window_context(result: dict, accels: list[str]) -> tuple[dict[str, float], float]:
    """Mean context per type over the samples where every type has residents, and the end of that window (s)."""
    both = [p for p in result["context_timeline"] if all(a in p for a in accels)]
    means = {a: sum(p[a] for p in both) / len(both) if both else 0.0 for a in accels}
    return means, (both[-1]["t"] if both else 0.0)


def specialization(ctx: Report) -> str:
    """Section 4: mean resident context per accelerator type over time, CadenceRL on DETAIL_POOL."""
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    results = ctx.run_all(s, HETEROGENEOUS_POLICIES)
    me = results["cadence"]
    accels = list(me["per_accelerator"])
    publish, t = [], 0.0
    for dt in me["iteration_times_s"]:
        t += dt
        publish.append(t)
    path, rel = ctx.figure("context_timeline")
    plots.context_timeline(path, me["context_timeline"], accels, publish)
    window = {p: _window_context(r, accels) for p, r in results.items()}
    rows = [[acc] + [f"{_tok(results[p]['per_accelerator'][acc]['mean_context'])} / {_tok(window[p][0][acc])}"
                     for p in HETEROGENEOUS_POLICIES] for acc in accels]
    top_run = {p: max(accels, key=lambda a: r["per_accelerator"][a]["mean_context"]) for p, r in results.items()}
    top_win = {p: max(accels, key=lambda a: window[p][0][a]) for p in results}
    verdict = (f"while every type holds work (up to t = {window['cadence'][1]:.0f} s) the longest mean context under "
               f"CadenceRL is on {top_win['cadence']}; averaged over the whole run (the tail included, when only "
               f"some types still hold work) it is on {top_run['cadence']}.")
    if top_win["cadence"] != "H800":
        ctx.mismatches.append(f"specialization on {DETAIL_POOL}: H800 does not carry the longest mean context under "
                              f"CadenceRL while all types are busy ({top_win['cadence']} does).")
    return "\n".join([
        "## 4. Specialization: mean context per accelerator type over time\n",
        "Paper (Figure 13): H800 workers sustain longer mean contexts than A910X and BI-V150 workers; under high "
        "load all types carry elevated contexts and specialization re-emerges as load subsides.\n",
        ctx.setup_line(s), "",
        f"Reproduce: {ctx.command('sim', s, 'cadence')} (`context_timeline` in its `--json` output)\n",
        "Mean context of resident trajectories (tokens) per accelerator type and policy, as *whole run / while every "
        "type holds work*. The whole-run figure is `per_accelerator.mean_context` (averaged over every sample of "
        "that type); the second averages only the samples up to the last time all three types had residents, so "
        "the types are compared over the same period.\n",
        md_table(["accelerator", *HETEROGENEOUS_POLICIES], rows), "",
        f"Measured: {verdict} Type with the longest mean context while all are busy, per policy: "
        + ", ".join(f"{p} {a}" for p, a in top_win.items()) + ".\n",
        f"![context timeline]({rel})\n",
        f"*Figure 4. CadenceRL on {DETAIL_POOL}: mean context (tokens) of the trajectories resident on each "
        "accelerator type, sampled over simulated time (seconds). Dotted vertical lines mark when the trainer "
        "published a new policy version.*\n"])


def _trace_stats(points: list[list]) -> dict:
    """Lifetime, resident fraction, residency stints and KV share of one traced trajectory."""
    t0, t_end = points[0][0], points[-1][0]
    resident, stints, prev = 0.0, 0, None
    for (ta, acc, *_), (tb, *_rest) in zip(points, points[1:]):
        if acc is not None:
            resident += tb - ta
    for _t, acc, *_ in points:
        if acc is not None and prev is None:
            stints += 1
        prev = acc
    shares = [p[3] for p in points if p[1] is not None]
    types = [p[1] for p in points if p[1] is not None]
    moves = sum(a != b for a, b in zip(types, types[1:]))
    life = t_end - t0
    return {"admitted": t0, "done": t_end, "life": life, "resident": resident / life if life else 1.0,
            "stints": stints, "mean_share": sum(shares) / len(shares) if shares else 0.0,
            "max_share": max(shares, default=0.0), "context": points[-1][2],
            "accels": sorted(set(types)), "type_moves": moves}


def kv_share_trace(ctx: Report) -> str:
    """Section 5: one long trajectory's KV share over its life, CadenceRL vs Laminar (same seed, same workload)."""
    s = pool_scenario(DETAIL_POOL, ctx.settings)
    tid = ctx.runner.run(s, "cadence")["longest_trajectory"]
    traces, stats = {}, {}
    for p in ("cadence", "laminar"):
        traces[p] = ctx.runner.run(s, p, trace=(tid,))["traces"][str(tid)]
        stats[p] = _trace_stats(traces[p])
    path, rel = ctx.figure("kv_share")
    plots.kv_share(path, traces, {p: st["done"] for p, st in stats.items()})
    rows = [[p, _tok(st["context"]), _sec(st["admitted"]), _sec(st["done"]), _sec(st["life"]), _pct(st["resident"]),
             st["stints"], st["type_moves"], f"{st['mean_share']:.3f}", f"{st['max_share']:.3f}",
             ", ".join(st["accels"])]
            for p, st in stats.items()]
    c, lam = stats["cadence"], stats["laminar"]
    gaps = ("Gaps in the line and grey bands mark times it was not resident on any worker"
            if min(c["resident"], lam["resident"]) < 1 else
            "It was resident throughout in both runs, so the lines have no gaps (gaps and grey bands would mark "
            "non-resident time)")
    first = "CadenceRL" if c["done"] < lam["done"] else "Laminar"
    if first != "CadenceRL":
        ctx.losses.append(f"KV-share trace on {DETAIL_POOL}: the traced trajectory {tid} finishes later under CadenceRL "
                          f"({_sec(c['done'])} s) than under Laminar ({_sec(lam['done'])} s).")
    if c["stints"] < 2 or c["resident"] >= 0.5:
        ctx.mismatches.append(f"KV-share trace on {DETAIL_POOL}: the paper's yield-and-return pattern does not show; "
                              f"under CadenceRL trajectory {tid} is resident {_pct(c['resident'])} of its life in "
                              f"{c['stints']} stint(s), {c['type_moves']} move(s) across accelerator types.")
    return "\n".join([
        "## 5. One long trajectory's KV share over its life\n",
        "Paper (Figure 14): a roughly 16K-token trajectory under CadenceRL repeatedly yields and returns at high KV "
        "share and completes first despite being resident for less than half its life; Laminar keeps it "
        "continuously resident at a persistently low KV share.\n",
        ctx.setup_line(s), "",
        f"The traced trajectory is the longest one of the CadenceRL run (id {tid}; the same seed gives the same "
        "workload under every policy). Both runs were repeated with `simulate(scenario, policy, trace=(id,))` "
        f"(Python API; the CLI does not expose traces). The untraced runs: {ctx.command('compare', s, ['cadence', 'laminar'])}\n",
        md_table(["policy", "final context tokens", "admitted at s", "last seen at s", "life s", "resident",
                  "residency stints", "moves across types", "mean KV share resident", "max KV share",
                  "accelerators used"], rows), "",
        "A residency stint ends when the trajectory is left on no worker at a decision tick; a move that evicts and "
        "places it within the same tick keeps it resident (it shows as a change of accelerator type, or not at all "
        "between two workers of one type: the trace records types, not worker ids).\n",
        f"Measured: {first} completes this trajectory first. Under CadenceRL it is resident {_pct(c['resident'])} of "
        f"its life in {c['stints']} stint(s) at a mean KV share of {c['mean_share']:.3f}; under Laminar "
        f"{_pct(lam['resident'])} in {lam['stints']} stint(s) at {lam['mean_share']:.3f}. Times come from the "
        "decision ticks (every 0.5 s), so 'last seen' is within one tick of completion.\n",
        f"![kv share]({rel})\n",
        f"*Figure 5. Trajectory {tid} on {DETAIL_POOL}: its share (0-1) of its worker's used KV cache against time "
        f"since admission (seconds), CadenceRL (top) and Laminar (bottom). {gaps}; the dashed line marks the last "
        "decision tick before completion.*\n"])


def _sweep_rows(ctx: Report, s: Scenario, knob: str, values) -> tuple[list, list[dict]]:
    runs = [ctx.runner.run(s.with_overrides(policy={knob: v}), "cadence") for v in values]
    rows = [[v, _tok(r["throughput_tok_s"]), _sec(r["latency_p95_s"]), _sec(r["latency_p99_s"]),
             _pct(r["non_resident_p95"]), ctx.command("sim", s, "cadence", **{knob: v})] for v, r in zip(values, runs)]
    return rows, runs


def sensitivity(ctx: Report) -> str:
    """Section 6: eta sweep (throughput and P95) and delta sweep (P95) for CadenceRL on DETAIL_POOL."""
    s = pool_scenario(DETAIL_POOL, ctx.settings, sweep=True)
    etas, deltas = list(ctx.settings.etas), list(ctx.settings.deltas)
    main = pool_scenario(DETAIL_POOL, ctx.settings)
    size_note = "" if main == s else (
        f" The sweeps run at {s.workload.trajectories} trajectories (batch {s.trainer.batch_size}), not the "
        f"{main.workload.trajectories} of the other sections: with only {main.workload.trajectories // main.trainer.batch_size} "
        "iterations every eta >= 1 would admit the whole workload at once, so the eta = 1 / delta = 1024 point here "
        "differs from section 2's CadenceRL run.")
    eta_rows, eta_runs = _sweep_rows(ctx, s, "eta", etas)
    delta_rows, delta_runs = _sweep_rows(ctx, s, "delta", deltas)
    eta_path, eta_rel = ctx.figure("eta_sweep")
    plots.sweep(eta_path, etas, [r["throughput_tok_s"] for r in eta_runs], [r["latency_p95_s"] for r in eta_runs],
                "eta (admission budget, iteration-batches ahead)")
    delta_path, delta_rel = ctx.figure("delta_sweep")
    plots.sweep(delta_path, deltas, [r["throughput_tok_s"] for r in delta_runs],
                [r["latency_p95_s"] for r in delta_runs], "delta (decode reserve, tokens)")
    best_eta = etas[max(range(len(etas)), key=lambda i: eta_runs[i]["throughput_tok_s"])]
    p95s = [r["latency_p95_s"] for r in eta_runs]
    monotone = all(b >= a for a, b in zip(p95s, p95s[1:]))
    dtp = [r["throughput_tok_s"] for r in delta_runs]
    dp95 = [r["latency_p95_s"] for r in delta_runs]
    if not monotone:
        ctx.mismatches.append(f"eta sweep on {DETAIL_POOL}: P95 does not rise monotonically with eta "
                              f"({', '.join(_sec(v) for v in p95s)} s for eta {', '.join(map(str, etas))}).")
    if dp95[-1] <= dp95[0]:
        ctx.mismatches.append(f"delta sweep on {DETAIL_POOL}: raising delta from {deltas[0]} to {deltas[-1]} does not "
                              f"raise P95 ({_change(dp95[-1], dp95[0])}).")
    iterations = s.workload.trajectories // s.trainer.batch_size
    saturated = [e for e in etas if e + 1 >= iterations]
    saturation_note = "" if len(saturated) < 2 else (
        f" With {iterations} iterations, eta >= {saturated[0]} already lets the whole workload be in flight "
        "(the credit model bounds it to about (eta + 1) batches), so the points for eta = "
        f"{', '.join(map(str, saturated))} can only coincide.")
    headers = ["value", "throughput tok/s", "P95 s", "P99 s", "non-resident P95", "reproduce"]
    return "\n".join([
        "## 6. Sensitivity to eta and delta\n",
        "Paper (section 6.3): raising eta from 1 to 3 improves throughput, further increases reduce it, and latency "
        "rises monotonically with eta; raising delta from 512 to 4096 tokens (on Qwen3-14B) leaves throughput stable "
        f"but substantially raises P95. Here both sweeps run CadenceRL on {DETAIL_POOL} (Qwen3-8B), one knob at a "
        f"time, the other at its default.{size_note}\n",
        ctx.setup_line(s, eta="swept", delta=s.policy.delta), "",
        "### eta\n", md_table(["eta", *headers[1:]], eta_rows), "",
        f"Measured: throughput peaks at eta = {best_eta}; P95 {'rises monotonically' if monotone else 'does not rise monotonically'} "
        f"with eta ({', '.join(_sec(v) for v in p95s)} s).{saturation_note}\n",
        f"![eta sweep]({eta_rel})\n",
        f"*Figure 6a. CadenceRL on {DETAIL_POOL}: aggregate decode throughput (left, thousands of tokens/s) and P95 "
        "trajectory latency (right, seconds) against the admission budget eta (delta = "
        f"{s.policy.delta} tokens).*\n",
        "### delta\n", ctx.setup_line(s, delta="swept"), "", md_table(["delta", *headers[1:]], delta_rows), "",
        f"Measured: from delta = {deltas[0]} to {deltas[-1]} throughput changes {_change(dtp[-1], dtp[0])} and P95 "
        f"changes {_change(dp95[-1], dp95[0])}.\n",
        f"![delta sweep]({delta_rel})\n",
        f"*Figure 6b. CadenceRL on {DETAIL_POOL}: aggregate decode throughput (left, thousands of tokens/s) and P95 "
        f"trajectory latency (right, seconds) against the decode reserve delta in tokens (eta = {s.policy.eta}).*\n"])


def _all_pools(ctx: Report) -> list[Scenario]:
    """Every pool the matrix ran, homogeneous first."""
    return ([homogeneous_scenario(m, tp, ctx.settings) for m, tp in HOMOGENEOUS_MODELS]
            + [pool_scenario(n, ctx.settings) for n in (*HETEROGENEOUS_POOLS, *EXTRA_POOLS)])


def non_resident(ctx: Report) -> str:
    """Section 7: P50/P95 of the fraction of each trajectory's life spent off every worker, CadenceRL, per pool."""
    pools = _all_pools(ctx)
    runs = [ctx.runner.run(s, "cadence") for s in pools]
    rows = [[s.name, s.model, _pct(r["non_resident_p50"]), _pct(r["non_resident_p95"]),
             _pct(PAPER_NON_RESIDENT_P95[s.name]) if s.name in PAPER_NON_RESIDENT_P95 else "",
             f"{r['evictions']} ({_pct(r['evictions'] / r['trajectories_completed'])})",
             ctx.command("sim", s, "cadence")] for s, r in zip(pools, runs)]
    path, rel = ctx.figure("non_resident")
    plots.non_resident(path, [s.name for s in pools], [r["non_resident_p50"] for r in runs],
                       [r["non_resident_p95"] for r in runs])
    by = {s.name: r for s, r in zip(pools, runs)}
    order = "lower" if by["32a"]["non_resident_p95"] < by["32b"]["non_resident_p95"] else "not lower"
    if order != "lower":
        ctx.mismatches.append(f"non-resident time: the 32a P95 is not lower than 32b's "
                              f"({_pct(by['32a']['non_resident_p95'])} vs {_pct(by['32b']['non_resident_p95'])}).")
    far = [s.name for s in pools if s.name in PAPER_NON_RESIDENT_P95 and
           abs(by[s.name]["non_resident_p95"] - PAPER_NON_RESIDENT_P95[s.name]) > 0.15]
    if far:
        ctx.mismatches.append(f"non-resident time: the P95 differs from the paper's by more than 15 points on "
                              f"{', '.join(far)} (see section 7).")
    return "\n".join([
        "## 7. Non-resident time (CadenceRL)\n",
        "The fraction of a trajectory's life (admission to completion) during which it was on no worker: waiting "
        "in the pending set after a pacing or concentration eviction, or before its first placement. Time spent "
        "queued or preempted inside a worker's engine counts as resident (the trajectory is assigned there). Paper "
        "(Table 3, 2nd-hand via shared/reference/hardware.md): P95 of 39.9% on 32A, 80.9% on 32B, 40.3% on "
        "16A16B8H; 32A lower than 32B at every percentile. Each pool's setup is listed in sections 1-3 (eta "
        f"{pools[0].policy.eta}, delta {pools[0].policy.delta}, seed {pools[0].seed}).\n",
        md_table(["pool", "model", "non-resident P50", "non-resident P95", "paper P95 (2nd-hand)",
                  "evictions (per trajectory)", "reproduce"], rows),
        "",
        *(["All P50 and P95 values are 0: CadenceRL evicts only a few percent of the trajectories here (fewer than "
           "the 5% a P95 would see) and most evicted ones are placed again at the same decision tick, so almost no "
           "trajectory spends measurable time off every worker. The paper's large non-resident fractions do not "
           "appear in this simulation.\n"] if all(r["non_resident_p95"] == 0 for r in runs) else []),
        f"Measured: the 32a P95 non-resident fraction is {order} than 32b's "
        f"({_pct(by['32a']['non_resident_p95'])} vs {_pct(by['32b']['non_resident_p95'])}).\n",
        f"![non-resident]({rel})\n",
        "*Figure 7. CadenceRL: median (P50) and 95th percentile (P95) over trajectories of the share of each "
        "trajectory's life spent not resident on any worker (percent), per pool; the P95 value is printed above "
        "each pair" + (" (all 0% here, so no bars are visible)" if all(r["non_resident_p95"] == 0 for r in runs)
                       else "") + ".*\n"])


def physical_bound(ctx: Report) -> str:
    """Section 8: throughput as a fraction of the oracle bound, P95 as a multiple of it; the derivation."""
    pools = _all_pools(ctx)
    by_pool = {s.name: ctx.run_all(s, HOMOGENEOUS_POLICIES if s.name.startswith("h800-16") else HETEROGENEOUS_POLICIES)
               for s in pools}
    tp_rows = [[n, _tok(rs["cadence"]["bound_throughput_tok_s"])] + [
        _pct(rs[p]["throughput_fraction_of_bound"]) if p in rs else "-" for p in HOMOGENEOUS_POLICIES]
        for n, rs in by_pool.items()]
    lat_rows = [[n, _sec(rs["cadence"]["bound_latency_p95_s"])] + [
        _ratio(rs[p]["p95_multiple_of_bound"]) if p in rs else "-" for p in HOMOGENEOUS_POLICIES]
        for n, rs in by_pool.items()]
    path, rel = ctx.figure("bound")
    plots.bound_scatter(path, [r for rs in by_pool.values() for r in rs.values()])
    derivation = bounds.__doc__.split("Derivation (also in the report):", 1)[-1].strip()
    return "\n".join([
        "## 8. Distance from the physical bound\n",
        "`bound_throughput_tok_s` and `bound_latency_p95_s` come from an explicitly named oracle "
        "(`cadencerl/bounds.py`) that reads the sealed target lengths; no policy can beat them on the same pool "
        "and workload. Runs and setups as in sections 1-3; `-` = not run (DORA* on heterogeneous pools).\n",
        "### Derivation\n", derivation, "",
        "### Throughput as a fraction of the bound\n",
        md_table(["pool", "bound tok/s", *HOMOGENEOUS_POLICIES], tp_rows), "",
        "### P95 latency as a multiple of the bound\n",
        md_table(["pool", "bound P95 s", *HOMOGENEOUS_POLICIES], lat_rows), "",
        f"![bound]({rel})\n",
        "*Figure 8. Every run of sections 1-3 as one point: P95 latency as a multiple of the P95 latency bound "
        "(x; 1 would be the bound) against throughput as a percentage of the throughput bound (y; 100% would be "
        "the bound). Up and to the left is better.*\n"])


def cost(ctx: Report) -> str:
    """Section 9: tokens per dollar where every device type in the pool has a listed price."""
    rows, values, groups = [], {}, []
    for s in _all_pools(ctx):
        price = pool_price(s)
        if price is None:
            rows.append([s.name, sum(g.devices for g in s.pool), "n/a", "", "", "", ""])
            continue
        results = ctx.run_all(s, HOMOGENEOUS_POLICIES if s.name.startswith("h800-16") else HETEROGENEOUS_POLICIES)
        per = {p: r["throughput_tok_s"] * 3600 / price / 1e6 for p, r in results.items()}
        best = max((p for p in per if p != "cadence"), key=per.get)
        groups.append(s.name)
        values.update({(s.name, p): v for p, v in per.items()})
        rows.append([s.name, sum(g.devices for g in s.pool), f"{price:.2f}", _tok(results["cadence"]["throughput_tok_s"]),
                     f"{per['cadence']:.2f}", f"{per[best]:.2f} ({best})", _ratio(per["cadence"] / per[best])])
    path, rel = ctx.figure("cost")
    plots.metric_bars(path, groups, list(HOMOGENEOUS_POLICIES), values, "million tokens per dollar", "pool")
    prices = ", ".join(f"{n} ${a.price_per_hour:.2f}" for n, a in ACCELERATORS.items() if a.price_per_hour is not None)
    return "\n".join([
        "## 9. Cost view\n",
        f"Pool price = sum over devices of the per-device-hour price in `cadencerl.hardware.catalog` ({prices} per "
        "device-hour; 2nd-hand, CadenceRL Table 1). Million tokens per dollar = throughput x 3600 / pool $ per hour "
        "/ 1e6. Runs and setups as in sections 1-3.\n",
        md_table(["pool", "devices", "$ / hour", "cadence tok/s", "cadence Mtok / $", "best other Mtok / $",
                  "cadence / best"], rows), "",
        f"![cost]({rel})\n",
        "*Figure 9. Decode tokens per dollar (millions of tokens per dollar of device-hours) per pool and policy, at "
        "the listed device prices. CadenceRL's bars are outlined in black.*\n"])


MIXED_SCENARIOS = ("mixed-h200", "mixed-h100", "mixed-16a8h")
MIXED_POLICIES = ("misa+cache-aware-tuned", "cache-aware-tuned", "round-robin", "least-loaded-router")


def _mixed_scenario(name: str, settings: Settings) -> Scenario:
    """The built-in mixed scenario, sized like the other runs (--quick: 8192 sessions) in four batches,
    so that as in the full run (12288 in batches of 2048) the pool is under load, where MISA-T matters."""
    s = builtin_scenario(name)
    if settings.trajectories is not None:
        n = settings.trajectories
        s = s.with_overrides(workload={"trajectories": n}, trainer={"batch_size": max(1, n // 4)})
    return s.with_overrides(seed=settings.seed) if settings.seed is not None else s


def misa_t(ctx: Report) -> str:
    """Section 10: MISA-T against the sweep-tuned cache-aware router (and the simpler routers) on mixed rollouts."""
    from cadencerl.runs.sweep import tuned_thresholds

    names = MIXED_SCENARIOS[:1] if ctx.settings.quick else MIXED_SCENARIOS
    parts = ["## 10. MISA-T: admission for mixed RLVR / RLHF / agentic rollouts\n",
             "Paper (MISA-T abstract): over a sweep-tuned cache-aware vLLM Router, +53.3% (Step3.7) and +43.6% "
             "(Qwen3.6-35B-A3B) rollout throughput with a high prefix-cache hit rate; in a 50-iteration run the "
             "consumed mixture stays close to the trainer target (D_TV 4.14 -> 2.71 pp). Below: this simulator. "
             "`cache-aware-tuned` is the router with the thresholds its sweep found best for that scenario "
             "(`cadencerl sweep`); MISA-T runs with its documented defaults, untuned.\n"]
    values: dict[tuple[str, str], float] = {}
    for name in names:
        s = _mixed_scenario(name, ctx.settings)
        policies = list(MIXED_POLICIES) + (["misa+cadence"] if len(s.pool) > 1 else [])
        best = tuned_thresholds(s)
        results = ctx.run_all(s, policies)
        base = results["cache-aware-tuned"]
        rows = []
        for p, r in results.items():
            pc = r["per_class"]
            rows.append([p, _tok(r["throughput_tok_s"]), _ratio(r["throughput_tok_s"] / base["throughput_tok_s"]),
                         _pct(r["prefix_hit_rate"]), f"{r['mixture_dtv_pp']:.1f}",
                         "n/a" if r["mixture_dtv_steady_pp"] is None else f"{r['mixture_dtv_steady_pp']:.1f}",
                         *(_sec(pc[c]["latency_p95_s"]) if c in pc else "" for c in ("agent", "rlvr", "rlhf")),
                         r["preemptions"]])
            values[(name, p)] = r["throughput_tok_s"] / base["throughput_tok_s"]
        w = s.workload
        mix = ", ".join(f"{c} {100 * m:.1f}%" for c, m in w.target_mix().items())
        parts += [f"### {name}\n",
                  f"*Setup:* pool {describe_pool(s)}; model {s.model}; {w.trajectories} sessions, target mix {mix}; "
                  f"trainer batch {s.trainer.batch_size}, seed {s.seed}, eta {s.policy.eta}. Tuned router thresholds: "
                  f"{best}.\n",
                  md_table(["policy", "throughput tok/s", "vs tuned router", "prefix hit rate", "D_TV pp",
                            "D_TV pp (steady)", "agent P95 s", "RLVR P95 s", "RLHF P95 s", "preemptions"], rows),
                  "", f"Reproduce: {ctx.command('compare', s, policies)}\n"]
        gain = results["misa+cache-aware-tuned"]["throughput_tok_s"] / base["throughput_tok_s"] - 1
        dtv = results["misa+cache-aware-tuned"]["mixture_dtv_pp"] - base["mixture_dtv_pp"]
        if dtv > 0:
            ctx.mismatches.append(f"{name}: MISA-T's mean per-batch mixture deviation is {dtv:+.1f} pp against the "
                                  "tuned router (the paper reports it smaller).")
        if gain < 0.43:
            ctx.mismatches.append(f"{name}: MISA-T's throughput gain over the tuned router is {100 * gain:+.0f}% "
                                  "(the paper reports +43.6% to +53.3%).")
    path, rel = ctx.figure("misa_t")
    plots.metric_bars(path, list(names), [p for p in (*MIXED_POLICIES, "misa+cadence")
                                          if any((n, p) in values for n in names)],
                      values, "throughput relative to the tuned cache-aware router", "scenario")
    parts += [f"![misa-t]({rel})\n",
              "*Figure 10. Rollout throughput of each router and of MISA-T, relative to the sweep-tuned cache-aware "
              "router (1.0) on each mixed scenario.*\n",
              "D_TV is the total-variation distance between each consumed batch's class mix and the target, averaged "
              "over batches, in percentage points; the steady column leaves out the first batch (only short sessions "
              "can have finished) and the last (the tail), which dominate a run of a few iterations.\n"]
    return "\n".join(parts)


EXPERIMENTS = (homogeneous, heterogeneous, composability, specialization, kv_share_trace, sensitivity, non_resident,
               physical_bound, cost, misa_t)


# --------------------------------------------------------------------------------------------- the document


def _common_setup(ctx: Report) -> str:
    s, sweep = pool_scenario(DETAIL_POOL, ctx.settings), pool_scenario(DETAIL_POOL, ctx.settings, sweep=True)
    w, t, p = s.workload, s.trainer, s.policy
    mode = ("quick (`--quick`): a smaller workload than the full report, with the same trainer batch so as many "
            "trajectories are in flight; its numbers differ from the full report's, quote those instead"
            if ctx.settings.quick else "full")
    sweep_note = "." if sweep == s else (f"; the section-6 sweeps excepted ({sweep.workload.trajectories} "
                                         f"trajectories, batch {sweep.trainer.batch_size}).")
    return "\n".join([
        "## Setup common to every experiment\n",
        f"- Mode: {mode}. Every run: {w.trajectories} trajectories, trainer batch {t.batch_size} "
        f"({w.trajectories // t.batch_size} iterations), train time {t.train_time_s:g} s per iteration, seed {s.seed} "
        f"(the same seed gives the same workload under every policy){sweep_note}",
        f"- Workload: groups of {w.group_size} samples per prompt; prompt log-normal median {w.prompt.median:g}, "
        f"sigma {w.prompt.sigma:g}, cap {w.prompt.cap}; response log-normal median {w.response.median:g}, sigma "
        f"{w.response.sigma:g}, cap {w.response.cap} tokens; prompt difficulty sigma {w.prompt_difficulty_sigma:g}; "
        "single turn.",
        f"- Policy knobs unless an experiment says otherwise: eta {p.eta}, delta {p.delta} tokens, headroom floor "
        f"{p.headroom_floor:g}, decision tick {p.tick_s:g} s, KV preparation {'on' if p.kv_preparation else 'off'}.",
        "- Simulator: the closed-form discrete-event pool simulator (`cadencerl/sim`), each worker a vLLM V1 "
        "engine (max_num_seqs 256, preemption by recompute); roofline step times from `cadencerl/hardware`.",
        "- Latency = admission to completion (waiting included). Throughput = generated tokens / makespan.",
        "- Reproduce: every table gives the `cadencerl sim` / `cadencerl compare` command for its rows; scenario "
        "files that are not built-ins are written to `scenarios/`. `results.json` holds every run's full figures "
        "with the setup it ran under (key `setup`).\n"])


def _losses_section(ctx: Report) -> str:
    def bullets(items: list[str]) -> str:
        return "\n".join(f"- {x}" for x in dict.fromkeys(items)) if items else "- None in this matrix."
    return "\n".join(["### Where CadenceRL loses to a baseline (as measured)\n", bullets(ctx.losses), "",
                      "### Paper claims this simulation does not reproduce\n", bullets(ctx.mismatches), ""])


def render(ctx: Report, sections: list[str], wall_s: float) -> str:
    return "\n".join([
        "# CadenceRL evaluation report (simulated)\n",
        "Generated by `cadencerl report" + (" --quick" if ctx.settings.quick else "") + "`, following section 6 of "
        "the CadenceRL paper (see shared/papers/cadencerl-summary.txt). All numbers are measured in the simulator "
        f"on seeded workloads; nothing was tuned per policy. {len(ctx.runner.records)} runs, {wall_s:.0f} s wall "
        "time.\n",
        "## Headline: CadenceRL vs the best baseline on the heterogeneous pools\n",
        HETEROGENEOUS_RATIO_TABLE_HEADER, ctx.headline, "",
        _losses_section(ctx), _common_setup(ctx), *sections])


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)


def build_report(out: str | Path, *, quick: bool = False, trajectories: int | None = None, seed: int | None = None,
                 progress: bool = True, processes: int | None = None) -> Path:
    """Run the matrix and write out/report.md, out/results.json, out/figures/ and out/scenarios/; returns report.md.

    `processes` (default: the CPU count) simulate the planned runs in parallel; results do not depend on it.
    """
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = make_settings(quick, trajectories, seed)
    jobs = planned_runs(settings)
    with _progress(progress) as bar:
        runner = Runner(bar, planned=len(jobs) + 2)
        runner.prefetch(jobs, processes if processes is not None else (os.cpu_count() or 1))
        ctx = Report(out, settings, runner)
        sections = [experiment(ctx) for experiment in EXPERIMENTS]
    wall = time.perf_counter() - started
    report = out / "report.md"
    report.write_text(render(ctx, sections, wall))
    (out / "results.json").write_text(json.dumps(
        {"mode": "quick" if settings.quick else "full", "wall_time_s": wall, "runs": runner.records}, indent=1) + "\n")
    return report
