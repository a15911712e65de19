"""A CPU quota for one local vLLM server: how a CPU server is made slower, like a slower accelerator.

A cgroup per server (v1 `cpu.cfs_quota_us`, or v2 `cpu.max`) caps every process moved into it at a
share of one core, exactly and with no extra process; `release()` moves them back and removes the
group. Why a cgroup and not `taskset` or a co-load: docs/internals.md, "devpool".
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")


class QuotaError(RuntimeError):
    """The machine offers no writable cgroup CPU controller (or refused the quota)."""


class CpuQuota:
    """`CpuQuota(0.4).apply(pids)` caps those processes at 40% of one core until `release()`."""

    def __init__(self, share: float, root: Path | None = None) -> None:
        if not 0 < share:
            raise ValueError(f"cpu share: must be positive, got {share}")
        self.share = share
        self.root = root or (_V1 if (_V1 / "cpu.cfs_quota_us").exists() else _V2)
        self.v2 = not (self.root / "cpu.cfs_quota_us").exists()
        self.group: Path | None = None

    def apply(self, pids: list[int]) -> Path:
        """Create the group with the quota and move `pids` (whole processes) into it."""
        group = self.root / f"cadencerl-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
            self.group = group
            if self.v2:
                period = 100_000
                (group / "cpu.max").write_text(f"{int(self.share * period)} {period}\n")
            else:
                period = int((self.root / "cpu.cfs_period_us").read_text())
                (group / "cpu.cfs_quota_us").write_text(f"{int(self.share * period)}\n")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    (group / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            self.release()
            raise QuotaError(f"cpu quota: cannot use the cgroup CPU controller at {self.root}: {exc}") from None
        return group

    def release(self) -> None:
        """Move any process left back to the parent group and remove the group; idempotent."""
        if self.group is None:
            return
        with contextlib.suppress(OSError):
            for pid in (self.group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
        with contextlib.suppress(OSError):
            os.rmdir(self.group)
        self.group = None

    def throttled(self) -> int:
        """How many periods the group was held back by its quota so far (`nr_throttled`)."""
        if self.group is None:
            return 0
        stat = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines() if line.strip())
        return int(stat.get("nr_throttled", 0))
