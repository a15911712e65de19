"""CPU affinity for local vLLM servers started by the CLI.

`devpool/local_pool.py` starts the servers on the cores it is given; which cores those are is the
command's choice (the CLI's `pool up`, `run --local` and `calibrate --local` are the only callers), so
it lives here.
"""

from __future__ import annotations

import contextlib
import os


def pin_servers(servers) -> None:
    """Bind every process and thread of each local server to that server's core.

    LocalPool binds only the model worker (VLLM_CPU_OMP_THREADS_BIND); the API server and the
    engine core then float onto the other server's core, so two busy servers slow each other down
    (decode at batch 32: 72-81 ms a step with both loaded vs 46-55 ms alone, on this machine). With
    the whole server on its core: 48 ms together vs 42-44 ms alone, so servers are independent as
    the simulator assumes, and the pair decodes ~1.6x faster. Children inherit the binding.
    """
    from cadencerl.devpool.local_pool import group_members

    for server in servers:
        for pid in group_members(server.pid):
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), {server.core})
