"""Plan a pool: which accelerators, how many, which eta (and delta), for a workload and a budget.

Every composition of the candidates' allowed device counts within the budget is a pool; each is
bounded by its peak decode rate (`peak_decode_bound`), evaluated in steady state by the simulator,
best bound first, and a pool whose bound is below the best steady throughput found is never run
(branch and bound: it cannot be the best). The search and why it prunes so: docs/planner.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from cadencerl.config import ConfigError, Scenario
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.fanout import Fanout
from cadencerl.runs.prices import Price


@dataclass(frozen=True)
class Candidate:
    accelerator: str
    tp: int
    counts: tuple[int, ...]     # device counts allowed (0: the type may be left out)


@dataclass(frozen=True)
class Pool:
    devices: tuple[int, ...]    # per candidate, in the candidates' order
    cost_per_hour: float
    bound_tok_s: float          # peak decode rate: no run on it is faster (0 where it cannot run)
    infeasible: str = ""        # why this workload cannot run on it, if so


def parse_candidates(text: str, base: Scenario) -> list[Candidate]:
    """`TYPE[@TP]:N,N,...;...`, e.g. `H800:0,8,16;A910X@2:0,16,32`; TP defaults to the base pool's for
    that type, else 1."""
    from cadencerl.hardware import catalog

    tps = {g.accelerator: g.tp for g in base.pool}
    out = []
    for i, part in enumerate(p.strip() for p in text.split(";") if p.strip()):
        name, sep, counts = part.partition(":")
        name, _, tp = name.strip().partition("@")
        where = f"candidates.{i}"
        if not sep or not counts.strip():
            raise ConfigError(f"{where}: expected TYPE[@TP]:N,N,... (device counts allowed), got {part!r}")
        if name not in catalog.ACCELERATORS:
            raise ConfigError(f"{where}: unknown accelerator {name!r} (known: {', '.join(catalog.ACCELERATORS)})")
        try:
            tp_n = int(tp) if tp else tps.get(name, 1)
            ns = tuple(sorted({int(c) for c in counts.split(",") if c.strip()}))
        except ValueError:
            raise ConfigError(f"{where}: TP and counts are integers, got {part!r}") from None
        if tp_n < 1 or not ns or ns[0] < 0 or any(n % tp_n for n in ns):
            raise ConfigError(f"{where}: counts are integers >= 0, each a multiple of tp ({tp_n}), got {part!r}")
        if name in {c.accelerator for c in out}:
            raise ConfigError(f"{where}: {name} is named twice")
        out.append(Candidate(name, tp_n, ns))
    if not out:
        raise ConfigError("candidates: give at least one, e.g. 'H800:0,8,16;A910X@2:0,16,32'")
    return out


def default_candidates(base: Scenario) -> list[Candidate]:
    """The base pool's types, each at none, half and all of its devices (half rounded to whole workers)."""
    return [Candidate(g.accelerator, g.tp, tuple(sorted({0, g.devices // 2 // g.tp * g.tp, g.devices})))
            for g in base.pool]


def pool_scenario(base: Scenario, candidates: list[Candidate], devices: tuple[int, ...]) -> Scenario:
    """The base scenario (model, workload, trainer, knobs) on this pool; each type its own cluster."""
    pool = [{"accelerator": c.accelerator, "devices": n, "tp": c.tp, "cluster": c.accelerator.lower()}
            for c, n in zip(candidates, devices) if n > 0]
    types = {p["accelerator"] for p in pool}
    order = [t for t in (base.affinity_order or []) if t in types]
    affinity = order if set(order) == types else None     # a type new to the base: the default affinity rule
    name = "+".join(f"{n}{c.accelerator}" for c, n in zip(candidates, devices) if n > 0)
    return base.with_overrides(name=name[:80], pool=pool, affinity_order=affinity)


def shortest_prompt(scenario: Scenario) -> int:
    """The workload's shortest prompt (prompt lengths are visible; the response lengths stay sealed)."""
    from cadencerl.workload.generate import generate

    return min(s.prompt_len for s in generate(scenario.workload, scenario.seed, object()))


def pool_cost(scenario: Scenario, prices: dict[str, Price]) -> float:
    """Dollars per hour of the scenario's pool at `prices` (every type of it must have one)."""
    return sum(g.devices * prices[g.accelerator].per_hour for g in scenario.pool)


def peak_decode_bound(scenario: Scenario, min_prompt: int) -> float:
    """Tokens per second no run on this pool exceeds: every worker decoding its largest batch
    (max_num_seqs, or as many of the shortest contexts as its KV holds) back to back at the smallest
    context that batch can have (each sequence at least its prompt plus one token). A step's rate
    b / t(b, C) grows with b and falls with C (t is linear in both), so this is each worker's most."""
    workers, perfs = build_pool(scenario)
    min_ctx = min_prompt + 1
    total = 0.0
    for w, p in zip(workers, perfs):
        n = max(1, min(w.max_num_seqs, w.kv_capacity // min_ctx))
        total += n / p.decode_line(n, n * min_ctx).step(0)
    return total


def enumerate_pools(base: Scenario, candidates: list[Candidate], prices: dict[str, Price],
                    budget: float | None) -> tuple[list[Pool], int]:
    """Every composition within the budget (none empty), and how many were over it."""
    pools, over = [], 0
    min_prompt = shortest_prompt(base)
    for devices in itertools.product(*(c.counts for c in candidates)):
        if not any(devices):
            continue
        cost = sum(n * prices[c.accelerator].per_hour for c, n in zip(candidates, devices))
        if budget is not None and cost > budget + 1e-9:
            over += 1
            continue
        try:
            bound, why = peak_decode_bound(pool_scenario(base, candidates, devices), min_prompt), ""
        except ConfigError as exc:     # the model or the longest trajectory does not fit, too many workers
            bound, why = 0.0, str(exc)
        pools.append(Pool(devices, cost, bound, why))
    return pools, over


def evaluate(scenario: Scenario, policy: str) -> dict:
    """One steady-state run (module level: fanned out); a run the policy cannot finish is a row with `error`."""
    from cadencerl.core.controller import StallError
    from cadencerl.runs.registry import make_policy
    from cadencerl.runs.simulate import simulate

    try:
        r = simulate(scenario, make_policy(policy, scenario))
    except (ConfigError, StallError) as exc:
        return {"error": str(exc).splitlines()[0]}
    steady = bool(r.get("steady_throughput_tok_s"))
    return {"steady": steady,
            "throughput_tok_s": r["steady_throughput_tok_s"] if steady else r["throughput_tok_s"],
            "latency_p95_s": r["steady_latency_p95_s"] if steady else r["latency_p95_s"],
            "whole_run_throughput_tok_s": r["throughput_tok_s"], "preemptions": r["preemptions"],
            "trajectories": r["trajectories_completed"]}


def search(base: Scenario, candidates: list[Candidate], prices: dict[str, Price], budget: float | None, *,
           policy: str = "cadence", etas: tuple[int, ...] = (1,), deltas: tuple[int | None, ...] = (None,),
           fanout: Fanout = Fanout(), exhaustive: bool = False, monotone: bool = False, wave: int = 8,
           progress: Callable[[int, int], None] | None = None) -> dict:
    """Branch and bound over the pools within `budget`, `wave` pools at a time, best bound first (the
    waves do not depend on where they run, so a Ray run evaluates the same pools as a local one);
    every (eta, delta) on each pool. `exhaustive`: every pool is run, none pruned. `monotone` assumes
    throughput never falls as devices are added, and so runs only the pools no other pool within the
    budget holds (an assumption: an exhaustive run reports where it fails, `monotonicity_violations`)."""
    pools, over = enumerate_pools(base, candidates, prices, budget)
    feasible = sorted((p for p in pools if not p.infeasible), key=lambda p: (-p.bound_tok_s, p.cost_per_hour, p.devices))
    runs: list[dict] = []
    pruned: list[Pool] = []
    if monotone and not exhaustive:
        maximal = [p for p in feasible if not any(_holds(q, p) for q in feasible)]
        pruned = [p for p in feasible if p not in maximal]
        feasible = maximal
    best: dict | None = None
    queue = list(feasible)
    settings = [(e, d) for e in etas for d in deltas]
    while queue:
        if best is not None and not exhaustive:
            cut = next((i for i, p in enumerate(queue) if p.bound_tok_s < best["throughput_tok_s"]), len(queue))
            pruned += queue[cut:]     # sorted by bound: the rest can only be slower than the best
            queue = queue[:cut]
        batch, queue = queue[:wave], queue[wave:]
        jobs = [(_knobbed(pool_scenario(base, candidates, p.devices), e, d), policy) for p in batch for e, d in settings]
        planned = len(runs) + (len(batch) + len(queue)) * len(settings)   # shrinks as pools are pruned
        tick = None if progress is None else (lambda i, _n, d=len(runs), t=planned: progress(d + i, t))
        results = fanout.map(evaluate, jobs, tick)
        for (p, (e, d)), r in zip(((p, s) for p in batch for s in settings), results):
            row = _row(candidates, p, e, d, r)
            runs.append(row)
            if "error" not in row and (best is None or _better(row, best)):
                best = row
    return {"policy": policy, "budget_per_hour": budget, "candidates": [c.__dict__ for c in candidates],
            "prices": {c.accelerator: prices[c.accelerator].__dict__ for c in candidates},
            "pools_total": len(pools) + over, "pools_over_budget": over,
            "pools_infeasible": [{"pool": _label(candidates, p.devices), "why": p.infeasible}
                                 for p in pools if p.infeasible],
            "pools_pruned": [{"pool": _label(candidates, p.devices), "bound_tok_s": p.bound_tok_s,
                              "cost_per_hour": p.cost_per_hour} for p in pruned],
            "runs": runs, "frontier": pareto(runs), "best": best, "why": _why(best, runs, pruned, budget),
            "bound_violations": [r["pool"] for r in runs if "error" not in r and r["throughput_tok_s"] > r["bound_tok_s"]],
            "exhaustive": exhaustive, "monotone": monotone,
            "monotonicity_violations": _violations(runs) if exhaustive else None}


def _holds(q: Pool, p: Pool) -> bool:
    """Does `q` hold every device of `p`, and more?"""
    return q.devices != p.devices and all(a >= b for a, b in zip(q.devices, p.devices))


def _violations(runs: list[dict]) -> list[str]:
    """Pairs of pools where the larger one (every device of the smaller, and more) is slower, each at
    its best (eta, delta)."""
    best: dict[tuple, dict] = {}
    for r in runs:
        key = tuple(r["devices"].values())
        if "error" not in r and (key not in best or _better(r, best[key])):
            best[key] = r
    return [f"{big['pool']} ({big['throughput_tok_s']:,.0f} tok/s) < {small['pool']} ({small['throughput_tok_s']:,.0f})"
            for k, small in best.items() for kk, big in best.items()
            if kk != k and all(a >= b for a, b in zip(kk, k)) and big["throughput_tok_s"] < small["throughput_tok_s"]]


def _knobbed(s: Scenario, eta: int, delta: int | None) -> Scenario:
    return s.with_knobs(eta=eta) if delta is None else s.with_knobs(eta=eta, delta=delta)


def _label(candidates: list[Candidate], devices: tuple[int, ...]) -> str:
    return " + ".join(f"{n} {c.accelerator}" for c, n in zip(candidates, devices) if n > 0)


def _row(candidates: list[Candidate], p: Pool, eta: int, delta: int | None, r: dict) -> dict:
    row = {"pool": _label(candidates, p.devices), "devices": dict(zip((c.accelerator for c in candidates), p.devices)),
           "eta": eta, "delta": delta, "cost_per_hour": p.cost_per_hour, "bound_tok_s": p.bound_tok_s, **r}
    if "error" not in r:
        row["tokens_per_dollar"] = r["throughput_tok_s"] * 3600.0 / p.cost_per_hour
    return row


def _better(a: dict, b: dict) -> bool:
    """Higher steady throughput; then lower P95; then cheaper."""
    return (-a["throughput_tok_s"], a["latency_p95_s"], a["cost_per_hour"]) < \
        (-b["throughput_tok_s"], b["latency_p95_s"], b["cost_per_hour"])


def pareto(runs: list[dict]) -> list[dict]:
    """The runs no other run beats on all three of throughput (up), P95 (down) and tokens per dollar
    (up), at least as good on each and better on one; by throughput, highest first."""
    ok = [r for r in runs if "error" not in r]

    def dominates(a: dict, b: dict) -> bool:
        ge = (a["throughput_tok_s"] >= b["throughput_tok_s"] and a["latency_p95_s"] <= b["latency_p95_s"]
              and a["tokens_per_dollar"] >= b["tokens_per_dollar"])
        return ge and (a["throughput_tok_s"], -a["latency_p95_s"], a["tokens_per_dollar"]) != \
            (b["throughput_tok_s"], -b["latency_p95_s"], b["tokens_per_dollar"])

    front = [r for r in ok if not any(dominates(o, r) for o in ok)]
    return sorted(front, key=lambda r: (-r["throughput_tok_s"], r["latency_p95_s"]))


def _why(best: dict | None, runs: list[dict], pruned: list[Pool], budget: float | None) -> str:
    if best is None:
        return "no pool within the budget ran this workload to the end"
    others = sorted((r for r in runs if "error" not in r and r["pool"] != best["pool"]),
                    key=lambda r: -r["throughput_tok_s"])
    under = f"within ${budget:,.2f}/h" if budget is not None else "of the candidates"
    text = (f"{best['pool']} at eta {best['eta']}" + (f", delta {best['delta']}" if best["delta"] is not None else "")
            + f": the highest steady throughput {under}, {best['throughput_tok_s']:,.0f} tok/s at "
            f"${best['cost_per_hour']:,.2f}/h (P95 {best['latency_p95_s']:,.0f} s, "
            f"{best['tokens_per_dollar']:,.0f} tokens per dollar)")
    if others:
        o = others[0]
        text += (f"; the next pool, {o['pool']}, reaches {o['throughput_tok_s']:,.0f} tok/s "
                 f"({o['throughput_tok_s'] / best['throughput_tok_s']:.0%} of it) at ${o['cost_per_hour']:,.2f}/h")
    if pruned:
        text += f"; {len(pruned)} pools were pruned, not run (see pools_pruned)"
    return text
