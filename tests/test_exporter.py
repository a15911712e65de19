"""The controller's Prometheus endpoint, scraped while the trainer API runs on fake vLLM servers."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cadencerl.api import RolloutPool
from cadencerl.config import ConfigError, builtin_scenario
from cadencerl.engine.exporter import MetricsExporter
from tests.fake_vllm import FakeVLLM

pytestmark = pytest.mark.timeout(60)
TRAJECTORIES = 32


@pytest.fixture
def urls() -> Iterator[list[str]]:
    with FakeVLLM() as a, FakeVLLM() as b:
        yield [a.url, b.url]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url, timeout=5, trust_env=False).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_no_controller_yet_exports_only_up() -> None:
    with MetricsExporter(lambda: None, 0) as exporter:
        assert exporter.port > 0
        assert scrape(exporter.url) == {("cadencerl_up", ()): 0.0}
    with pytest.raises(httpx.HTTPError):
        httpx.get(exporter.url, timeout=2, trust_env=False)     # closed: the port is free again


def test_scrapes_match_the_controller_mid_run_and_at_the_end(urls: list[str]) -> None:
    s = builtin_scenario("cpu-pair").with_overrides(
        workload={"trajectories": TRAJECTORIES, "response": {"median": 60, "sigma": 1.0, "cap": 400}},
        trainer={"batch_size": 8}, cadence={"delta": 32, "headroom_floor": 0.15})
    seen: list[tuple[dict, dict]] = []

    def on_progress(done: int, _total: int) -> None:
        """Runs on the controller's thread, which waits: the scrape sees a still controller."""
        if done in (4, 20):
            ctl = pool.controller
            truth = {"residents": [len(w.residents) for w in ctl.workers], "kv": [w.kv_used for w in ctl.workers],
                     "pending": {v: ctl.pending.count(v) for v in ctl.pending.versions()},
                     "admitted": ctl.credits.admitted, "done": ctl.done, "evictions": ctl.counters.evictions}
            seen.append((truth, scrape(pool.metrics_url)))

    with RolloutPool.from_scenario(s, urls, kv_tokens=1536, deadline_s=45, metrics_port=0,
                                   progress=on_progress) as pool:
        for _batch in pool.batches():
            pool.publish()
        result = pool.result()
        final = scrape(pool.metrics_url)
    assert len(seen) == 2
    for truth, m in seen:
        for w in (0, 1):
            labels = (("accelerator", "cpu-tiny"), ("worker", str(w)))
            assert m[("cadencerl_worker_residents", labels)] == truth["residents"][w]
            assert m[("cadencerl_worker_kv_used_tokens", labels)] == truth["kv"][w]
            assert m[("cadencerl_worker_kv_capacity_tokens", labels)] == 1536
        assert {int(dict(k[1])["version"]): v for k, v in m.items() if k[0] == "cadencerl_pending"} == truth["pending"]
        assert m[("cadencerl_admissions_total", ())] == truth["admitted"]
        assert m[("cadencerl_completions_total", ())] == truth["done"]
        assert m[("cadencerl_evictions_total", ())] == truth["evictions"]
    assert final[("cadencerl_up", ())] == 1
    assert final[("cadencerl_completions_total", ())] == TRAJECTORIES
    assert final[("cadencerl_tokens_generated_total", ())] == result["tokens_generated"]
    assert final[("cadencerl_throughput_tokens_per_second", ())] > 0
    assert final[("cadencerl_trainer_version", ())] == pool.controller.trainer.version >= TRAJECTORIES // 8 - 1
    with pytest.raises(httpx.HTTPError):
        scrape(pool.metrics_url)                                # closed with the pool


def test_live_status_shows_every_worker_and_the_totals(urls: list[str]) -> None:
    from rich.console import Console

    from cadencerl.cli.live import LiveStatus

    s = builtin_scenario("cpu-pair").with_overrides(workload={"trajectories": 8}, trainer={"batch_size": 4})
    status = LiveStatus("cpu-pair / cadence")
    with RolloutPool.from_scenario(s, urls, kv_tokens=2048, deadline_s=45, metrics_port=0) as pool:
        status.source, status.metrics_url = (lambda: pool.controller), (lambda: pool.metrics_url)
        assert "starting" in _text(Console, status)
        for _batch in pool.batches():
            pool.publish()
        frame = _text(Console, status)
    assert "8/8 done" in frame and pool.metrics_url in frame
    assert [line.split()[:2] for line in frame.splitlines() if line.split()[:1] in (["0"], ["1"])] == \
        [["0", "cpu-tiny"], ["1", "cpu-tiny"]]


def _text(console_type, status) -> str:
    console = console_type(record=True, width=200, file=io.StringIO())
    console.print(status.render())
    return console.export_text()


def test_a_metrics_port_in_use_is_bad_input_naming_it(urls: list[str]) -> None:
    """The trainer API raised a bare OSError (Address already in use) from batches(); the CLI caught
    every OSError of a run as this one, blaming metrics_port even when none was given."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        pool = RolloutPool(urls, batch_size=1, metrics_port=busy.getsockname()[1])
        pool.submit([1, 2, 3], max_tokens=4)
        with pytest.raises(ConfigError, match=r"^metrics_port: cannot serve on \d+: .*in use"):
            list(pool.batches())
        pool.close()


def test_an_os_error_of_a_run_without_metrics_is_not_blamed_on_metrics_port(monkeypatch) -> None:
    from typer.testing import CliRunner

    import cadencerl.api
    from cadencerl.cli.main import app

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cadencerl.api, "run_real", full_disk)
    result = CliRunner().invoke(app, ["run", "-s", "cpu-pair", "--workers", "http://127.0.0.1:9", "--no-push"])
    assert "metrics_port" not in result.output and "No space left" in result.output and result.exit_code == 1


def test_without_the_live_table_the_metrics_url_is_printed_and_served(capsys) -> None:
    """`run --json - --metrics-port 0` turns off the live table, the one place that showed which
    port was picked: Prometheus had nowhere to be pointed."""
    from cadencerl.cli.live import announce_metrics

    assert announce_metrics(None, table_shown=False) is None and announce_metrics(0, table_shown=True) == 0
    assert capsys.readouterr().err == ""
    port = announce_metrics(0, table_shown=False)
    printed = capsys.readouterr().err.strip()
    assert port and printed == f"metrics: http://127.0.0.1:{port}/metrics"
    with MetricsExporter(lambda: None, port) as exporter:
        assert exporter.url == printed.removeprefix("metrics: ")
        assert httpx.get(exporter.url, timeout=5, trust_env=False).status_code == 200
