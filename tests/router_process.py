"""A `cadencerl router` in processes of its own, as a user starts it, for the tests that kill or
restart it; stopped with SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_router(urls: list[str], *extra: str, processes: int = 1) -> tuple[subprocess.Popen, str]:
    """The router as a user starts it; returned once every one of its processes accepts."""
    proc = subprocess.Popen([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(urls),
                             "--port", "0", "--poll-interval-secs", "0.2", "--processes", str(processes), *extra],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    found = re.search(r"listening on (http://\S+?),", line)
    assert found, line
    deadline = time.monotonic() + 60
    while True:
        try:
            r = httpx.get(f"{found.group(1)}/health", timeout=2)
            if r.status_code == 200 and r.json().get("processes_up", 1) == processes:
                return proc, found.group(1)
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "the router did not start"
        time.sleep(0.1)


def stop(proc: subprocess.Popen, wait_s: float = 20) -> None:
    """SIGTERM, and SIGKILL if it has not ended within `wait_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
