"""Per-server report records of a real run: the controller's accounting and /metrics side by side.

Shaped like a simulated engine where `runs.summary.summarize` reads it (tokens, preemptions, the
prefix cache), so a real run reports the same figures as `sim`, plus the server's own view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cadencerl.engine.server_metrics import EngineMetrics


@dataclass
class CacheCounts:
    """Prefix-cache counters over the run, shaped like the simulator's cache for `summarize`."""

    hits: int = 0
    queried: int = 0


@dataclass
class WorkerRecord:
    """One worker over the run; counters from /metrics are taken relative to the first sample."""

    worker: int
    url: str
    kv_capacity: int                     # tokens the controller may commit
    server_kv_tokens: int                # tokens the server holds
    alive: bool = True
    tokens_generated: int = 0            # tokens received from this worker (kept or not)
    prompt_tokens_sent: int = 0
    prefill_tokens: int = 0              # prompt tokens sent less the server's prefix-cache hits
    preemptions: int = 0                 # the server's num_preemptions_total over the run
    preemptions_by_class: dict = field(default_factory=dict)  # not observable on a real server
    cache: CacheCounts = field(default_factory=CacheCounts)
    committed: int = 0                   # controller's KV tokens at the last metrics sample
    server_kv_used: int = 0              # server's kv_cache_usage_perc x its capacity, same sample
    running: int = 0
    waiting: int = 0
    samples: int = 0
    max_committed: int = 0
    max_server_kv_used: int = 0
    max_running: int = 0
    max_waiting: int = 0
    max_kv_gap: int = 0                  # largest |server - controller| KV tokens over the samples
    versions: list[tuple[float, int]] = field(default_factory=list)  # (time, version) updates

    def sample(self, m: EngineMetrics, base: EngineMetrics, committed: int) -> None:
        """Fold in one /metrics reading `m` (counters since `base`) and the controller's KV."""
        self.committed = committed
        self.server_kv_used = round(m.kv_cache_usage * self.server_kv_tokens)
        self.running, self.waiting = m.num_requests_running, m.num_requests_waiting
        self.preemptions = m.num_preemptions_total - base.num_preemptions_total
        self.cache.hits = m.prefix_cache_hits_total - base.prefix_cache_hits_total
        self.cache.queried = m.prefix_cache_queries_total - base.prefix_cache_queries_total
        self.prefill_tokens = max(0, self.prompt_tokens_sent - self.cache.hits)
        self.samples += 1
        self.max_committed = max(self.max_committed, self.committed)
        self.max_server_kv_used = max(self.max_server_kv_used, self.server_kv_used)
        self.max_running = max(self.max_running, self.running)
        self.max_waiting = max(self.max_waiting, self.waiting)
        self.max_kv_gap = max(self.max_kv_gap, abs(self.server_kv_used - self.committed))
