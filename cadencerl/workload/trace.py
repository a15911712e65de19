"""Replay a JSONL trace of observed lengths as a workload.

Each line is checked as strictly as a scenario field: unknown fields, non-finite or out-of-range
numbers, `null` where a list belongs and classes outside the target mix are refused with the line
number, rather than run as something the trace did not say.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cadencerl.config import MAX_SECONDS, MAX_TOKENS, MAX_TRAJECTORIES, ConfigError, format_validation_error
from cadencerl.core.spec import HiddenLength, SealedTurns, TrajectorySpec, Turn
from cadencerl.user_files import read_text_file

MAX_TRACE_BYTES = 1 << 28   # 256 MiB: a million trajectories of multi-turn lines


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, populate_by_name=True)


class TraceTurn(_Line):
    observation_len: int = Field(gt=0, le=MAX_TOKENS)
    tool_latency_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)
    response_len: int = Field(gt=0, le=MAX_TOKENS)


class TraceRecord(_Line):
    prompt_len: int = Field(gt=0, le=MAX_TOKENS)
    response_len: int = Field(gt=0, le=MAX_TOKENS)
    group: int | None = Field(default=None, ge=0, le=MAX_TRAJECTORIES)
    workload_class: str | None = Field(default=None, alias="class", min_length=1)
    turns: list[TraceTurn] = Field(default_factory=list, max_length=1000)


def load_trace(path: str | Path, key: object, workload_class: str = "rlvr", *, limit: int | None = None,
               classes: set[str] | None = None) -> list[TrajectorySpec]:
    """Replay a JSONL trace of `{prompt_len, response_len, group, class, turns: [{observation_len,
    tool_latency_s, response_len}]}`: its first `limit` records (all when None; fewer is an error).

    A record without `class` belongs to `workload_class`; every class must be one of `classes`
    (the scenario's target mix) when that is given."""
    path = Path(path)
    text = read_text_file(path, "workload.trace", MAX_TRACE_BYTES)
    out: list[TrajectorySpec] = []
    prompts: dict[int, tuple[int, int]] = {}      # explicit group -> (its prompt_len, the line that set it)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(out) == limit:
            break
        if not line.strip():
            continue
        rec = _record(line, path, lineno)
        cls = rec.workload_class or workload_class
        if classes is not None and cls not in classes:
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: class {cls!r} is not in the target mix "
                              f"({', '.join(sorted(classes))}); name it under workload.classes")
        turns = SealedTurns(tuple(Turn(t.observation_len, t.tool_latency_s, HiddenLength(t.response_len, key))
                                  for t in rec.turns), key)
        group = _group(rec, lineno, prompts, path)
        out.append(TrajectorySpec(len(out), group, rec.prompt_len, HiddenLength(rec.response_len, key), cls, turns))
    if not out:
        raise ConfigError(f"workload.trace: {path.name} has no trajectories")
    if limit is not None and len(out) < limit:
        raise ConfigError(f"workload.trajectories: {limit}, but the trace {path.name} holds only {len(out)}; "
                          f"set workload.trajectories (or --trajectories) to at most {len(out)}")
    return out


def _group(rec: TraceRecord, lineno: int, prompts: dict[int, tuple[int, int]], path: Path) -> int:
    """A record's prompt group: its own `group` (samples of one prompt, so one prompt length), or,
    without one, a group of its own, numbered past every id a line may give (no silent merge)."""
    if rec.group is None:
        return MAX_TRAJECTORIES + lineno
    first = prompts.setdefault(rec.group, (rec.prompt_len, lineno))
    if first[0] != rec.prompt_len:
        raise ConfigError(f"workload.trace: {path.name} line {lineno}: group {rec.group} has prompt_len "
                          f"{first[0]} (line {first[1]}), not {rec.prompt_len}: a group's samples share one prompt")
    return rec.group


def _record(line: str, path: Path, lineno: int) -> TraceRecord:
    where = f"workload.trace: {path.name} line {lineno}"
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: not JSON ({getattr(exc, 'msg', None) or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object")
    try:
        return TraceRecord.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: field {format_validation_error(exc)}") from None
