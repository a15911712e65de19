"""vLLM's OpenAI server, run in this process, that removes its socket folder when it exits.

`LocalPool` starts each server as `python -m cadencerl.devpool.vllm_server <vLLM's arguments>` with
the vLLM interpreter. vLLM leaves its ZMQ socket files behind when it is stopped by a signal
(`server_env.py`); `pool down` removes the folder, but a server that ends without it (its Ray actor
lost with its node: the server is told to die with its parent, `processes.term_with_parent`) would
leave it in the temp folder for good. vLLM turns SIGTERM into a graceful shutdown once it has
installed its handler, after seconds of imports: until then a SIGTERM here exits through Python
too, so both paths run this module's `finally`; only SIGKILL, after which `down` removes the
folder, skips it. The `finally` also stops what vLLM's shutdown left in the server's process group
(`processes.end_own_group`): with its parent gone, nothing else would.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from cadencerl.devpool.processes import end_own_group
from cadencerl.devpool.server_env import remove_rpc_dir

VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def main() -> None:
    signal.signal(signal.SIGTERM, _exit)        # vLLM installs its own once it is loaded
    try:
        runpy.run_module(VLLM_SERVER, run_name="__main__", alter_sys=True)
    finally:
        remove_rpc_dir(os.environ.get("VLLM_RPC_BASE_PATH", ""))
        end_own_group()


def _exit(signum: int, _frame) -> None:
    sys.exit(128 + signum)


if __name__ == "__main__":
    main()
