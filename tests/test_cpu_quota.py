"""The cgroup CPU quota that makes one local server slower (skipped where cgroups are not writable)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cadencerl.devpool.cpu_quota import CpuQuota, QuotaError

pytestmark = pytest.mark.timeout(60)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_busy_process_under_a_fifth_of_a_core_gets_about_that() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    quota = CpuQuota(0.2)
    try:
        try:
            group = quota.apply([busy.pid])
        except QuotaError as exc:
            pytest.skip(str(exc))
        assert str(busy.pid) in (group / "cgroup.procs").read_text().split()
        start_cpu, start = cpu_seconds(busy.pid), time.monotonic()
        time.sleep(2.0)
        share = (cpu_seconds(busy.pid) - start_cpu) / (time.monotonic() - start)
        assert share <= 0.3, share             # capped (unthrottled it would take a whole core)
        assert quota.throttled() > 0
    finally:
        quota.release()
        busy.kill()
        busy.wait(5)
    assert quota.group is None and not group.exists()
