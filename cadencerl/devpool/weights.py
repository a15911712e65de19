"""Real policy versions on real servers: write version v of the tiny model's weights, push it in.

A version is a checkpoint folder (the base model, every float tensor deterministically perturbed),
written with numpy alone. The push uses vLLM's dev-mode routes, since the RL weight-update API needs
NCCL or CUDA IPC, which the CPU build lacks: pause (abort, or keep for an in-place update), reload
the weights, set the version, resume. Why each step, and the `clear_cache=false` pitfall:
docs/internals.md, "devpool".
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from cadencerl.engine.client import KEEPALIVE_EXPIRY_S

WEIGHTS_FILE_SUFFIX = ".safetensors"
_FLOAT_BITS = {"BF16": (np.uint16, 0), "F16": (np.uint16, 3), "F32": (np.uint32, 16)}
"""dtype -> (same-width unsigned view, lowest mantissa bit flipped): four low mantissa bits change,
a relative perturbation of at most ~12% (bf16) per weight: enough to change greedy decoding."""
_FLIPPED_BITS = 4


class WeightPushError(RuntimeError):
    """A server refused a step of the weight update; the message names the server and the step."""


def perturb_safetensors(src: Path, dst: Path, version: int, seed: int = 0) -> None:
    """Copy one safetensors file, flipping low mantissa bits of each float tensor (seeded by version)."""
    raw = Path(src).read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    data = bytearray(raw[8 + header_len:])
    rng = np.random.default_rng([seed, version])
    for name in sorted(k for k in header if k != "__metadata__"):
        info = header[name]
        if info["dtype"] not in _FLOAT_BITS:
            continue
        view_type, low = _FLOAT_BITS[info["dtype"]]
        begin, end = info["data_offsets"]
        bits = np.frombuffer(data, dtype=view_type, count=(end - begin) // np.dtype(view_type).itemsize,
                             offset=begin)
        mask = rng.integers(0, 1 << _FLIPPED_BITS, size=bits.size, dtype=np.uint32).astype(view_type) << low
        np.bitwise_xor(bits, mask, out=bits)
    Path(dst).write_bytes(raw[:8 + header_len] + bytes(data))


class WeightVersions:
    """Checkpoint folders `root/v{N}`, one per policy version, written on first use (atomically)."""

    def __init__(self, base_dir: Path, root: Path, *, seed: int = 0) -> None:
        self.base_dir, self.root, self.seed = Path(base_dir).resolve(), Path(root).resolve(), seed
        self._lock = threading.Lock()
        if not any(self.base_dir.glob(f"*{WEIGHTS_FILE_SUFFIX}")):
            raise FileNotFoundError(f"weights: no {WEIGHTS_FILE_SUFFIX} file in {self.base_dir}")

    def path(self, version: int) -> Path:
        """Version 0 is the base model itself; later versions are written once and reused."""
        if version == 0:
            return self.base_dir
        out = self.root / f"v{version}"
        with self._lock:
            if not out.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=self.root))
                try:
                    for item in self.base_dir.iterdir():
                        if item.suffix == WEIGHTS_FILE_SUFFIX:
                            perturb_safetensors(item, tmp / item.name, version, self.seed)
                        elif item.is_file():
                            shutil.copy2(item, tmp / item.name)
                    tmp.chmod(0o755)
                    os.replace(tmp, out)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        return out


@dataclass(frozen=True)
class WeightPush:
    """One version pushed into one server; `pause_s` is from /pause sent to /resume answered."""

    worker: int
    url: str
    version: int
    pause_s: float
    reload_s: float


def update_steps(path: str, version: int, keep_kv: bool = False) -> list[tuple[str, dict]]:
    """The dev-mode routes that put version `version` (its checkpoint at `path`) into a server, with
    their request arguments, in order; the last, /resume, is sent even when a step before it fails."""
    pause = {"mode": "keep", "clear_cache": "false"} if keep_kv else {"mode": "abort", "clear_cache": "true"}
    return [("/pause", {"params": pause}),
            ("/collective_rpc", {"json": {"method": "reload_weights", "kwargs": {"weights_path": path}}}),
            ("/update_weight_version", {"json": {"new_version": str(version)}}),
            ("/resume", {})]


def push_failed(url: str, route: str, status: int, text: str) -> WeightPushError:
    hint = " (start the server with VLLM_SERVER_DEV_MODE=1)" if status == 404 else ""
    return WeightPushError(f"weights: {route} on {url} answered {status}{hint}: {text[:200]}")


class WeightPusher:
    """A `WeightUpdate` hook: pushes each version into the server of the worker that advances."""

    def __init__(self, versions: WeightVersions, *, timeout_s: float = 120.0) -> None:
        self.versions = versions
        self.pushes: list[WeightPush] = []
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), trust_env=False,
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S))

    def __call__(self, worker: int, url: str, version: int, keep_kv: bool = False) -> None:
        path = str(self.versions.path(version))      # written before the pause, not during it
        start = time.perf_counter()
        (pause, pause_args), (reload, reload_args), (tag, tag_args), (resume, _) = update_steps(path, version, keep_kv)
        self._post(url, pause, **pause_args)
        try:
            before = time.perf_counter()
            self._post(url, reload, **reload_args)
            reload_s = time.perf_counter() - before
            self._post(url, tag, **tag_args)
        finally:
            self._post(url, resume)
        self.pushes.append(WeightPush(worker, url, version, time.perf_counter() - start, reload_s))

    def start_at_base(self, urls: list[str]) -> None:
        """Before a run: a server that an earlier run left on another version gets the base weights
        back (version 0), else the run's first samples, tagged version 0, would come from them. A
        fresh server says "default"; one that does not answer is the run's to find."""
        for worker, url in enumerate(urls):
            try:
                version = self.server_version(url)
            except (httpx.HTTPError, ValueError):
                continue
            if version not in (None, "default", "0"):
                self(worker, url, 0)

    def server_version(self, url: str) -> str | None:
        """What the server says it runs (`/weight_info`)."""
        response = self._http.get(f"{url.rstrip('/')}/weight_info")
        response.raise_for_status()
        return response.json().get("weight_version")

    def close(self) -> None:
        self._http.close()

    def _post(self, url: str, route: str, **kwargs) -> None:
        try:
            response = self._http.post(f"{url.rstrip('/')}{route}", **kwargs)
        except httpx.HTTPError as exc:
            raise WeightPushError(f"weights: {route} failed on {url}: {exc}") from exc
        if response.status_code != 200:
            raise push_failed(url, route, response.status_code, response.text)


def pause_summary(pushes: list[WeightPush]) -> dict:
    """The pause per update of a run, and the `reload_weights` call inside it, for its figures."""
    pauses = sorted(1000 * p.pause_s for p in pushes)
    reloads = [1000 * p.reload_s for p in pushes]
    return {"pushes": len(pauses), "pause_median_ms": float(np.median(pauses)) if pauses else 0.0,
            "pause_max_ms": pauses[-1] if pauses else 0.0,
            "reload_median_ms": float(np.median(reloads)) if reloads else 0.0}
