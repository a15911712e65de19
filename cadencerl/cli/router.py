"""`cadencerl router`: serve a registered policy as an OpenAI-compatible router in front of vLLM servers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cadencerl.cli.common import fail
from cadencerl.cli.tables import console
from cadencerl.config import ConfigError


JournalOpt = typer.Option(None, "--journal", help="keep the parked sessions and class counts in this file; a "
                          "router started on it takes them up again")
MaxConcurrentOpt = typer.Option(None, "--max-concurrent-requests", help="vllm-router's name: completions in flight "
                                "at once under a policy with no admission (misa+ admits itself); more wait as "
                                "--hold-max and --hold-timeout say (default 0: twice the servers' max_num_seqs)")
DataPathOpt = typer.Option(None, "--data-path", help="who serves the port: rust (HTTP in Rust, the same "
                           "decisions; built by `make router-native`), python, or auto (default: rust where it is "
                           "built and --processes is 1, else python; docs/router.md)")
ProcessesOpt = typer.Option(None, "--processes", help="processes serving the port (SO_REUSEPORT), one of them "
                            "owning every decision; more use more cores (default 1)")


def router(
    workers: str = typer.Option(..., "--workers", help="vLLM server URLs, comma-separated"),
    policy: str = typer.Option("misa+cache-aware", "--policy",
                               help="a registered policy, as sim names it: cadence, areal, least-loaded, "
                                    "[misa+]cache-aware, round-robin, ... (or a variant file)"),
    classes: Optional[Path] = typer.Option(None, "--classes", help="class shares: a YAML/JSON/TOML map "
                                           "class -> share (optional `default: CLASS`)"),
    config: Optional[Path] = typer.Option(None, "--config", help="a scenario file: the target mix from its "
                                          "workload classes; its pool says what each server is (the i-th URL is "
                                          "its i-th worker: accelerator, affinity rank, max_num_seqs); the "
                                          "policy's knobs from its controller: and cadence: sections"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, "--port", help="port to listen on (0: any free one, said at start-up)"),
    cache_threshold: Optional[float] = typer.Option(None, "--cache-threshold", help="vllm-router's name (0.3)"),
    balance_abs_threshold: Optional[int] = typer.Option(None, "--balance-abs-threshold", help="(64)"),
    balance_rel_threshold: Optional[float] = typer.Option(None, "--balance-rel-threshold", help="(1.5)"),
    hold_max: Optional[int] = typer.Option(None, "--hold-max", help="new sessions that may wait (1024)"),
    hold_timeout: Optional[float] = typer.Option(None, "--hold-timeout", help="seconds before a 429 (30)"),
    max_concurrent: Optional[int] = MaxConcurrentOpt,
    session_ttl: Optional[float] = typer.Option(None, "--session-ttl", help="seconds a parked session lives (60)"),
    contended_ttl: Optional[float] = typer.Option(None, "--contended-session-ttl", help="seconds a parked session "
                                                  "lives while new sessions wait for admission (15)"),
    kv_capacity: Optional[int] = typer.Option(None, "--kv-capacity", help="KV tokens a server has, till it says"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="sequences each server runs at once (its "
                                               "vLLM --max-num-seqs), as routing assumes (default: each --config pool "
                                               "worker's, else 256)"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="the trainer's batch: MISA-T keeps "
                                             "each batch-sized cohort of sessions on the target mix (1024)"),
    eta: Optional[int] = typer.Option(None, "--eta", help="staleness budget: sessions start at most eta versions "
                                      "ahead of training, a version being a weight update (default: none, the "
                                      "clients keep their own)"),
    max_response_ids: Optional[int] = typer.Option(None, "--max-response-ids", help="stored responses whose "
                                                   "server the router remembers, the oldest forgotten first (65536)"),
    max_sessions: Optional[int] = typer.Option(None, "--max-sessions", help="parked sessions kept, the oldest "
                                               "ended first (100000)"), journal: Optional[Path] = JournalOpt,
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout-secs", help="vllm-router's name: "
                                                    "longest wait for a server's next byte (600)"),
    max_payload_size: Optional[int] = typer.Option(None, "--max-payload-size", help="vllm-router's name: "
                                                   "largest request body in bytes (16 MiB)"),
    eviction_interval: Optional[float] = typer.Option(None, "--eviction-interval-secs", help="vllm-router's "
                                                      "name: seconds between prefix-tree evictions (120)"),
    max_tree_size: Optional[int] = typer.Option(None, "--max-tree-size", help="vllm-router's name: tokens each "
                                                "server's prefix tree keeps at an eviction (16777216)"),
    health_failure_threshold: Optional[int] = typer.Option(None, "--health-failure-threshold", help="vllm-router's "
                                                           "name: failed health polls in a row that take a server out (2)"),
    poll_interval: Optional[float] = typer.Option(None, "--poll-interval-secs", help="seconds between polls of "
                                                  "each server's /health and /metrics (0.5)"), processes: Optional[int] = ProcessesOpt,
    data_path: Optional[str] = DataPathOpt,
) -> None:
    """Serve vLLM's OpenAI routes (and SGLang's /generate), routing with the simulator's controller
    and policy; embeddings, rerank and tokenizer routes are placed outside admission. Headers:
    X-Session-Id (a multi-turn session), X-Workload-Class, X-Session-End; X-User-Id, X-Tenant-Id,
    X-Correlation-Id and `user` are affinity keys only. Admin needs $CADENCERL_ROUTER_ADMIN_TOKEN."""
    from cadencerl.router.serve import listen, serve
    from cadencerl.router.settings import make_settings

    try:
        shares, default = target_classes(classes, config)
        settings = make_settings(
            workers=[w.strip() for w in workers.split(",") if w.strip()], policy=policy, classes=shares,
            scenario_file=str(config) if config is not None else None,
            default_class=default, host=host, port=port, cache_threshold=cache_threshold,
            balance_abs_threshold=balance_abs_threshold, balance_rel_threshold=balance_rel_threshold,
            hold_max=hold_max, hold_timeout_s=hold_timeout, session_ttl_s=session_ttl, kv_capacity=kv_capacity,
            contended_ttl_s=contended_ttl, max_concurrent_requests=max_concurrent,
            max_num_seqs=max_num_seqs, batch_size=batch_size, eta=eta, journal=journal and str(journal),
            max_response_ids=max_response_ids, max_sessions=max_sessions, request_timeout_s=request_timeout,
            max_body_bytes=max_payload_size, eviction_interval_s=eviction_interval, max_tree_size=max_tree_size,
            failures_to_down=health_failure_threshold, metrics_interval_s=poll_interval, processes=processes,
            data_path=data_path)
        socks = listen(settings)
    except ConfigError as exc:
        fail(with_flag(str(exc)))
    console(True).print(started_line(settings, socks[0].getsockname()[1]), markup=False, highlight=False,
                        soft_wrap=True)
    serve(settings, socks)


def target_classes(classes: Optional[Path], config: Optional[Path]) -> tuple[dict | None, str | None]:
    """The class shares and default class from `--classes` or `--config` (neither: the defaults)."""
    from cadencerl.router.settings import read_classes, scenario_classes

    if classes is not None and config is not None:
        raise ConfigError("classes: give --classes or --config, not both")
    if classes is not None:
        return read_classes(classes)
    return (scenario_classes(config) if config is not None else None), None


# The settings whose flag is not their name with dashes (vllm-router's names, units dropped).
FLAGS = {"hold_timeout_s": "--hold-timeout", "session_ttl_s": "--session-ttl",
         "contended_ttl_s": "--contended-session-ttl", "request_timeout_s": "--request-timeout-secs",
         "max_body_bytes": "--max-payload-size", "eviction_interval_s": "--eviction-interval-secs",
         "failures_to_down": "--health-failure-threshold", "metrics_interval_s": "--poll-interval-secs"}


def with_flag(message: str) -> str:
    """A settings error as the user typed it: `max_body_bytes (--max-payload-size): ...`."""
    field, sep, rest = message.partition(": ")
    return f"{field} ({FLAGS[field]}){sep}{rest}" if field in FLAGS else message


def started_line(settings, port: int) -> str:
    """What the router serves, said once on stderr when it starts (uvicorn logs only warnings)."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return (f"router: listening on http://{host}:{port}, {len(settings.workers)} workers "
            f"({', '.join(settings.workers)}), policy {settings.policy}"
            + (f", {settings.processes} processes" if settings.processes > 1 else "")
            + f", data path in {settings.data_path.capitalize()}")
