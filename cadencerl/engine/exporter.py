"""The controller's live state on a Prometheus `/metrics` endpoint, for a user watching a long run.

A custom collector reads the controller at scrape time (nothing sampled between scrapes, never a
lock); the controller is given as a callable, as it may be built after the endpoint is up. Each
exporter has its own registry and HTTP server, bound to 127.0.0.1 unless told otherwise; port 0
picks a free one. Why: docs/internals.md, "engine".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Self

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cadencerl.core.controller import Controller

_WORKER_LABELS = ["worker", "accelerator"]


class ControllerCollector:
    """Prometheus metrics `cadencerl_*` computed from the controller that `source()` returns."""

    def __init__(self, source: Callable[[], Controller | None]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        ctl = self.source()
        up = GaugeMetricFamily("cadencerl_up", "1 once the controller runs")
        up.add_metric([], 0 if ctl is None else 1)
        yield up
        if ctl is None:
            return
        try:
            metrics = list(self._read(ctl))
        except RuntimeError:          # a dict changed size under a copy: read once more
            metrics = list(self._read(ctl))
        yield from metrics

    def _read(self, ctl: Controller) -> Iterator[Metric]:
        yield from self._workers(ctl)
        pending = GaugeMetricFamily("cadencerl_pending", "trajectories waiting for a worker, by policy version",
                                    labels=["version"])
        for version in ctl.pending.versions():
            pending.add_metric([str(version)], ctl.pending.count(version))
        yield pending
        yield _gauge("cadencerl_fresh", "submitted trajectories not yet admitted", len(ctl.fresh))
        yield _gauge("cadencerl_trainer_version", "the latest published policy version", ctl.trainer.version)
        c = ctl.counters
        for name, value, text in (("admissions", ctl.credits.admitted, "trajectories admitted"),
                                  ("completions", ctl.done, "trajectories completed"),
                                  ("evictions", c.evictions, "residents evicted to pending"),
                                  ("migrations", c.migrations, "trajectories resumed on another worker"),
                                  ("interrupts", c.interrupts, "workers interrupted for a new version"),
                                  ("in_place_updates", c.in_place_updates,
                                   "workers updated in place, their requests kept"),
                                  ("decisions", c.decisions, "policy decisions")):
            yield _counter(f"cadencerl_{name}", text, value)
        tokens = sum(t.generated for t in list(ctl.trajectories.values()))
        yield _counter("cadencerl_tokens_generated", "tokens generated, all trajectories", tokens)
        yield _gauge("cadencerl_elapsed_seconds", "controller time since the run started", ctl.now)
        yield _gauge("cadencerl_throughput_tokens_per_second", "tokens generated per second so far",
                     tokens / ctl.now if ctl.now > 0 else 0.0)

    def _workers(self, ctl: Controller) -> Iterator[Metric]:
        families = {
            "residents": GaugeMetricFamily("cadencerl_worker_residents", "trajectories on the worker",
                                           labels=_WORKER_LABELS),
            "kv_used": GaugeMetricFamily("cadencerl_worker_kv_used_tokens", "KV tokens committed to residents",
                                         labels=_WORKER_LABELS),
            "kv_capacity": GaugeMetricFamily("cadencerl_worker_kv_capacity_tokens", "KV tokens the controller "
                                             "may use", labels=_WORKER_LABELS),
            "version": GaugeMetricFamily("cadencerl_worker_version", "the policy version the worker runs",
                                         labels=_WORKER_LABELS),
            "alive": GaugeMetricFamily("cadencerl_worker_alive", "0 once the worker is lost", labels=_WORKER_LABELS),
        }
        for w in ctl.workers:
            labels = [str(w.id), w.accelerator]
            for key, value in (("residents", len(w.residents)), ("kv_used", w.kv_used),
                               ("kv_capacity", w.kv_capacity), ("version", w.version), ("alive", int(w.alive))):
                families[key].add_metric(labels, value)
        yield from families.values()


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


HOST = "127.0.0.1"      # the controller's state is served on this machine only


class MetricsExporter:
    """`with MetricsExporter(source, port) as ex:` serves `http://host:ex.port/metrics` until exit."""

    def __init__(self, source: Callable[[], Controller | None], port: int, host: str = HOST) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ControllerCollector(source))
        self.host, self.port = host, port
        self._server = self._thread = None

    def start(self) -> Self:
        if self._server is None:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
            self.port = self._server.server_port
        return self

    def close(self) -> None:
        """Stop serving and free the port; idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5.0)
            self._server = self._thread = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
