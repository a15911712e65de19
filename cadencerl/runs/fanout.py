"""Independent simulations fanned out: inline, on a local process pool, or on a Ray cluster
(`--ray ADDRESS`), through one code path. Results come back in job order whatever order the jobs
finish in; each simulation is seeded, so a fanned-out run equals the same jobs run one by one here.
Ray workers get this checkout's `cadencerl` package with the job (runtime_env py_modules)."""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadencerl.config import ConfigError
from cadencerl.native import PURE_ENV

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Fanout:
    """Where independent jobs run: `ray_address` set, on that Ray cluster ("auto": the one this
    machine is attached to); else on `processes` local processes (1: inline, in this process)."""

    processes: int = 1
    ray_address: str | None = None

    @classmethod
    def local(cls, processes: int | None = None) -> "Fanout":
        return cls(processes=processes or os.cpu_count() or 1)

    def map(self, fn: Callable[..., Any], args: Sequence[tuple], progress: Progress | None = None) -> list:
        """`[fn(*a) for a in args]`, fanned out; `fn` must be a module-level function (it is pickled)."""
        if self.ray_address is not None:
            return _on_ray(self.ray_address, fn, args, progress)
        if self.processes <= 1 or len(args) <= 1:
            out = []
            for i, a in enumerate(args):
                out.append(fn(*a))
                if progress:
                    progress(i + 1, len(args))
            return out
        return _on_processes(min(self.processes, len(args)), fn, args, progress)


def _on_processes(processes: int, fn: Callable, args: Sequence[tuple], progress: Progress | None) -> list:
    results: dict[int, Any] = {}
    with ProcessPoolExecutor(processes) as pool:
        futures = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if progress:
                    progress(len(results), len(args))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return [results[i] for i in range(len(args))]


def _call(fn: Callable, *a: Any) -> Any:
    return fn(*a)


def connect_ray(address: str) -> Any:
    """Attach to the Ray cluster at `address` (once per process, again if asked for another); a
    missing Ray or an unreachable cluster is a one-line ConfigError naming `ray`."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("ray: Ray is not installed; `pip install 'cadencerl[ray]'` (or `pip install ray`)")
    import ray

    if ray.is_initialized() and address != "auto" and ray.get_runtime_context().gcs_address != address:
        ray.shutdown()      # attached to another cluster: this run asked for that one
    if not ray.is_initialized():
        _check_reachable(address)
        package = str(Path(__file__).resolve().parents[1])
        env = {PURE_ENV: os.environ[PURE_ENV]} if PURE_ENV in os.environ else {}   # plain Python there too
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"py_modules": [package], "excludes": ["__pycache__"], "env_vars": env})
        except (ConnectionError, RuntimeError, ValueError) as exc:
            line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"ray: cannot attach to the cluster at {address}: {line}") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` address must accept a connection: Ray itself retries an unreachable one for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"ray: cannot reach the cluster at {address}: {exc.strerror or exc}") from None


def _on_ray(address: str, fn: Callable, args: Sequence[tuple], progress: Progress | None) -> list:
    ray = connect_ray(address)
    remote = ray.remote(num_cpus=1, max_retries=0)(_call)
    refs = [remote.remote(fn, *a) for a in args]
    waiting, finished = list(refs), 0
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        finished += len(done)
        if progress:
            progress(finished, len(refs))
    return ray.get(refs)
