"""The router's view of its servers' health: up or down from /health alone, /metrics best-effort
(either KV gauge name), and each change logged once with its reason."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from router_stub import Fleet, settle

from cadencerl.engine.server_metrics import parse_metrics

pytestmark = pytest.mark.timeout(60)

TOKENS = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 4}


def _polls(f: Fleet, n: int) -> None:
    """Wait for `n` more polls of every stub: polls run one after another, so all but the last
    have been acted on when this returns."""
    asked = [s.metrics_asked for s in f.states]
    assert settle(lambda: all(s.metrics_asked >= a + n for s, a in zip(f.states, asked)), 30.0)


def test_the_older_kv_gauge_name_is_read() -> None:
    page = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.25\n" \
           "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    m = parse_metrics(page)
    assert m.kv_cache_usage == 0.25 and m.num_requests_running == 3


@pytest.mark.parametrize("metrics", ["old", "none"])
def test_a_server_whose_health_is_ok_stays_up_whatever_its_metrics_say(metrics: str) -> None:
    with Fleet() as f, httpx.Client(base_url=f.url, timeout=10) as c:
        for s in f.states:
            s.metrics = metrics
        _polls(f, 2)
        assert c.get("/health").json()["workers_up"] == 2
        assert c.post("/v1/completions", json=TOKENS).status_code == 200
        assert all(u.metrics_ok == (metrics == "old") for u in f.service.upstreams)


def test_a_server_that_stays_down_is_logged_once_with_its_reason(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cadencerl.router")
    with Fleet(stubs=1, admin_token="secret") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        wrong = f.settings.workers[0] + "/no-such-prefix"
        r = c.post("/admin/workers", json={"url": wrong}, headers={"Authorization": "Bearer secret"})
        assert r.status_code == 201 and r.json()["healthy"] is False, "never up: not taken on trust"
        assert c.get("/readiness").json()["healthy_workers"] == 1
        def down_lines():
            return [rec for rec in caplog.records if wrong in rec.getMessage() and "down" in rec.getMessage()]
        assert settle(down_lines, 30.0)
        _polls(f, 4)                   # more failed polls of the server that is down: still one line
        down = down_lines()
        assert len(down) == 1 and down[0].levelno == logging.WARNING
        assert "404" in down[0].getMessage()
        assert c.post("/v1/completions", json=TOKENS).headers["x-cadencerl-worker"] == "0"


def test_liveness_and_readiness_as_vllm_router_answers_them() -> None:
    with Fleet(admin_token="secret") as f, httpx.Client(base_url=f.url, timeout=10) as c:
        auth = {"Authorization": "Bearer secret"}
        url0, url1 = f.settings.workers
        assert c.get("/liveness").json() == {"status": "alive"}
        r = c.get("/readiness")
        assert r.status_code == 200 and r.json() == {"status": "ready", "healthy_workers": 2, "total_workers": 2}
        assert c.post("/admin/workers/drain", json={"url": url0}, headers=auth).status_code == 200
        assert c.get("/readiness").json()["healthy_workers"] == 1
        f.stubs[1].stop()
        deadline = time.monotonic() + 5
        while c.get("/readiness").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/readiness")
        assert r.status_code == 503 and r.json()["status"] == "not_ready" and r.json()["healthy_workers"] == 0
        assert r.json()["reason"] == "no healthy workers available (1 down, 1 draining)"
        assert c.get("/liveness").status_code == 200, "the router itself is alive"
        for url in (url0, url1):
            assert c.post("/admin/workers/remove", json={"url": url}, headers=auth).status_code == 200
        r = c.get("/readiness")
        assert r.status_code == 503 and r.json()["total_workers"] == 0 and "removed" in r.json()["reason"]
        assert r.headers["x-request-id"]
