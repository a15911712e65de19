"""vLLM's /metrics, read once: the one Prometheus text parser of the real-engine path.

Why this shape: the client (per-call readings), the backend (the run's cross-check) and calibration
(a server's KV size) all read the same page; one pass with prometheus_client's parser gives every
figure they use, so no second, hand-written reading of the format can drift from this one.
Label sets (one per engine of a data-parallel server) are summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"    # the same gauge under its older name (vLLM versions differ)
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
SUMMED = (KV_USAGE, KV_USAGE_OLD, RUNNING, WAITING, PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS)
REQUIRED = (KV_USAGE, RUNNING)


class MetricsFormatError(ValueError):
    """The page is not Prometheus text, or lacks a gauge the scheduler needs."""


@dataclass(frozen=True)
class EngineMetrics:
    """The scheduler-relevant gauges and counters of /metrics, summed over engines."""

    kv_cache_usage: float
    num_requests_running: int
    num_requests_waiting: int
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    kv_capacity_tokens: int | None = None   # from vllm:cache_config_info's labels, when present
    raw: dict[str, float] = field(default_factory=dict, repr=False)


def _read(text: str) -> tuple[dict[str, float], int | None]:
    """One pass: the summed samples wanted, and the KV size from the cache-config labels."""
    totals: dict[str, float] = {}
    kv: int | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in SUMMED:
                    totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
                elif family.name == CACHE_CONFIG and kv is None:
                    kv = _kv_from_labels(sample.labels)
    except ValueError as exc:
        raise MetricsFormatError(f"unparsable /metrics: {exc}") from exc
    return totals, kv


def series_total(text: str, name: str, **labels: str) -> float:
    """One series of a Prometheus page (`name` as its samples are named), summed over the samples
    whose labels include `labels`; 0 when it is absent."""
    return sum(float(sample.value) for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _kv_from_labels(labels: dict[str, str]) -> int | None:
    tokens = str(labels.get("kv_cache_size_tokens", ""))
    if tokens.isdigit():
        return int(tokens)
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and size.isdigit():
        return int(blocks) * int(size)
    return None


def parse_metrics(text: str) -> EngineMetrics:
    """Parse vLLM's /metrics page; MetricsFormatError when it is not one."""
    totals, kv = _read(text)
    if KV_USAGE not in totals and KV_USAGE_OLD in totals:
        totals[KV_USAGE] = totals[KV_USAGE_OLD]
    missing = [name for name in REQUIRED if name not in totals]
    if missing:
        raise MetricsFormatError(f"/metrics lacks {', '.join(missing)}")

    def count(name: str) -> int:
        return int(totals.get(name, 0.0))

    return EngineMetrics(
        kv_cache_usage=totals[KV_USAGE],
        num_requests_running=count(RUNNING),
        num_requests_waiting=count(WAITING),
        num_preemptions_total=count(PREEMPTIONS),
        prefix_cache_queries_total=count(PREFIX_QUERIES),
        prefix_cache_hits_total=count(PREFIX_HITS),
        kv_capacity_tokens=kv,
        raw=totals,
    )


def kv_tokens_from_metrics(text: str) -> int | None:
    """The server's KV capacity in tokens, from `vllm:cache_config_info` labels (None if absent)."""
    return _read(text)[1]
