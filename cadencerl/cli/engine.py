"""Real-engine commands: `pool up|down`, `run`, `calibrate`. Registered on the main app by `register`.

Bad input gets one line naming the field and exit code 2, as in the rest of the CLI; a local pool
started for one command is stopped when it ends, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import typer

DEFAULT_STATE_DIR = Path("out/pool")


def default_model_dir() -> Path:
    """Built once and reused: ~/.cache/cadencerl/tiny-model (or under $XDG_CACHE_HOME)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "cadencerl" / "tiny-model"


def pin_servers(servers) -> None:
    """Bind every process and thread of each local server to that server's core.

    LocalPool binds only the model worker (VLLM_CPU_OMP_THREADS_BIND); the API server and the
    engine core then float onto the other server's core, so two busy servers slow each other down
    (decode at batch 32: 72-81 ms a step with both loaded vs 46-55 ms alone, on this machine). With
    the whole server on its core: 48 ms together vs 42-44 ms alone, so servers are independent as
    the simulator assumes, and the pair decodes ~1.6x faster. Children inherit the binding.
    """
    from cadencerl.engine.local_pool import group_members

    for server in servers:
        for pid in group_members(server.pid):
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), {server.core})


def register(app: typer.Typer) -> None:
    # Imported here: cadencerl.cli imports this module at its end, after defining these.
    from rich.markup import escape

    from cadencerl.cli.main import (
        ConfigOpt,
        JsonOpt,
        ScenarioOpt,
        _progress,
        _scenario,
        _write_json,
    )
    from cadencerl.cli.main import _fail as _fail_markup
    from cadencerl.config import ConfigError
    from cadencerl.engine.local_pool import vllm_available, vllm_python
    from cadencerl.cli.tables import (
        console,
        per_accelerator_table,
        print_tables,
        run_table,
    )

    def _fail(message: str) -> None:
        _fail_markup(escape(message))   # engine errors end in "[URL]", which is not markup

    pool_app = typer.Typer(no_args_is_help=True, help="Local vLLM CPU servers serving the tiny model.")
    app.add_typer(pool_app, name="pool")

    def positive(name: str, value: int | None) -> None:
        if value is not None and value < 1:
            _fail(f"{name}: must be a positive integer, got {value}")

    def pool_config(workers: int, kv_tokens: int, max_num_seqs: int, max_model_len: int | None, dtype: str):
        from cadencerl.engine.local_pool import PoolConfig

        for name, value in (("workers", workers), ("kv_tokens", kv_tokens), ("max_num_seqs", max_num_seqs),
                            ("max_model_len", max_model_len)):
            positive(name, value)
        if dtype not in ("bfloat16", "float32"):
            _fail(f"dtype: expected bfloat16 or float32, got {dtype!r}")
        cfg = PoolConfig(num_workers=workers, kv_tokens=kv_tokens, max_num_seqs=max_num_seqs,
                         max_model_len=max_model_len or min(4096, kv_tokens), dtype=dtype,
                         model_dir=default_model_dir())
        try:
            cfg.validate()
        except ValueError as exc:
            _fail(f"pool: {exc}")
        if not vllm_available(cfg.python):
            _fail(f"pool: {vllm_python(cfg.python)} cannot import vllm; set CADENCERL_VLLM_PYTHON to a Python "
                  "with vllm-cpu (see docs/vllm-cpu-notes.md)")
        return cfg

    @contextlib.contextmanager
    def local_pool(cfg) -> Iterator[list[str]]:
        """A pool for the length of one command, in a fresh state dir; always stopped."""
        from cadencerl.engine.local_pool import LocalPool, PoolError

        state = Path(tempfile.mkdtemp(prefix="cadencerl-pool-"))
        pool = LocalPool(state, cfg)
        try:
            console(True).print(f"starting {cfg.num_workers} local vLLM servers (about a minute)...")
            try:
                pool.start()
            except PoolError as exc:
                _fail(f"local: {str(exc).splitlines()[0]}")
            pin_servers(pool.servers)
            yield pool.urls
        finally:
            pool.stop()
        shutil.rmtree(state, ignore_errors=True)   # kept (with the logs) only when something failed

    @pool_app.command("up")
    def pool_up(workers: int = typer.Option(2, "--workers", help="servers to start (one core each)"),
                kv_tokens: int = typer.Option(8192, "--kv-tokens", help="KV cache per server, in tokens"),
                max_num_seqs: int = typer.Option(32, "--max-num-seqs"),
                max_model_len: int | None = typer.Option(None, "--max-model-len"),
                dtype: str = typer.Option("bfloat16", "--dtype"),
                state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--state-dir")) -> None:
        """Build the tiny model and start local vLLM CPU servers; prints their URLs."""
        from cadencerl.engine.local_pool import LocalPool, PoolError

        cfg = pool_config(workers, kv_tokens, max_num_seqs, max_model_len, dtype)
        pool = LocalPool(state_dir, cfg)
        try:
            pool.start()
        except PoolError as exc:
            _fail(f"pool: {str(exc).splitlines()[0]}")
        pin_servers(pool.servers)
        urls = ",".join(pool.urls)
        (pool.state_dir / "urls.txt").write_text(urls + "\n")
        console(True).print(f"{workers} servers up; stop them with `cadencerl pool down --state-dir {state_dir}`")
        typer.echo(urls)

    @pool_app.command("down")
    def pool_down(state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--state-dir")) -> None:
        """Stop exactly the servers `pool up` started in this state dir."""
        from cadencerl.engine.local_pool import PoolError, down

        try:
            stopped = down(state_dir)
        except PoolError as exc:
            _fail(f"pool: {exc}")
        (state_dir / "urls.txt").unlink(missing_ok=True)
        console(True).print(f"stopped {len(stopped)} servers")

    def workers_or_local(workers: str | None, local: int | None) -> None:
        if (workers is None) == (local is None):
            _fail("workers: give exactly one of --workers URL,URL,... or --local N")
        positive("local", local)

    @app.command("run")
    def run(scenario: str | None = ScenarioOpt, config: Path | None = ConfigOpt,
            policy: str = typer.Option("cadence", "--policy", "-p"),
            workers: str | None = typer.Option(None, "--workers", help="server URLs, comma-separated"),
            labels: str | None = typer.Option(None, "--labels", help="catalog accelerator per URL (default cpu-tiny)"),
            local: int | None = typer.Option(None, "--local", help="start N local servers for this run"),
            kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV tokens the controller may use per server"),
            trajectories: int | None = typer.Option(None), seed: int | None = typer.Option(None),
            eta: int | None = typer.Option(None), delta: int | None = typer.Option(None),
            deadline: float = typer.Option(3600.0, "--deadline", help="give up after this many seconds"),
            json_out: str | None = JsonOpt) -> None:
        """Run a scenario's workload with one policy on real vLLM servers; same figures as `sim`."""
        from cadencerl.core.actions import ActionError
        from cadencerl.core.controller import StallError
        from cadencerl.engine.backend import EngineRunError
        from cadencerl.api import run_real
        from cadencerl.runs.real import parse_urls, resolve_labels
        from cadencerl.runs.registry import make_policy

        workers_or_local(workers, local)
        for name, value in (("trajectories", trajectories), ("kv_tokens", kv_tokens)):
            positive(name, value)
        for name, value in (("seed", seed), ("eta", eta), ("delta", delta)):
            if value is not None and value < 0:
                _fail(f"{name}: must be non-negative, got {value}")
        s = _scenario(scenario, config, {"seed": seed, "trajectories": trajectories, "eta": eta, "delta": delta})
        try:
            make_policy(policy, s)
            urls = parse_urls(workers) if workers else None
            label_list = labels.split(",") if labels else None
            if urls is not None:
                resolve_labels(s, len(urls), label_list)
            elif label_list is not None:
                resolve_labels(s, local, label_list)
        except ConfigError as exc:
            _fail(str(exc))
        with contextlib.ExitStack() as stack:
            if urls is None:
                seqs = max(g.max_num_seqs for g in s.pool)
                urls = stack.enter_context(local_pool(pool_config(local, kv_tokens or 8192, min(seqs, 256), None,
                                                                  "bfloat16")))
            with _progress(True) as progress:
                task = progress.add_task(f"{s.name} / {policy} (real)", total=s.workload.trajectories)
                try:
                    result = run_real(s, policy, urls, label_list, kv_tokens=kv_tokens, deadline_s=deadline,
                                      progress=lambda done, total: progress.update(task, completed=done))
                except ConfigError as exc:
                    _fail(str(exc))
                except (StallError, ActionError, EngineRunError) as exc:
                    _fail(f"policy {policy}: {exc}")
                except AssertionError as exc:
                    _fail(f"run: {exc}")
        print_tables([run_table([result], f"{s.name}: {policy} on {len(urls)} real servers"),
                      per_accelerator_table(result), engine_table(result)], json_out == "-")
        _write_json(json_out, result)

    @app.command("calibrate")
    def calibrate(workers: str | None = typer.Option(None, "--workers", help="server URLs, comma-separated"),
                  local: int | None = typer.Option(None, "--local", help="start N local servers to measure"),
                  batches: str = typer.Option("1,4,16,32", "--batches"),
                  prompts: str = typer.Option("32,384", "--prompts", help="prompt lengths (context per request)"),
                  tokens: int = typer.Option(64, "--tokens", help="new tokens per request"),
                  repeat: int = typer.Option(3, "--repeat", help="measurements per point (the median is kept)"),
                  alone: bool = typer.Option(False, "--alone", help="load one server at a time, not all together"),
                  accelerator: str = typer.Option("cpu-tiny", "--accelerator", help="catalog entry to start from"),
                  model: str = typer.Option("tiny", "--model"),
                  json_out: str | None = JsonOpt) -> None:
        """Measure decode step time vs batch and context on real servers; print fitted profile numbers."""
        from rich.table import Table

        from cadencerl.engine.calibrate import catalog_snippet, fit, measure
        from cadencerl.runs.real import parse_urls
        from cadencerl.engine.client import EngineError
        from cadencerl.hardware import catalog

        workers_or_local(workers, local)
        positive("tokens", tokens)
        positive("repeat", repeat)
        if tokens < 8:
            _fail(f"tokens: need at least 8 new tokens per request, got {tokens}")
        from cadencerl.cli.main import _int_list

        batch_list, prompt_list = _int_list("batches", batches, 1), _int_list("prompts", prompts, 1)
        try:
            base, mdl = catalog.accelerator(accelerator, "accelerator"), catalog.model(model)
            urls = parse_urls(workers) if workers else None
        except (ConfigError, ValueError) as exc:
            _fail(str(exc))
        with contextlib.ExitStack() as stack:
            if urls is None:
                urls = stack.enter_context(local_pool(pool_config(local, 8192, max(32, max(batch_list)), None,
                                                                  "bfloat16")))
            out = console(True)
            try:
                samples, kv = asyncio.run(measure(urls, model, batches=batch_list, prompts=prompt_list, new_tokens=tokens,
                                              together=not alone, repeat=repeat, on_point=lambda s: out.print(
                                                  f"  batch {s.batch:3d}  context {s.context:6d}  "
                                                  f"step {1000 * s.step_s:7.2f} ms")))
            except (EngineError, TimeoutError) as exc:
                _fail(f"workers: {exc or 'timed out'}")
        try:
            result = fit(samples, mdl, base)
        except ValueError as exc:
            _fail(str(exc))
        table = Table(title=f"decode step time on {len(urls)} server(s), {'one at a time' if alone else 'together'}")
        for col in ("batch", "context", "measured ms", "fitted ms", "error"):
            table.add_column(col, justify="right")
        for s, p in zip(samples, result.predicted_s):
            table.add_row(str(s.batch), f"{s.context:,}", f"{1000 * s.step_s:.2f}", f"{1000 * p:.2f}",
                          f"{100 * (p - s.step_s) / s.step_s:+.1f}%")
        print_tables([table], json_out == "-")
        when = datetime.date.today().isoformat()
        console(json_out == "-").print(catalog_snippet(result, kv, mdl, when), highlight=False)
        _write_json(json_out, {"date": when, "urls": urls, "together": not alone, "kv_tokens": kv,
                               "samples": [s.__dict__ for s in samples], "step_overhead_s": result.step_overhead_s,
                               "mem_bw_gbs": result.mem_bw_gbs, "bf16_tflops": result.bf16_tflops,
                               "rms_rel_error": result.rms_rel_error, "predicted_s": result.predicted_s})


def engine_table(result: dict):
    """Per server: the controller's KV accounting next to what /metrics said."""
    from rich.table import Table

    table = Table(title=f"{result['policy']}: per server (controller vs /metrics)")
    for col in ("worker", "url", "label", "KV cap", "tokens", "max KV ctl", "max KV srv", "max gap", "max run",
                "max wait", "preempt", "alive"):
        table.add_column(col, justify="left" if col in ("url", "label") else "right")
    for w in result["workers"]:
        table.add_row(str(w["worker"]), w["url"], w["label"], f"{w['kv_capacity']:,}", f"{w['tokens_generated']:,}",
                      f"{w['max_committed']:,}", f"{w['max_server_kv_used']:,}", f"{w['max_kv_gap']:,}",
                      str(w["max_running"]), str(w["max_waiting"]), str(w["preemptions"]),
                      "yes" if w["alive"] else "LOST")
    table.caption = (f"makespan {result['makespan_wall_s']:.1f} s, set-up {result['setup_wall_s']:.1f} s; "
                     f"resumes {result['resumes']} (accepted {result['resumes_accepted']}), aborts {result['aborts']}, "
                     f"lost workers {result['lost_workers'] or 'none'}")
    return table
