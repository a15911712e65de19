"""The vLLM servers behind the router: their health, and the KV pressure their /metrics report.

vLLM's gauges `vllm:kv_cache_usage_perc` (a fraction), `vllm:num_requests_running` and
`vllm:num_requests_waiting`, its counter `vllm:num_preemptions`, and `vllm:cache_config_info`
(labels `num_gpu_blocks` and `block_size`: the KV capacity in tokens) are what MISA-T's gate reads.
A scrape that fails counts against the server's health: `failures_to_down` in a row take it out,
one success brings it back (unless an admin drained or removed it).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cadencerl.router.live import EngineFigures

_GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions": "preemptions",
}
PREFIX_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


@dataclass
class Upstream:
    """One server: its URL and what the router knows of its health."""

    id: int
    url: str
    healthy: bool = True
    failures: int = 0
    draining: bool = False
    removed: bool = False
    prefix_queries: float = 0.0     # the server's own prefix-cache counters, as last scraped
    prefix_hits: float = 0.0

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining and not self.removed


def parse_figures(text: str) -> tuple[EngineFigures, dict[str, float]]:
    """The gauges MISA-T reads, summed over label sets (one engine per server), and the prefix counters."""
    fig = EngineFigures()
    sums: dict[str, float] = {}
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")   # counters come as `name_total`, typed either way
            if name in _GAUGES:
                sums[name] = sums.get(name, 0.0) + sample.value
            elif name in PREFIX_COUNTERS and sample.name.endswith("_total"):
                counters[name] = counters.get(name, 0.0) + sample.value
            elif name == "vllm:cache_config_info":
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    fig.kv_capacity = int(blocks) * int(size)
    for name, attr in _GAUGES.items():
        if name in sums:
            value = sums[name]
            setattr(fig, attr, value if attr == "kv_usage" else int(value))
    return fig, counters


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> tuple[EngineFigures, dict[str, float]]:
    """One GET of the server's /metrics; raises httpx.HTTPError (or ValueError) when it fails."""
    resp = await client.get(f"{url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_figures(resp.text)
