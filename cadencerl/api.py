"""The trainer-facing API: a rollout pool over real vLLM servers, driven by the CadenceRL controller.

A trainer submits prompts, iterates over completed batches tagged with their policy versions and
publishes each new version (a hook updates each worker's weights); the controller runs in a thread,
so rollout goes on while the trainer trains, under the staleness bound eta (docs/internals.md, api).

    with RolloutPool(urls, batch_size=64, eta=1, weight_update=push) as pool:
        pool.submit(prompt.ids, group=prompt.group, max_tokens=512)   # for each prompt
        for batch in pool.batches():
            train(batch.samples); pool.publish()
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from cadencerl.config import MAX_TOKENS, ConfigError, Scenario, builtin_scenario
from cadencerl.core.controller import Controller
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import Trajectory
from cadencerl.engine.backend import EngineBackend, WeightUpdate
from cadencerl.engine.client import Timeouts
from cadencerl.engine.exporter import MetricsExporter
from cadencerl.runs.journaled import attach_journal, open_journal
from cadencerl.runs.real import (MAX_DEADLINE_S, RealRun, assemble, kv_list, lost_why, parse_urls, resolve_labels,
                                 summarize_real)
from cadencerl.runs.registry import live_scenario, make_policy
from cadencerl.workload.generate import generate

_END = object()


@dataclass(frozen=True)
class Sample:
    """One completed trajectory as the trainer receives it."""

    id: int
    group: int
    workload_class: str
    prompt_ids: list[int]
    completion_ids: list[int]      # everything after the prompt, in order (tool observations included)
    tag: int                       # the policy version it started under: staleness counts from it
    versions: tuple[int, ...]      # every version that generated part of it


@dataclass(frozen=True)
class Batch:
    """Batch `index` trains version `index` into version `index + 1`."""

    index: int
    samples: list[Sample]

    @property
    def tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.samples)

    def staleness(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.samples:
            out[self.index - s.tag] = out.get(self.index - s.tag, 0) + 1
        return out


class RolloutPool:
    """Submit, then iterate batches and publish; `result()` gives the run's figures at the end.

    Knobs default to the built-in `cpu-pair` scenario (policy, delta, tick, trainer batch, eta);
    pass `scenario=` for other ones, `batch_size=`/`eta=` to override just those. `metrics_port`
    (off by default; 0 picks a free port) serves the controller's state for Prometheus at
    `metrics_url` while the run goes on; `weight_update=WeightPusher(...)` pushes each version's
    weights into the servers (`cadencerl.devpool.weights`).
    """

    def __init__(self, urls: Sequence[str], *, policy: str = "cadence", scenario: Scenario | None = None,
                 labels: Sequence[str] | None = None, kv_tokens: int | Sequence[int] | None = None,
                 batch_size: int | None = None, eta: int | None = None, weight_update: WeightUpdate | None = None,
                 progress: Callable[[int, int], None] | None = None, deadline_s: float | None = None,
                 timeouts: Timeouts = Timeouts(), join_timeout_s: float = 30.0,
                 connect_timeout_s: float = 30.0, metrics_port: int | None = None,
                 journal: str | Path | None = None) -> None:
        """`journal`: a file the controller records its state in; a pool started on one that holds
        a run resumes it (docs/journal.md). Everything is checked here (a ConfigError names the argument), not when the run starts.
        A server that refuses the connection fails at once; one that does not answer within
        `connect_timeout_s` fails then. `metrics_port` serves the controller's state for Prometheus
        (0: a free port, see `metrics_url`; None: off)."""
        if scenario is not None and not isinstance(scenario, Scenario):
            raise ConfigError(f"scenario: expected a Scenario, got {type(scenario).__name__}")
        if metrics_port is not None and (isinstance(metrics_port, bool) or not isinstance(metrics_port, int)
                                         or not 0 <= metrics_port <= 65535):
            raise ConfigError(f"metrics_port: expected a port number 0-65535, got {metrics_port!r}")
        scenario = scenario or builtin_scenario("cpu-pair")
        changes: dict = {}
        if batch_size is not None:      # the workload is what is submitted: its count here is a placeholder
            changes["trainer"] = {"batch_size": batch_size}
            if isinstance(batch_size, int) and batch_size > scenario.workload.trajectories:
                changes["workload"] = {"trajectories": batch_size}
        if eta is not None:
            changes["controller"] = {"eta": eta}
        self.scenario = scenario.with_overrides(**changes) if changes else scenario
        if isinstance(urls, (str, bytes)) or not isinstance(urls, Sequence):
            raise ConfigError(f"urls: expected a list of http://HOST:PORT URLs, got {urls!r}")
        if not all(isinstance(u, str) for u in urls):
            raise ConfigError(f"urls: every URL must be a string, got {list(urls)!r}")
        self.urls = parse_urls(urls)
        make_policy(policy, self.scenario)
        if labels is not None and (isinstance(labels, str) or not all(isinstance(x, str) for x in labels)):
            raise ConfigError(f"labels: expected a list of accelerator names, got {labels!r}")
        self.labels = resolve_labels(self.scenario, len(self.urls), labels)
        kv_list(kv_tokens, len(self.urls))
        if not isinstance(timeouts, Timeouts):
            raise ConfigError(f"timeouts: expected a Timeouts, got {timeouts!r}")
        for name, value in (("deadline_s", deadline_s), ("join_timeout_s", join_timeout_s),
                            ("connect_timeout_s", connect_timeout_s), ("timeouts.connect", timeouts.connect),
                            ("timeouts.request", timeouts.request), ("timeouts.stream_read", timeouts.stream_read)):
            _positive_seconds(name, value, optional=name == "deadline_s")
        if deadline_s is not None and deadline_s > MAX_DEADLINE_S:
            raise ConfigError(f"deadline_s: must be at most {MAX_DEADLINE_S:.0f} seconds (a week), got {deadline_s!r}")
        for name, fn in (("weight_update", weight_update), ("progress", progress)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name}: expected a callable, got {fn!r}")
        self.policy, self.kv_tokens = policy, kv_tokens
        self.weight_update, self.progress, self.deadline_s, self.timeouts = weight_update, progress, deadline_s, timeouts
        self.join_timeout_s, self.connect_timeout_s = join_timeout_s, connect_timeout_s
        self._closed = False
        self.journal = None if journal is None else open_journal(journal)   # ConfigError: owned elsewhere
        self.journal_report: dict | None = None
        self.exporter = None if metrics_port is None else MetricsExporter(lambda: self.controller, metrics_port)
        self._key = object()          # seals the target lengths: only the engine backend opens them
        self._specs: list[TrajectorySpec] = []
        self._prompts: dict[int, list[int]] = {}
        self._run: RealRun | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._training: int | None = None   # index of the batch handed out and not yet published
        self._last_handed_out = False       # it is the run's last batch: no next one waits on its publish
        self._result: dict | None = None
        self._started_at = self._ended_at = 0.0

    @classmethod
    def from_scenario(cls, scenario: Scenario, urls: Sequence[str], **kwargs) -> RolloutPool:
        """A pool whose submissions are the scenario's seeded workload (synthetic prompt ids): its
        workload is the one submitted, so a `batch_size` is checked against it."""
        if isinstance(scenario, Scenario) and kwargs.get("batch_size") is not None:
            scenario.with_overrides(trainer={"batch_size": kwargs["batch_size"]})      # ConfigError if larger
        pool = cls(urls, scenario=scenario, **kwargs)
        pool._specs = generate(scenario.workload, scenario.seed, pool._key)
        return pool

    # -- the trainer's side -----------------------------------------------------------------------

    def submit(self, token_ids: Sequence[int], *, max_tokens: int, group: int | None = None,
               workload_class: str = "rlvr") -> int:
        """Queue one rollout of `max_tokens` new tokens after `token_ids`; returns its id.

        Samples of one prompt share a `group` (default: a group of its own), which placement uses
        to keep siblings together on the prefix cache. All submissions come before `batches()`.
        """
        if self._closed:
            raise RuntimeError("submit: the pool is closed")
        if self._run is not None:
            raise RuntimeError("submit: the run has started; submit every prompt before batches()")
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
            raise ConfigError(f"token_ids: expected a list of token ids, got {token_ids!r:.80}")
        if not token_ids:
            raise ConfigError("token_ids: must not be empty")
        if not all(_is_int(t) and 0 <= t < 2**31 for t in token_ids):
            bad = next(t for t in token_ids if not (_is_int(t) and 0 <= t < 2**31))
            raise ConfigError(f"token_ids: every id must be a non-negative integer, got {bad!r}")
        ids = [int(t) for t in token_ids]
        if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS:
            raise ConfigError(f"max_tokens: must be a positive integer (at most {MAX_TOKENS}), got {max_tokens!r}")
        if group is not None and not (_is_int(group) and group >= 0):
            raise ConfigError(f"group: must be a non-negative integer or None, got {group!r}")
        mix = self.scenario.workload.target_mix()
        if workload_class not in mix:
            raise ConfigError(f"workload_class: {workload_class!r} is not in the target mix ({', '.join(mix)})")
        tid = len(self._specs)
        self._specs.append(TrajectorySpec(tid, tid if group is None else int(group), len(ids),
                                          HiddenLength(int(max_tokens), self._key), workload_class))
        self._prompts[tid] = ids
        return tid

    def batches(self) -> Iterator[Batch]:
        """Completed batches in training order; rollout continues while the caller trains. Publish
        each batch before asking for the next: the next batch is formed once its version is out."""
        self._start()
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive() and self._queue.empty():
                    break
                continue
            if item is _END:
                break
            yield item
            if self._training == item.index and not self._last_handed_out:
                raise RuntimeError(f"batches: batch {item.index} is not published; call pool.publish() once it "
                                   "is trained, before asking for the next (the next version's rollout waits for it)")
        if self._error is not None:
            raise self._error

    def publish(self) -> int:
        """The batch handed out is trained: publish version index+1 (workers then advance)."""
        if self._training is None:
            raise RuntimeError("publish: no batch is being trained")
        version, self._training = self._training + 1, None
        if self._last_handed_out and self.journal is not None:    # the controller is done: the record is ours
            self._thread.join(self.join_timeout_s)
            if not self._thread.is_alive():
                self.journal.published(version, self._run.controller.trainer.batches[-1].trajectory_ids)
        elif self._thread is not None and self._thread.is_alive():
            self._run.backend.publish_now()
        return version

    def result(self) -> dict:
        """The run's figures (as `cadencerl sim --json`, plus wall-clock and engine figures)."""
        if self._result is None:
            if self._run is None or self._thread is None or self._thread.is_alive():
                raise RuntimeError("result: the run has not finished")
            if self._error is not None:
                raise self._error
            self._result = summarize_real(self._run, self._ended_at - self._started_at)
            if self.journal_report is not None:
                self._result["journal"] = {**self.journal_report, "bytes": self.journal.size_bytes(),
                                           "flush_s": round(self.journal.busy_s, 4),
                                           "flush_cpu_s": round(self.journal.cpu_s, 4)}
        return self._result

    def progress_so_far(self) -> dict:
        """How far a run got, for the record of one that failed: what finished is not lost with it
        (the trajectories completed and consumed, the tokens each server sent, the workers lost)."""
        record: dict = {"scenario": self.scenario.name, "policy": self.policy, "finished": False,
                        "trajectories_submitted": len(self._specs), "trajectories_completed": 0}
        if self._run is None:
            return record
        ctl, backend = self._run.controller, self._run.backend
        end = self._ended_at if self._thread is not None and not self._thread.is_alive() else time.perf_counter()
        return {**record, "trajectories_completed": ctl.done, "trajectories_consumed": ctl.trainer.consumed,
                "batches_consumed": len(ctl.trainer.batches), "wall_time_s": end - self._started_at,
                "tokens_generated": sum(r.tokens_generated for r in backend.records),
                "lost_workers": list(backend.lost),
                "lost_why": lost_why(backend),
                "workers": [{"worker": r.worker, "url": r.url, "tokens_generated": r.tokens_generated}
                            for r in backend.records]}

    def close(self) -> None:
        """Stop the run if it is still going, every connection and the metrics endpoint; idempotent.
        No submissions after."""
        self._closed = True
        if self.exporter is not None:
            self.exporter.close()
        run = self._run
        if run is not None and self._thread is not None and self._thread.is_alive():
            run.backend.stop()
            self._thread.join(self.join_timeout_s)
        if run is not None and (self._thread is None or not self._thread.is_alive()):
            run.backend.close()
        if self.journal is not None and (self._thread is None or not self._thread.is_alive()):
            self.journal.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes the controller's state (once `batches()` has started it)."""
        return self.exporter.url if self.exporter is not None else None

    @property
    def controller(self) -> Controller | None:
        return self._run.controller if self._run else None

    @property
    def backend(self) -> EngineBackend | None:
        return self._run.backend if self._run else None

    # -- the controller's side (background thread) ------------------------------------------------

    def _start(self) -> None:
        if self._run is not None:
            return
        if not self._specs:
            raise ValueError("submit: nothing submitted")
        if self.exporter is not None:     # first: a taken port leaves no run half-started behind
            try:
                self.exporter.start()
            except OSError as exc:
                raise ConfigError(f"metrics_port: cannot serve on {self.exporter.port}: {exc}") from None
        if callable(getattr(self.weight_update, "start_at_base", None)):   # a WeightPusher: version 0 is the base
            self.weight_update.start_at_base(self.urls)
        self._started_at = time.perf_counter()
        policy = make_policy(self.policy, live_scenario(self.scenario))
        self._run = assemble(self.scenario, policy, self.urls, self._specs, self._key, labels=self.labels,
                             kv_tokens=self.kv_tokens, prompts=self._prompts, weight_update=self.weight_update,
                             on_publish_due=self._hand_out_batch, timeouts=self.timeouts,
                             deadline_s=self.deadline_s, connect_timeout_s=self.connect_timeout_s)
        self._run.controller.on_progress = self.progress
        if self.journal is not None:
            self.journal_report = attach_journal(self._run, self.journal, self._prompts)
        self._thread = threading.Thread(target=self._drive, name="cadencerl-controller", daemon=True)
        self._thread.start()

    def _drive(self) -> None:
        try:
            self._run.controller.run()
            self._run.backend.finish()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread
            self._error = exc
        finally:
            self._ended_at = time.perf_counter()
            self._queue.put(_END)

    def _hand_out_batch(self) -> None:
        """The controller formed a batch and would publish after training it: the trainer trains it
        instead, and `publish()` tells the controller when. The batch is the trainer's own record."""
        ctl = self._run.controller
        formed = ctl.trainer.batches[-1]
        self._training, self._last_handed_out = formed.index, ctl.trainer.all_consumed
        self._queue.put(Batch(formed.index, [self._sample(ctl.trajectories[tid]) for tid in formed.trajectory_ids]))

    def _sample(self, t: Trajectory) -> Sample:
        ids = self._run.backend.token_ids(t.id)
        return Sample(t.id, t.group, t.workload_class, ids[: t.prompt_len], ids[t.prompt_len:], t.tag,
                      tuple(t.versions))


def _is_int(value: object) -> bool:
    """An integer, numpy's included, but not a bool (True is not a token count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive_seconds(name: str, value: object, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a finite number of seconds above 0, got {value!r}")


def run_real(scenario: Scenario, policy_name: str, urls: Sequence[str], labels: Sequence[str] | None = None, *,
             kv_tokens: int | Sequence[int] | None = None, progress: Callable[[int, int], None] | None = None,
             weight_update: WeightUpdate | None = None, deadline_s: float | None = None,
             timeouts: Timeouts = Timeouts(), metrics_port: int | None = None,
             on_pool: Callable[[RolloutPool], None] | None = None, journal: str | Path | None = None) -> dict:
    """Run `scenario`'s workload with `policy_name` on the servers at `urls`.

    A stand-in trainer consumes each batch through the trainer API, sleeping `train_time_s` (plus
    the per-token time) before publishing the next version, while rollout goes on. `on_pool` sees
    the pool before it starts (e.g. to watch its controller).
    """
    with RolloutPool.from_scenario(scenario, urls, policy=policy_name, labels=labels, kv_tokens=kv_tokens,
                                   weight_update=weight_update, progress=progress, deadline_s=deadline_s,
                                   timeouts=timeouts, metrics_port=metrics_port, journal=journal) as pool:
        if on_pool is not None:
            on_pool(pool)
        for batch in pool.batches():
            time.sleep(scenario.trainer.train_time_s + scenario.trainer.train_time_per_token_s * batch.tokens)
            pool.publish()
        return pool.result()
