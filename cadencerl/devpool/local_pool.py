"""Start and stop a pool of local vLLM CPU servers serving the tiny model, for dev and tests.

Each server runs in its own process group, and a JSON state file written as each one spawns lets
`down(state_dir)` stop exactly those groups from another process, even after a crash mid-start. KV
capacity is given in tokens; the vLLM interpreter may differ from the caller's; servers bind
127.0.0.1 only. Why each of these: docs/internals.md, "devpool".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import httpx

from cadencerl.devpool.cpu_quota import CpuQuota, QuotaError
from cadencerl.devpool.processes import (free_port, group_members, same_process, start_ticks, term_with_parent,
                                         wait_groups_gone)
from cadencerl.devpool.server_env import new_rpc_dir, pythonpath, remove_rpc_dir, server_env
from cadencerl.devpool.server_logs import last_error, log_tail
from cadencerl.devpool.tiny_model import TINY_ARCH, ModelArch, is_built

SERVED_MODEL_NAME = "tiny"
STATE_FILE = "pool.json"
HOST = "127.0.0.1"


class PoolError(RuntimeError):
    """A server of the pool failed to start or to stop; the message points at its log."""


def vllm_python(explicit: str | None = None) -> str:
    """The interpreter that has vLLM installed."""
    return explicit or os.environ.get("CADENCERL_VLLM_PYTHON") or sys.executable


def vllm_available(python: str | None = None) -> bool:
    """Whether `python` can import vLLM (checked without importing it here)."""
    code = "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([vllm_python(python), "-c", code], check=False, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def whole_blocks(tokens: int, block_size: int) -> int:
    """`tokens` rounded up to whole KV blocks (vLLM allocates KV by the block)."""
    return -(-tokens // block_size) * block_size


def longest_model_len(kv_tokens: int, block_size: int = 32) -> int:
    """The longest max_model_len a server with `kv_tokens` of KV (rounded up to whole blocks) starts
    with: vLLM keeps one block back (8,192 KV tokens in 32-token blocks serve at most 8,160)."""
    return whole_blocks(kv_tokens, block_size) - block_size


@dataclass(frozen=True)
class PoolConfig:
    """How many servers and how each is sized. `kv_tokens` may differ per worker."""

    num_workers: int = 2
    kv_tokens: int | Sequence[int] = 8192
    max_num_seqs: int = 64
    max_model_len: int = 4096
    block_size: int = 32
    seed: int = 0
    start_timeout_s: float = 240.0
    stop_timeout_s: float = 15.0
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """float32 decodes ~2x faster on CPUs without AVX-512 BF16 (see docs/vllm-cpu-notes.md)."""
    enforce_eager: bool = True  # starts faster; torch.compile gave no measurable gain here
    python: str | None = None
    model_dir: Path | None = None
    extra_args: tuple[str, ...] = ()
    arch: ModelArch = TINY_ARCH
    weight_routes: bool = True
    """Serve vLLM's dev-mode routes (`VLLM_SERVER_DEV_MODE=1`: /pause, /collective_rpc, /weight_info,
    ...) that `devpool.weights` pushes new policy versions through, on `host` like every route."""
    host: str = HOST
    """The address servers bind (a Ray actor binds its node's address so other nodes reach it)."""
    die_with_parent: bool = False
    """Servers get SIGTERM when the process that spawned them dies (a Ray actor whose node is lost)."""
    cpu_shares: tuple[float, ...] | None = None
    """Per worker, the share of one core it may use (1.0: no cap): a cgroup CPU quota, applied once
    the server is healthy and removed by `down` (devpool/cpu_quota.py). Makes a server slower."""

    def kv_tokens_of(self, index: int) -> int:
        """KV tokens of worker `index`, rounded up to whole blocks."""
        kv = self.kv_tokens if isinstance(self.kv_tokens, int) else self.kv_tokens[index]
        return whole_blocks(kv, self.block_size)

    def longest_model_len(self, index: int) -> int:
        """The longest max_model_len worker `index` starts with (see `longest_model_len`)."""
        return longest_model_len(self.kv_tokens_of(index), self.block_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return replace(
            self.arch, dtype_bytes=4 if self.dtype == "float32" else 2
        ).kv_bytes_per_token

    def validate(self) -> None:
        if self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if not isinstance(self.kv_tokens, int) and len(self.kv_tokens) != self.num_workers:
            raise ValueError("kv_tokens needs one entry per worker")
        if self.block_size % 32:
            raise ValueError("vLLM CPU needs a block size that is a multiple of 32")
        for i in range(self.num_workers):
            if self.longest_model_len(i) < self.block_size:
                raise ValueError(f"kv_tokens: worker {i} has {self.kv_tokens_of(i)}; a server needs at least "
                                 f"{2 * self.block_size} (vLLM keeps one {self.block_size}-token block back)")
            if self.longest_model_len(i) < self.max_model_len:
                raise ValueError(
                    f"max_model_len: {self.max_model_len} needs at least {self.max_model_len + self.block_size} "
                    f"kv_tokens on worker {i} (it has {self.kv_tokens_of(i)}; vLLM keeps one block back "
                    "and refuses to start)"
                )


@dataclass(frozen=True)
class SpawnedServer:
    """One server process this pool spawned, as recorded in the state file (to stop it later)."""

    index: int
    url: str
    port: int
    pid: int
    start_ticks: int
    core: int
    kv_tokens: int
    log_path: str
    rpc_dir: str = ""        # its ZMQ socket files (`server_env`); removed at `down`


@dataclass
class PoolState:
    model_dir: str
    servers: list[SpawnedServer] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)   # CPU-quota groups to remove at `down`

    def write(self, state_dir: Path) -> None:
        tmp = state_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, state_dir / STATE_FILE)

    @classmethod
    def read(cls, state_dir: Path) -> PoolState | None:
        """The state a `pool up` left in `state_dir`, None if it left none; PoolError naming the
        state dir when it cannot be read or is not a pool's."""
        path = Path(state_dir) / STATE_FILE
        try:
            data = json.loads(path.read_text())
            return cls(model_dir=data["model_dir"], servers=[SpawnedServer(**s) for s in data["servers"]],
                       cgroups=data.get("cgroups", []))
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise PoolError(f"state_dir: {str(state_dir)!r} is not a folder") from None
        except OSError as exc:
            raise PoolError(f"state_dir: cannot read {str(path)!r}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PoolError(f"state_dir: {str(path)!r} is not a pool's state ({type(exc).__name__}: {exc}); "
                            "stop its servers by hand, then remove it") from None


class LocalPool:
    """N local vLLM CPU servers; `with LocalPool(dir, cfg) as pool:` stops them on exit, always."""

    def __init__(self, state_dir: Path, config: PoolConfig = PoolConfig()) -> None:
        config.validate()
        self.state_dir = Path(state_dir).resolve()
        self.config = config
        # Absolute: servers run with the state dir as cwd, and vLLM takes an unknown relative
        # path for a hub repo id.
        self.model_dir = Path(config.model_dir or self.state_dir / "model").resolve()
        self.servers: list[SpawnedServer] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> list[SpawnedServer]:
        """Build the model, spawn every server, wait until all are healthy; stop all on failure."""
        if PoolState.read(self.state_dir) is not None:
            down(self.state_dir, timeout_s=self.config.stop_timeout_s)  # leftovers of a crashed run
        try:
            (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PoolError(f"state_dir: cannot make {str(self.state_dir)!r}: {exc.strerror or exc}") from None
        try:
            self._build_model()
            state = PoolState(model_dir=str(self.model_dir))
            for index in range(self.config.num_workers):
                self.servers.append(self._spawn(index))
                state.servers = list(self.servers)
                state.write(self.state_dir)
            self._wait_healthy()
            state.cgroups = self._apply_quotas()
            state.write(self.state_dir)
        except BaseException:
            self.stop()
            raise
        return list(self.servers)

    def stop(self) -> None:
        """Stop every server this pool started (idempotent)."""
        for proc in self._procs:
            proc.poll()  # reap exited leaders so they do not linger as zombies
        down(self.state_dir, timeout_s=self.config.stop_timeout_s, procs=self._procs)
        self.servers = []
        self._procs = []

    def _apply_quotas(self) -> list[str]:
        shares = self.config.cpu_shares or ()
        groups = []
        for server, share in zip(self.servers, shares):
            if share < 1.0:
                quota = CpuQuota(share)
                try:
                    groups.append(str(quota.apply(group_members(server.pid))))
                except QuotaError as exc:
                    raise PoolError(f"worker {server.index}: {exc}") from None
        return groups

    def _build_model(self) -> None:
        if is_built(self.model_dir, seed=self.config.seed):
            return
        cmd = [
            vllm_python(self.config.python),
            "-m",
            "cadencerl.devpool.tiny_model",
            str(self.model_dir),
            "--seed",
            str(self.config.seed),
        ]
        env = {**os.environ, "PYTHONPATH": pythonpath()}
        result = subprocess.run(
            cmd, check=False, env=env, capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise PoolError(f"building the tiny model failed:\n{tail}")

    def _spawn(self, index: int) -> SpawnedServer:
        cfg = self.config
        try:
            port = free_port(exclude={s.port for s in self.servers}, host=cfg.host)
        except OSError as exc:
            raise PoolError(f"worker {index}: {exc}") from None
        kv_tokens = cfg.kv_tokens_of(index)
        cores = sorted(os.sched_getaffinity(0))
        core = cores[index % len(cores)]
        log_path = self.state_dir / "logs" / f"worker-{index}.log"
        options = {
            "--model": str(self.model_dir),
            "--served-model-name": SERVED_MODEL_NAME,
            "--host": cfg.host,
            "--port": str(port),
            "--dtype": cfg.dtype,
            "--max-model-len": str(cfg.max_model_len),
            "--max-num-seqs": str(cfg.max_num_seqs),
            "--block-size": str(cfg.block_size),
            "--kv-cache-memory-bytes": str(kv_tokens * cfg.kv_bytes_per_token),
            "--seed": str(cfg.seed),
        }
        switches = ["--enable-prefix-caching", "--enable-scale-out"]
        switches += ["--enforce-eager"] if cfg.enforce_eager else []
        cmd = [vllm_python(cfg.python), "-m", "cadencerl.devpool.vllm_server"]    # removes its socket folder
        cmd += [item for pair in options.items() for item in pair] + switches
        cmd += list(cfg.extra_args)
        rpc_dir = new_rpc_dir()
        env = server_env(core, cfg.weight_routes, rpc_dir)
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    process_group=0,    # its own group, the caller's session: docs/internals.md
                    cwd=self.state_dir,
                    preexec_fn=term_with_parent if cfg.die_with_parent else None,
                )
        except BaseException:
            remove_rpc_dir(rpc_dir)     # no server, no state-file record: `down` would never see it
            raise
        self._procs.append(proc)
        return SpawnedServer(
            index=index,
            url=f"http://{cfg.host}:{port}",
            port=port,
            pid=proc.pid,
            start_ticks=start_ticks(proc.pid) or 0,
            core=core,
            kv_tokens=kv_tokens,
            log_path=str(log_path),
            rpc_dir=rpc_dir,
        )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        pending = {s.index: s for s in self.servers}
        with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as http:
            while pending:
                for index, server in list(pending.items()):
                    code = self._procs[index].poll()
                    if code is not None:
                        raise PoolError(
                            f"worker {index} exited with {code} while starting: {last_error(server.log_path)} "
                            f"(log {server.log_path}):\n{log_tail(server.log_path)}"
                        )
                    try:
                        if http.get(f"{server.url}/health").status_code == 200:
                            del pending[index]
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() > deadline:
                    first = next(iter(pending.values()))
                    raise PoolError(
                        f"workers {sorted(pending)} not healthy after "
                        f"{self.config.start_timeout_s:.0f} s; see {first.log_path}"
                    )
                if pending:
                    time.sleep(0.5)


def down(
    state_dir: Path,
    *,
    timeout_s: float = 15.0,
    procs: Sequence[subprocess.Popen[bytes]] = (),
) -> list[int]:
    """Stop the servers recorded in `state_dir`'s state file; return the leader pids that were running.

    SIGTERM each server's process group, wait up to `timeout_s`, then SIGKILL what is left and
    wait again. A group whose leader pid now belongs to another process is left alone. The state
    file is removed once every group is gone.
    """
    state_dir = Path(state_dir)
    state = PoolState.read(state_dir)
    if state is None:
        return []
    ours = [s.pid for s in state.servers if same_process(s.pid, s.start_ticks)]
    running = [pgid for pgid in ours if group_members(pgid)]
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        alive = [pgid for pgid in running if group_members(pgid)]
        if not alive:
            break
        for pgid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        wait_groups_gone(alive, wait_s, procs)
    left = {pgid: members for pgid in ours if (members := group_members(pgid))}
    if left:
        raise PoolError(f"processes still alive after SIGKILL: {left}")
    for group in state.cgroups:
        with contextlib.suppress(OSError):
            os.rmdir(group)           # empty now: its processes are gone
    for server in state.servers:
        remove_rpc_dir(server.rpc_dir)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return running
