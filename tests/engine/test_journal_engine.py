"""The journal on real vLLM CPU servers: the trainer process SIGKILLed once a batch is out,
restarted on its journal; across both processes every trajectory is consumed once with its target
length within eta, and neither server is left running a request of the dead process. Single-turn
and multi-turn (tool calls between turns) runs."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from cadencerl.core.journal import read_records
from cadencerl.devpool.local_pool import LocalPool
from cadencerl.engine.client import VLLMClient
from tests.test_journal_restart import check_across_processes, driver

TRAJ, BATCH = 16, 4


def running(url: str) -> float:
    async def one() -> float:
        async with VLLMClient(url, model="tiny") as c:
            return (await c.metrics()).num_requests_running
    return asyncio.run(one())


@pytest.mark.engine
@pytest.mark.timeout(420)
@pytest.mark.parametrize("turns", [False, True], ids=["single-turn", "multi-turn"])
def test_sigkill_after_a_batch_then_restart_on_real_servers(engine_pool: LocalPool, tmp_path: Path,
                                                            turns: bool) -> None:
    journal, out = tmp_path / "run.journal", tmp_path / "batches.jsonl"
    urls = ",".join(engine_pool.urls)
    first = driver(urls, journal, out, TRAJ, BATCH, turns=turns)
    deadline = time.monotonic() + 240
    while not (journal.exists() and any(r.kind == "batch" for r in read_records(journal).records)):
        assert time.monotonic() < deadline and first.poll() is None, "no batch formed before the kill"
        time.sleep(0.2)
    time.sleep(0.5)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = driver(urls, journal, out, TRAJ, BATCH, turns=turns)
    log, _ = second.communicate(timeout=300)
    assert second.returncode == 0, log[-3000:]
    report = check_across_processes(out, TRAJ, BATCH, exact=False, turns=turns)
    assert report["resumed"] and report["consumed"] + report["completed_unconsumed"] >= BATCH
    deadline = time.monotonic() + 30
    while any(running(u) for u in engine_pool.urls) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(running(u) for u in engine_pool.urls), "a request of the killed process still runs"
