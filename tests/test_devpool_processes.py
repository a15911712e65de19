"""A server that exits stops what it leaves in its process group (`processes.end_own_group`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

from cadencerl.devpool.processes import group_members

# The child ignores SIGTERM (as an orphaned vLLM engine core did) and has a sleeper of its own;
# the process reports its pid, its group's members, what end_own_group found left, and whether
# its child still runs.
ENDS_ITS_GROUP = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from cadencerl.devpool.processes import end_own_group, group_members
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    deadline = time.monotonic() + 20
    while len(group_members(os.getpgrp())) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = group_members(os.getpgrp())
    left = end_own_group(grace_s=0.5)
    running = child.poll() is None
    child.kill()
    print(json.dumps({"me": os.getpid(), "members": members, "left": left, "child_running": running}))
""")


def _run(leader: bool) -> dict:
    """Run it as its group's leader, or under a shell that leads the group; nothing outlives the run."""
    cmd = [sys.executable, "-c", ENDS_ITS_GROUP]
    if not leader:
        cmd = ["sh", "-c", '"$0" "$@"; :', *cmd]     # the `:` keeps sh from exec'ing python
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_a_leader_leaves_nothing_of_its_group_behind_even_what_ignores_sigterm() -> None:
    seen = _run(leader=True)
    assert len(seen["members"]) == 3
    assert sorted(seen["left"]) == sorted(set(seen["members"]) - {seen["me"]})
    assert not seen["child_running"]
    assert group_members(seen["me"]) == []      # the grandchild too, reparented once its parent died


def test_a_process_that_leads_no_group_touches_nothing() -> None:
    seen = _run(leader=False)
    assert seen["left"] == [] and seen["child_running"]
