"""The router's policy and pool: any registered policy, built by `runs/registry` as `sim` and `run`
build it, over workers described as the simulator describes them.

The router's own settings fill in what a simulated scenario would: its classes are the target mix
and its vllm-router flags are `cache-aware`'s thresholds; `--config` gives the scenario whose
`controller:` and `cadence:` knobs the policy takes (without it, the built-in `cpu-pair`'s) and
whose pool describes the servers, the i-th URL its i-th worker (accelerator, affinity rank).
"""

from __future__ import annotations

from cadencerl.config import ConfigError, Scenario, builtin_scenario, load_scenario_file
from cadencerl.core.policy import Policy
from cadencerl.core.worker import Worker
from cadencerl.runs.assemble import build_pool
from cadencerl.runs.registry import live_scenario, make_policy

DEFAULT_SCENARIO = "cpu-pair"
# Policies that pace a trainer's batches themselves (they wait for a batch to finish before the
# next starts): behind a router, the clients pace their own requests, so these have nothing to run.
BATCH_PACED = ("sync", "one-off", "dora", "laminar")


def router_scenario(path: str | None) -> Scenario:
    return load_scenario_file(path) if path is not None else builtin_scenario(DEFAULT_SCENARIO)


def router_policy(settings) -> Policy:
    """The policy `settings.policy` names (`cadence`, `misa+cache-aware`, `least-loaded`, a variant file)."""
    placement = settings.policy.rpartition("+")[2]
    if placement in BATCH_PACED:
        raise ConfigError(f"policy: {placement!r} paces a trainer's batches, which a router's clients do "
                          "themselves; behind a router use cadence, areal, least-loaded or a router policy")
    if placement == "cache-aware-tuned":
        raise ConfigError("policy: 'cache-aware-tuned' is tuned by a simulated sweep (cadencerl sweep); give its "
                          "thresholds to 'cache-aware' (--cache-threshold, --balance-abs-threshold, ...)")
    thresholds = dict(cache_threshold=settings.cache_threshold, balance_abs_threshold=settings.balance_abs_threshold,
                      balance_rel_threshold=settings.balance_rel_threshold,
                      eviction_interval_s=settings.eviction_interval_s, max_tree_size=settings.max_tree_size)
    return make_policy(settings.policy, live_scenario(router_scenario(settings.scenario_file)),
                       target_mix=settings.target_mix, cache_aware=thresholds)



def described_workers(settings) -> list[Worker]:
    """The `--config` pool's workers, in order (none without `--config`)."""
    return build_pool(router_scenario(settings.scenario_file))[0] if settings.scenario_file else []


def router_worker(settings, described: list[Worker], wid: int) -> Worker:
    """Worker `wid` as the router sees it: the described one of that place (a server past the pool's
    end is like its last), else one of a uniform fleet. Its KV is `--kv-capacity` until it reports its own."""
    like = described[min(wid, len(described) - 1)] if described else None
    seqs = settings.max_num_seqs if like is None or "max_num_seqs" in settings.model_fields_set else like.max_num_seqs
    if like is None:
        return Worker(id=wid, accelerator="vllm", cluster="fleet", tp=1, kv_capacity=settings.kv_capacity,
                      max_num_seqs=seqs, rank=0)
    return Worker(id=wid, accelerator=like.accelerator, cluster=like.cluster, tp=like.tp,
                  kv_capacity=settings.kv_capacity, max_num_seqs=seqs, rank=like.rank)
