"""The environment a local vLLM server runs in, and what it leaves on disk.

- The servers import this repository's code (`vllm_server.py`, which runs vLLM's server and removes
  its socket folder after it), so it goes first on their PYTHONPATH, before whatever the caller had.
- vLLM binds the ZMQ sockets between its processes as files under `VLLM_RPC_BASE_PATH` (default
  /tmp) and leaves them there when it is stopped by a signal, about seven per server start. Each
  server gets a directory of its own for them (short: a socket's path holds at most 107 bytes),
  which `remove_rpc_dir` deletes once the server is gone: the server itself as it exits, and
  `down` after a server it had to kill.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RPC_PREFIX = "cadencerl-rpc-"


def pythonpath() -> str:
    """This repository, then the caller's PYTHONPATH."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)


def new_rpc_dir() -> str:
    """A fresh directory for one server's ZMQ socket files."""
    return tempfile.mkdtemp(prefix=RPC_PREFIX)


def remove_rpc_dir(path: str) -> None:
    """Delete a server's socket directory: only one this module made (in the temp folder, with its
    prefix), so a hand-edited state file cannot name another; a state file from before has none."""
    if path and Path(path).name.startswith(RPC_PREFIX) and Path(path).parent == Path(tempfile.gettempdir()):
        shutil.rmtree(path, ignore_errors=True)


def server_env(core: int, weight_routes: bool, rpc_dir: str) -> dict[str, str]:
    """The caller's environment, with what a pinned, offline CPU server needs."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # would override --kv-cache-memory-bytes
    env.pop("VLLM_SERVER_DEV_MODE", None)
    if weight_routes:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=str(core),
        VLLM_RPC_BASE_PATH=rpc_dir,
        PYTHONPATH=pythonpath(),        # the server runs `cadencerl.devpool.vllm_server`
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env
