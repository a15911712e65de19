"""The vLLM servers behind the router: their health, and the KV pressure their /metrics report.

The page is read by the engine path's one parser (`engine/server_metrics.py`): KV usage, running,
waiting and preempted requests, the prefix-cache counters and the KV size from
`vllm:cache_config_info` are what MISA-T's gate and the router's own metrics read.
A scrape that fails counts against the server's health: `failures_to_down` in a row take it out,
one success brings it back (unless an admin drained or removed it).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from cadencerl.engine.server_metrics import EngineMetrics, parse_metrics


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


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> EngineMetrics:
    """One GET of the server's /metrics; raises httpx.HTTPError (or ValueError: not vLLM's page) when it fails."""
    resp = await client.get(f"{url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_metrics(resp.text)
