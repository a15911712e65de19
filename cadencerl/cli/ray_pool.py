"""`pool up --ray`, `pool down --ray` and `run --ray`: vLLM servers as Ray actors (devpool/ray_pool.py).

Ray is an optional extra: without it these options fail with one line saying how to install it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cadencerl.cli.common import fail
from cadencerl.config import Scenario


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        fail("ray: Ray is not installed; `pip install 'cadencerl[ray]'` (or `pip install ray`)")


def _fail(exc: BaseException) -> None:
    """One line under `ray:`, which the pool's own errors already start with (not 'ray: ray: ...'),
    unless it names its own field (`ray_actors: ...`)."""
    line = (str(exc).splitlines() or [""])[0].removeprefix("ray: ")
    fail(line if line.startswith("ray_actors: ") else "ray: " + line)


def ray_up(scenario: Scenario, address: str, model_dir: Path, max_model_len: int | None) -> list[str]:
    """One server per worker of the scenario's pool, placed by accelerator type; their URLs."""
    _require_ray()
    from cadencerl.devpool.local_pool import PoolError
    from cadencerl.devpool.ray_pool import RayPool
    from cadencerl.devpool.server_specs import server_specs

    try:
        pool = RayPool(server_specs(scenario), model_dir=model_dir, address=address or None,
                       max_model_len=max_model_len or 2048, cpu_quotas=True)
        return [s.url for s in pool.up()]
    except (PoolError, ConnectionError) as exc:
        _fail(exc)


def ray_down(address: str) -> list[str]:
    """Remove every server actor (and placement group) `ray_up` made in that cluster."""
    _require_ray()
    from cadencerl.devpool.ray_pool import down

    try:
        return down(address or None)
    except ConnectionError as exc:
        _fail(exc)


def ray_urls(address: str, actors: str | None) -> list[str]:
    """The URLs of the named actors' servers (comma-separated names), else of every pool actor."""
    _require_ray()
    from cadencerl.devpool.local_pool import PoolError
    from cadencerl.devpool.ray_pool import attach, discover

    try:
        names = [n.strip() for n in actors.split(",") if n.strip()] if actors else discover(address or None)
        if not names:
            fail(f"ray: no server actors in the cluster at {address or 'auto'}; start them with `pool up --ray`")
        return attach(names, address or None)
    except (PoolError, ConnectionError) as exc:
        _fail(exc)
