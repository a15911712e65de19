"""The vLLM servers behind the router: their health, and the KV pressure their /metrics report.

Up or down comes from `GET /health` alone: `failures_to_down` failures in a row take a server out
(one, while it has never answered: a new server is not taken on trust), one 200 brings it back (unless an admin drained or removed it). Each change is logged once at
warning level with its reason, so a misconfigured URL is visible rather than a silent 503.
/metrics is best-effort (its gauge names differ between vLLM versions): read by the engine path's
one parser (`engine/server_metrics.py`), its KV usage, running, waiting and preempted requests,
prefix-cache counters and KV size feed MISA-T's gate and the router's metrics; a page that cannot
be read keeps the last figures and leaves the server up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import httpx

from cadencerl.engine.server_metrics import EngineMetrics, parse_metrics

log = logging.getLogger(__name__)


@dataclass
class Upstream:
    """One server: its URL and what the router knows of its health."""

    id: int
    url: str
    healthy: bool = True
    failures: int = 0
    seen_up: bool = False           # its /health has answered 200 at least once
    draining: bool = False
    removed: bool = False
    prefix_queries: float = 0.0     # the server's own prefix-cache counters, as last scraped
    prefix_hits: float = 0.0
    metrics_ok: bool = True         # the last /metrics page could be read
    _endpoints: dict = field(default_factory=dict, repr=False, compare=False)

    def endpoint(self, path: str) -> httpx.URL:
        """This server's URL for one of the router's fixed routes, parsed once (httpx parses a URL
        given as a string on every request)."""
        url = self._endpoints.get(path)
        if url is None:
            url = self._endpoints[path] = httpx.URL(self.url + path)
        return url

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining and not self.removed

    def set_healthy(self, healthy: bool, reason: str = "") -> None:
        """Record the server's health; a change is logged once, with why."""
        _log_change(self.healthy, healthy, "worker %s is up again", "worker %s is down: %s", self.url, reason)
        self.healthy = healthy

    def set_metrics_ok(self, ok: bool, reason: str = "") -> None:
        """Record whether /metrics could be read; a change is logged once, with why."""
        _log_change(self.metrics_ok, ok, "worker %s: /metrics is readable again",
                    "worker %s: /metrics unreadable (%s); routing without its KV figures", self.url, reason)
        self.metrics_ok = ok


def _log_change(was: bool, now: bool, back: str, lost: str, url: str, reason: str) -> None:
    """A warning when a server's state flips: `back` (with its URL) or `lost` (URL and reason)."""
    if now != was:
        if now:
            log.warning(back, url)
        else:
            log.warning(lost, url, reason)


async def probe(client: httpx.AsyncClient, url: str, timeout_s: float) -> str | None:
    """GET the server's /health: None when it answers 200, else why not."""
    try:
        resp = await client.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        reason = f"GET /health failed: {str(exc) or type(exc).__name__}"
    else:
        if resp.status_code == 200:
            return None
        reason = f"GET /health answered {resp.status_code}"
    return reason


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> EngineMetrics:
    """One GET of the server's /metrics; raises httpx.HTTPError (or ValueError: not vLLM's page) when it fails."""
    resp = await client.get(f"{url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_metrics(resp.text)


async def poll(client: httpx.AsyncClient, up: Upstream, timeout_s: float,
               failures_to_down: int) -> EngineMetrics | None:
    """One look at `up`: its health recorded, and its figures when it is up and its page reads
    (best-effort: a page that cannot be read keeps the last ones)."""
    reason = await probe(client, up.url, timeout_s)
    if reason is not None:
        up.failures += 1
        if up.failures >= failures_to_down or not up.seen_up:
            up.set_healthy(False, reason)
        return None
    up.failures, up.seen_up = 0, True
    up.set_healthy(True)
    try:
        figures = await scrape(client, up.url, timeout_s)
    except (httpx.HTTPError, ValueError) as exc:
        up.set_metrics_ok(False, str(exc) or type(exc).__name__)
        return None
    up.set_metrics_ok(True)
    up.prefix_queries, up.prefix_hits = figures.prefix_cache_queries_total, figures.prefix_cache_hits_total
    return figures
