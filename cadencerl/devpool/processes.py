"""Process groups of local servers, read from /proc: who is alive, and is a pid still ours.

Apart from `local_pool` so that stopping servers (from this process or another one, via the state
file) rests on a few small functions that need no server to test.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
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


def end_own_group(grace_s: float = 2.0) -> list[int]:
    """In a process group's leader about to exit: stop what it would leave behind in its group.

    A vLLM server shut down gracefully has stopped its engine, but once one left its engine core and
    a worker running, orphaned and deaf to SIGTERM, after its Ray node was lost. SIGTERM, then
    SIGKILL what is still there; returns the pids that were left. A process that leads no group
    (run by hand, in a shell's group) touches nothing.
    """
    me = os.getpid()
    if os.getpgrp() != me:
        return []
    left = rest = _rest_of_group(me)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        if not rest:
            break
        for pid in rest:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while rest and time.monotonic() < deadline:
            time.sleep(0.05)
            rest = _rest_of_group(me)
    return left


def _rest_of_group(leader: int) -> list[int]:
    return [pid for pid in group_members(leader) if pid != leader]


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


def free_port(exclude: set[int], host: str) -> int:
    """A free port on `host` *below* the kernel's ephemeral range.

    vLLM's own internal sockets bind ephemeral ports while a server starts; an API port taken from
    that range could be grabbed by a sibling server before its owner binds it.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in exclude:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError("no free port found below the ephemeral range")


def term_with_parent() -> None:
    """In the child: ask Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
