"""The router's Prometheus metrics, in a registry of its own (one per router, no global state)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector


class Tally:
    """A counter child's increments, kept as an int and added to it at the next scrape: an
    increment of prometheus_client's takes a lock (0.55 us; the Rust data path made four a request),
    and the router counts and scrapes on its loop's thread only."""

    __slots__ = ("child", "n")

    def __init__(self, child) -> None:
        self.child, self.n = child, 0

    def inc(self) -> None:
        self.n += 1


class _Flush(Collector):
    """Registered first, so each scrape adds the tallies to their counters before it reads them."""

    def __init__(self) -> None:
        self.tallies: list[Tally] = []

    def tally(self, labels):
        """`labels` (a counter's), as a function giving each label set's `Tally`."""
        def of(*values: str) -> Tally:
            self.tallies.append(tally := Tally(labels(*values)))
            return tally
        return lru_cache(maxsize=None)(of)

    def collect(self):
        for tally in self.tallies:
            if tally.n:
                tally.child.inc(tally.n)
                tally.n = 0
        return []


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        flush = _Flush()
        r.register(flush)
        self.requests = Counter("cadencerl_router_requests", "Requests received, by class and kind "
                                "(new session, continuation)", ["workload_class", "kind"], registry=r)
        self.admissions = Counter("cadencerl_router_admissions", "New sessions admitted, by class",
                                  ["workload_class"], registry=r)
        self.rejections = Counter("cadencerl_router_rejections", "Requests refused before reaching a "
                                  "server, by reason: 429 hold_full / hold_timeout, 503 no_worker",
                                  ["reason"], registry=r)
        self.errors = Counter("cadencerl_router_errors", "Errors, by kind", ["kind"], registry=r)
        self.pass_through = Counter("cadencerl_router_pass_through", "Requests relayed outside sessions and "
                                    "admission (embeddings, rerank), by route", ["route"], registry=r)
        self.retries = Counter("cadencerl_router_retries", "Requests retried on another server before "
                               "their first token", registry=r)
        self.handed_back = Counter("cadencerl_router_handed_back", "Resumable requests answered \"abort\" with "
                                   "their tokens so far, by why: the policy evicted it, or a weight update "
                                   "paused generation", ["why"], registry=r)
        self.resumed = Counter("cadencerl_router_resumed", "Re-sends matched to the trajectory they resume",
                               registry=r)
        self.weight_version = Gauge("cadencerl_router_weight_version", "The clients' latest weight version",
                                    registry=r)
        self.prefix_hits = Counter("cadencerl_router_prefix_hits", "Placements on a server the router "
                                   "believes holds the prefix: the session's last server (sticky) or one "
                                   "that served its prompt group (group)", ["kind"], registry=r)
        self.hold_depth = Gauge("cadencerl_router_hold_depth", "New sessions waiting for admission", registry=r)
        self.hold_wait = Histogram("cadencerl_router_hold_wait_seconds", "Time new sessions waited for "
                                   "admission", registry=r,
                                   buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))
        self.load = Gauge("cadencerl_router_worker_load", "Requests in flight per server", ["worker"], registry=r)
        self.sessions = Gauge("cadencerl_router_worker_sessions", "Unfinished sessions homed on each server "
                              "(running or parked in a tool wait)", ["worker"], registry=r)
        self.parked = Gauge("cadencerl_router_parked_sessions", "Sessions parked in tool waits", registry=r)
        self.kv = Gauge("cadencerl_router_worker_kv_usage", "KV usage each server reports (fraction)",
                        ["worker"], registry=r)
        self.held_kv = Gauge("cadencerl_router_worker_held_kv_usage", "KV of sessions between turns on each "
                             "server (their prefix kept for the next turn), which MISA-T counts as used beside "
                             "the server's own (fraction of its KV)", ["worker"], registry=r)
        self.cap = Gauge("cadencerl_router_worker_session_cap", "MISA-T's session cap per server",
                         ["worker"], registry=r)
        self.up = Gauge("cadencerl_router_worker_up", "1 when the server takes new requests", ["worker"], registry=r)
        self.server_hit_rate = Gauge("cadencerl_router_worker_prefix_hit_rate", "Prefix-cache hit rate each "
                                     "server reports (vllm:prefix_cache_hits / queries)", ["worker"], registry=r)
        self.completed = Gauge("cadencerl_router_completed_sessions", "Sessions finished so far, by class",
                               ["workload_class"], registry=r)
        self.dtv = Gauge("cadencerl_router_mix_dtv", "Total-variation distance between the classes of "
                         "finished sessions and the target mix (all, or the latest 256)", ["window"], registry=r)
        self.by_process = Counter("cadencerl_router_requests_by_process", "Requests placed for each data-path "
                                  "process (--processes N; 0 is the decision owner's own)", ["process"], registry=r)
        # What every request counts in, each label set's tally made once (the label values are
        # bounded: classes, kinds, processes); labels() takes a lock and checks its values each call.
        self.requests_of = flush.tally(self.requests.labels)
        self.admissions_of = flush.tally(self.admissions.labels)
        self.prefix_hits_of = flush.tally(self.prefix_hits.labels)
        self.served_by = flush.tally(self.by_process.labels)
