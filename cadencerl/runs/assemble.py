"""Turn a scenario into what a run needs: workers with capacities, perf models and affinity ranks,
and the up-front checks that a workload can run on them at all."""

from __future__ import annotations

from cadencerl.config import CadenceSpec, ConfigError, Scenario
from cadencerl.core.spec import TrajectorySpec, total_tokens
from cadencerl.core.worker import Worker
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import WorkerPerf, make_perf
from cadencerl.policies.decode_share import DecodeRate


def sweep_rate(perf: WorkerPerf) -> float:
    """How many times per second a worker can read its whole KV cache: bandwidth / KV bytes.

    The default affinity rule. Long-context tail work is bandwidth-per-KV bound, while large-memory
    workers are best used as throughput workers; on the CadenceRL pools it reproduces the paper's
    order H800 > BI-V150 > A910X.
    """
    a = perf.accel
    return a.mem_bw_gbs * perf.tp * catalog.GB / (perf.kv_capacity_tokens() * perf.kv_bytes_per_token)


def decode_rate(scenario: Scenario) -> DecodeRate:
    """The pool's perf model per accelerator type and TP, for CadenceRL's decode-weighted fair share."""
    model = catalog.model(scenario.model)
    return DecodeRate({(g.accelerator, g.tp): make_perf(catalog.accelerator(g.accelerator), model, g.tp)
                       for g in scenario.pool})


def build_pool(scenario: Scenario) -> tuple[list[Worker], list[WorkerPerf]]:
    model = catalog.model(scenario.model)
    perfs: list[WorkerPerf] = []
    groups = []
    for g in scenario.pool:
        perf = make_perf(catalog.accelerator(g.accelerator), model, g.tp)
        groups.append((g, perf))
    if scenario.affinity_order is not None:
        order = {name: i for i, name in enumerate(scenario.affinity_order)}
        rank = {g.accelerator: order[g.accelerator] for g, _ in groups}
    else:
        rates = sorted({g.accelerator: sweep_rate(p) for g, p in groups}.items(), key=lambda kv: -kv[1])
        rank = {name: i for i, (name, _) in enumerate(rates)}
    workers: list[Worker] = []
    for g, perf in groups:
        cap = perf.kv_capacity_tokens()
        for _ in range(g.workers):
            workers.append(Worker(len(workers), g.accelerator, g.cluster_name, g.tp, cap,
                                  g.max_num_seqs, rank[g.accelerator]))
            perfs.append(perf)
    if scenario.workload.trace is None:
        _check_longest_fits_every_worker(scenario, workers)
    return workers, perfs


def _check_longest_fits_every_worker(scenario: Scenario, workers: list[Worker]) -> None:
    """The longest trajectory the caps allow fits on every worker: a policy may place a trajectory on any
    worker and keep it there (the routers never move one), so the smallest worker bounds it."""
    small = min(workers, key=lambda w: w.kv_capacity)
    plain = scenario.workload.classes is None
    for name, cls in scenario.workload.class_specs().items():
        n = cls.prompt.cap + cls.response.cap
        if cls.turns is not None:
            n += (cls.turns.turns_max - 1) * (cls.turns.observation.cap + cls.response.cap)
        if n > small.kv_capacity:
            where = "workload" if plain else f"workload.classes.{name}"
            how = ("prompt.cap + response.cap" if cls.turns is None else
                   "prompt.cap + turns_max x response.cap + (turns_max - 1) x observation.cap")
            raise ConfigError(f"{where}: its longest possible trajectory ({how} = {n:,} tokens) does not fit the "
                              f"KV of a {small.accelerator} TP={small.tp} worker ({small.kv_capacity:,} tokens), and "
                              "a policy may place it on any worker; lower those caps or give that pool group a "
                              "larger tp")


def check_fits_somewhere(specs: list[TrajectorySpec], workers: list[Worker], key: object,
                         params: CadenceSpec | None = None) -> None:
    """A trajectory longer than every worker's KV could never run: say so before starting. With
    `params`, the same for a prompt plus the decode reserve `delta` and the headroom floor a
    placement must leave (else a policy that honours them could never place it, and would stall)."""
    largest = max(w.kv_capacity for w in workers)
    _check_longest(specs, key, largest, f"KV tokens, more than any worker holds ({largest})")
    if params is None or not specs:
        return
    room = max(w.kv_capacity - int(params.headroom_floor * w.kv_capacity) for w in workers)
    longest = max(specs, key=lambda s: s.prompt_len)
    if longest.prompt_len + params.delta > room:
        raise ConfigError(f"cadence.delta: a decode reserve of {params.delta} tokens leaves no worker room for the "
                          f"prompt of trajectory {longest.id} ({longest.prompt_len} tokens; at most {room} tokens "
                          f"fit above the headroom floor); lower it (--delta)")


def check_model_len(specs: list[TrajectorySpec], key: object, max_len: int) -> None:
    """Real servers silently truncate past max_model_len: refuse such a workload up front."""
    _check_longest(specs, key, max_len, f"tokens, more than the servers' max_model_len ({max_len})")


def _check_longest(specs: list[TrajectorySpec], key: object, limit: int, what: str) -> None:
    for s in specs:
        total = total_tokens(s, key)
        if total > limit:
            raise ConfigError(f"workload: trajectory {s.id} needs {total} {what}")
