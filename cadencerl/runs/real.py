"""Run a policy on real vLLM servers: the controller of `sim`, with an EngineBackend for a backend.

`assemble` wires a controller to the servers the way `runs/simulate.py` wires it to simulated
engines (same pool builder, policies, fit check); `summarize_real` gives `simulate`'s figures plus
wall-clock and engine figures. The trainer-facing API (`cadencerl.api`) drives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from cadencerl.config import ConfigError, Scenario
from cadencerl.core.controller import Controller
from cadencerl.core.mix import MixRule
from cadencerl.core.policy import Policy
from cadencerl.core.spec import TrajectorySpec
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker
from cadencerl.engine.backend import EngineBackend, WeightUpdate, takes_keep_kv
from cadencerl.engine.client import Timeouts
from cadencerl.engine.clock import EngineRunError
from cadencerl.engine.errors import EngineError, ModelMismatchError
from cadencerl.engine.urls import check_server_url
from cadencerl.hardware import catalog
from cadencerl.hardware.perf import WorkerPerf
from cadencerl.runs.assemble import build_pool, check_fits_somewhere, check_model_len
from cadencerl.runs.bounds import add_bounds
from cadencerl.runs.summary import summarize

DEFAULT_LABEL = "cpu-tiny"
MAX_DEADLINE_S = 7 * 86_400.0       # a rollout's deadline: at most a week (beyond, a typo, not a plan)


@dataclass
class RealRun:
    """A controller wired to real servers, ready to run."""

    scenario: Scenario
    controller: Controller
    backend: EngineBackend
    specs: list[TrajectorySpec]
    workers: list[Worker]
    perfs: list[WorkerPerf]
    labels: list[str]
    key: object
    setup_s: float


def parse_urls(text: str | Sequence[str]) -> list[str]:
    urls = [u.strip() for u in (text.split(",") if isinstance(text, str) else text) if u.strip()]
    if not urls:
        raise ConfigError("workers: give at least one server URL")
    try:
        urls = [check_server_url(u, "workers:") for u in urls]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if len(set(urls)) != len(urls):
        raise ConfigError("workers: a URL is listed twice")
    return urls


def resolve_labels(scenario: Scenario, count: int, labels: Sequence[str] | None) -> list[str]:
    """One catalog accelerator per URL: given, else the scenario's pool when it has `count`
    workers, else `cpu-tiny`."""
    if labels is None:
        pool = [g.accelerator for g in scenario.pool for _ in range(g.workers)]
        labels = pool if len(pool) == count else [DEFAULT_LABEL] * count
    labels = [x.strip() for x in labels]
    if len(labels) != count:
        raise ConfigError(f"labels: {len(labels)} labels for {count} worker URLs")
    for x in labels:
        if x not in catalog.ACCELERATORS:
            raise ConfigError(f"labels: unknown accelerator {x!r} (known: {', '.join(catalog.ACCELERATORS)})")
    return labels


def _pool_of(scenario: Scenario, labels: list[str]) -> Scenario:
    """The scenario with one worker per URL; a scenario group of the same accelerator lends its
    tp, cluster and max_num_seqs."""
    groups = {g.accelerator: g for g in scenario.pool}
    pool = []
    for x in labels:
        g = groups.get(x)
        tp = g.tp if g else 1
        pool.append({"accelerator": x, "devices": tp, "tp": tp, "cluster": (g.cluster if g else None) or "local",
                     "max_num_seqs": g.max_num_seqs if g else 256})
    return scenario.with_overrides(pool=pool)


def assemble(scenario: Scenario, policy: Policy, urls: Sequence[str], specs: list[TrajectorySpec], key: object,
             *, labels: Sequence[str] | None = None, kv_tokens: int | Sequence[int] | None = None,
             prompts: dict[int, list[int]] | None = None, weight_update: WeightUpdate | None = None,
             on_publish_due: Callable[[], None] | None = None, timeouts: Timeouts = Timeouts(),
             connect_timeout_s: float = 30.0, deadline_s: float | None = None) -> RealRun:
    """Check the servers, size the workers from them and build the controller; ConfigError on bad input.

    With `on_publish_due`, a trainer outside the controller trains each batch the controller forms
    and says when through `backend.publish_now()` (the trainer API does this)."""
    started = time.perf_counter()
    if weight_update is not None and policy.updates_in_place and not takes_keep_kv(weight_update):
        raise ConfigError(f"weight_update: {policy.name} updates its workers in place, so the hook is called "
                          "as hook(worker, url, version, keep_kv=True); give it a keep_kv parameter")
    urls = parse_urls(urls)
    labels = resolve_labels(scenario, len(urls), labels)
    workers, perfs = build_pool(_pool_of(scenario, labels))
    caps = kv_list(kv_tokens, len(urls))
    backend = EngineBackend(urls, scenario.model, key, seed=scenario.seed, prompts=prompts, timeouts=timeouts,
                            weight_update=weight_update, on_publish_due=on_publish_due,
                            deadline_s=deadline_s)
    try:
        servers = backend.connect(connect_timeout_s)
        for w, server, cap in zip(workers, servers, caps):
            if cap is not None and cap > server.kv_tokens:
                raise ConfigError(f"kv_tokens: {cap} exceeds the KV of {server.url} ({server.kv_tokens} tokens)")
            w.kv_capacity = cap or server.kv_tokens
        check_fits_somewhere(specs, workers, key, scenario.cadence)
        check_model_len(specs, key, min(s.max_model_len for s in servers))
    except ModelMismatchError as exc:
        backend.close()
        raise ConfigError(f"model: {exc}") from None
    except (EngineError, EngineRunError) as exc:
        backend.close()
        raise ConfigError(f"workers: {exc}") from None
    except BaseException:
        backend.close()
        raise
    trainer = scenario.trainer
    ctl = Controller(policy, backend, workers, [Trajectory(s) for s in specs], batch_size=trainer.batch_size,
                     params=scenario.controller, train_time_s=trainer.train_time_s,
                     train_time_per_token_s=trainer.train_time_per_token_s, kv_transfer_time=None,
                     mix=MixRule.maybe(scenario.trainer_mix(), trainer.mix_wait_s),
                     kv_bytes_per_token=catalog.model(scenario.model).kv_bytes_per_token)
    return RealRun(scenario, ctl, backend, specs, workers, perfs, labels, key, time.perf_counter() - started)


def kv_list(kv_tokens: int | Sequence[int] | None, n: int) -> list[int | None]:
    """One KV cap per worker (None: the server's own), or a ConfigError; True is not a count."""
    if kv_tokens is None:
        return [None] * n
    caps = list(kv_tokens) if isinstance(kv_tokens, Sequence) and not isinstance(kv_tokens, str) else [kv_tokens] * n
    if len(caps) != n or any(not isinstance(c, int) or isinstance(c, bool) or c <= 0 for c in caps):
        raise ConfigError(f"kv_tokens: expected one positive integer, or one per worker ({n})")
    return caps


def lost_why(backend: EngineBackend) -> dict[str, str]:
    """Why each lost worker was lost, by worker id as a JSON key."""
    return {str(w): why for w, why in backend.streams.lost_reasons.items()}


def summarize_real(run: RealRun, wall_s: float) -> dict:
    """`simulate`'s figures for a real run, plus wall-clock and per-server figures."""
    ctl, backend, s = run.controller, run.backend, run.scenario
    result = summarize(s.name, ctl.policy.name, ctl, backend.records, wall_s, backend.events_processed,
                       s.workload.target_mix())
    add_bounds(result, run.specs, run.workers, run.perfs, run.key, s)
    result.update(
        backend="vllm",
        kv_transfer="none (every move re-prefills)",
        makespan_wall_s=result["sim_time_s"],
        setup_wall_s=run.setup_s,
        lost_workers=list(backend.lost),
        lost_why=lost_why(backend),
        resumes=backend.counts.resumes,
        resumes_accepted=backend.counts.resumes_accepted,
        aborts=backend.counts.aborts,
        stream_retries=backend.counts.retries,
        stream_retries_unsent=backend.counts.retries_unsent,
        stream_retries_timed_out=backend.counts.retries_timed_out,
        stream_retry_errors=backend.counts.sent_retry_errors,
        workers=[{**asdict(st), "label": label} for st, label in zip(backend.records, run.labels)],
    )
    return result
