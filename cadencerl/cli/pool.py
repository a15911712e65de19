"""`cadencerl pool up|down`: local vLLM CPU servers (or Ray actors) that outlive the command, for
`run --workers`, the router and the trainer API; `pool down` stops exactly what `pool up` started."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from cadencerl.cli.common import ConfigOpt, ScenarioOpt, fail, load_scenario
from cadencerl.cli.engine import default_model_dir, pool_config, pool_message, scenario_pool_config
from cadencerl.cli.pinning import pin_servers
from cadencerl.cli.ray_pool import ray_down, ray_up
from cadencerl.cli.tables import console

DEFAULT_STATE_DIR = Path("out/pool")
POOL_HELP = "Local vLLM CPU servers serving the tiny model."
StateDirOpt = typer.Option(DEFAULT_STATE_DIR, "--state-dir", help="where `pool up` keeps its servers' PIDs, "
                           "logs and urls.txt, and `pool down` finds them")


def pool_up(workers: int | None = typer.Option(None, "--workers", help="servers to start (one core each) "
                                               "[default: 2]"),
            kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV cache per server, in tokens "
                                                 "[default: 8192]"),
            max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="sequences a server runs at "
                                                    "once [default: 32]"),
            max_model_len: int | None = typer.Option(None, "--max-model-len", help="longest request a server "
                                                     "takes (default: 4096, or its KV tokens less one block; "
                                                     "--ray: 2048 unless given; local with -s/-c: set by the "
                                                     "scenario, the flag refused)"),
            dtype: str | None = typer.Option(None, "--dtype", help="bfloat16 or float32 [default: bfloat16]"),
            state_dir: Path = StateDirOpt,
            ray: str | None = typer.Option(None, "--ray", help="Ray cluster address ('auto': the running one): "
                                           "start one server per worker of the scenario as Ray actors"),
            scenario: str | None = ScenarioOpt, config: Path | None = ConfigOpt) -> None:
    """Build the tiny model and start vLLM CPU servers (local, or Ray actors); prints their URLs.

    With a scenario, one server per worker of its pool, sized (KV, CPU quota) per accelerator type."""
    from cadencerl.devpool.local_pool import LocalPool, PoolError

    sizing = {"--workers": workers, "--kv-tokens": kv_tokens, "--max-num-seqs": max_num_seqs, "--dtype": dtype,
              **({} if ray is not None else {"--max-model-len": max_model_len})}
    if scenario is not None or config is not None:     # the scenario's pool, sized per worker type
        if given := [flag for flag, value in sizing.items() if value is not None]:
            fail(f"{given[0][2:].replace('-', '_')}: the scenario sizes every server (-s/-c); drop "
                 f"{', '.join(given)}")
    make_state_dir(state_dir)
    if ray is not None:
        urls = ray_up(load_scenario(scenario, config, {}), ray, default_model_dir(), max_model_len)
        (state_dir / "urls.txt").write_text(",".join(urls) + "\n")
        console(True).print(f"{server_count(len(urls))} up as Ray actors; stop them with "
                            f"`cadencerl pool down --ray {ray} --state-dir {state_dir}`")
        typer.echo(",".join(urls))
        return
    try:
        running = running_servers(state_dir)
    except PoolError as exc:
        fail(pool_message("pool", exc))
    if running:                                         # LocalPool.start would stop them without a word
        fail(f"state_dir: {state_dir} already has {len(running)} servers running ({','.join(running)}); stop them "
             f"with `cadencerl pool down --state-dir {state_dir}`, or give another --state-dir")
    if scenario is not None or config is not None:
        s = load_scenario(scenario, config, {})
        cfg = scenario_pool_config(s, sum(g.workers for g in s.pool), None)
        workers = cfg.num_workers
    else:
        workers = 2 if workers is None else workers
        cfg = pool_config(workers, 8192 if kv_tokens is None else kv_tokens, 32 if max_num_seqs is None else
                          max_num_seqs, max_model_len, dtype or "bfloat16")
    pool = LocalPool(state_dir, cfg)
    try:
        pool.start()
    except PoolError as exc:
        fail(pool_message("pool", exc))
    pin_servers(pool.servers)
    urls = ",".join(pool.urls)
    (pool.state_dir / "urls.txt").write_text(urls + "\n")
    console(True).print(f"{server_count(workers)} up; stop them with `cadencerl pool down --state-dir {state_dir}`")
    typer.echo(urls)


def make_state_dir(state_dir: Path) -> None:
    """`--state-dir` as a folder `pool up` can write its state and logs in, before anything starts."""
    if state_dir.exists() and not state_dir.is_dir():
        fail(f"state_dir: {str(state_dir)!r} is not a folder")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=state_dir):
            pass
    except OSError as exc:
        fail(f"state_dir: cannot write in {str(state_dir)!r}: {exc.strerror or exc}")


def running_servers(state_dir: Path) -> list[str]:
    """URLs of the servers an earlier `pool up` left running in `state_dir` (none after `pool down`)."""
    from cadencerl.devpool.local_pool import PoolState
    from cadencerl.devpool.processes import pid_alive, same_process

    state = PoolState.read(state_dir)
    return [s.url for s in state.servers if pid_alive(s.pid) and same_process(s.pid, s.start_ticks)] if state else []


def server_count(n: int) -> str:
    """"1 server", "2 servers"."""
    return f"{n} server{'' if n == 1 else 's'}"


def pool_down(state_dir: Path = StateDirOpt,
              ray: str | None = typer.Option(None, "--ray", help="Ray cluster address: remove its server actors")) -> None:
    """Stop exactly the servers `pool up` started in this state dir (or in that Ray cluster)."""
    from cadencerl.devpool.local_pool import PoolError, down

    if ray is not None:
        console(True).print(f"removed {len(ray_down(ray))} Ray server actors")
        (state_dir / "urls.txt").unlink(missing_ok=True)
        return
    try:
        stopped = down(state_dir)
    except PoolError as exc:
        fail(pool_message("pool", exc))
    (state_dir / "urls.txt").unlink(missing_ok=True)
    console(True).print(f"stopped {server_count(len(stopped))}")
