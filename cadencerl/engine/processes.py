"""Process groups of local servers, read from /proc: who is alive, and is a pid still ours.

Apart from `local_pool` so that stopping servers (from this process or another one, via the state
file) rests on a few small functions that need no server to test.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is `pgid`, read from /proc."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name))
        if stat is not None and stat[2] != "Z" and int(stat[4]) == pgid:
            members.append(int(entry.name))
    return members


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    stat = _read_stat(pid)
    return stat is not None and stat[2] != "Z"


def same_process(pid: int, ticks: int) -> bool:
    """False only when `pid` is alive but started at other ticks than recorded (pid recycled)."""
    now = start_ticks(pid)
    return now is None or ticks in (0, now)


def wait_groups_gone(
    pgids: list[int], wait_s: float, procs: Sequence[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for proc in procs:
            proc.poll()
        if not any(group_members(pgid) for pgid in pgids):
            return
        time.sleep(0.1)


def _read_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat with the command name collapsed, so index 2 is the state."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    return [head.split(" (", 1)[0], "comm", *rest.split()]


def start_ticks(pid: int) -> int | None:
    stat = _read_stat(pid)
    return int(stat[21]) if stat is not None else None


