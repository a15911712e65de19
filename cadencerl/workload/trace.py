"""Replay a JSONL trace of observed lengths as a workload."""

from __future__ import annotations

import json
from pathlib import Path

from cadencerl.config import ConfigError
from cadencerl.core.spec import HiddenLength, TrajectorySpec, Turn


def load_trace(path: str | Path, key: object, workload_class: str = "rlvr") -> list[TrajectorySpec]:
    """Replay a JSONL trace of `{prompt_len, response_len, group, turns: [{observation_len, tool_latency_s, response_len}]}`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"workload.trace: no such file {str(path)!r}")
    out: list[TrajectorySpec] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: expected an object")
        prompt = _positive_int(rec, "prompt_len", path, lineno)
        response = _positive_int(rec, "response_len", path, lineno)
        group = rec.get("group", lineno - 1)
        if not isinstance(group, int) or isinstance(group, bool) or group < 0:
            raise ConfigError(f"workload.trace: {path.name} line {lineno}: field 'group' must be a non-negative integer")
        turns = []
        for j, t in enumerate(rec.get("turns", [])):
            if not isinstance(t, dict):
                raise ConfigError(f"workload.trace: {path.name} line {lineno}: turns.{j} must be an object")
            obs = _positive_int(t, "observation_len", path, lineno, f"turns.{j}.")
            rsp = _positive_int(t, "response_len", path, lineno, f"turns.{j}.")
            tool = t.get("tool_latency_s", 0.0)
            if not isinstance(tool, (int, float)) or isinstance(tool, bool) or tool < 0:
                raise ConfigError(f"workload.trace: {path.name} line {lineno}: field 'turns.{j}.tool_latency_s' must be >= 0")
            turns.append(Turn(obs, float(tool), HiddenLength(rsp, key)))
        out.append(TrajectorySpec(len(out), group, prompt, HiddenLength(response, key),
                                  str(rec.get("class", workload_class)), tuple(turns)))
    if not out:
        raise ConfigError(f"workload.trace: {path.name} has no trajectories")
    return out


def _positive_int(rec: dict, name: str, path: Path, lineno: int, prefix: str = "") -> int:
    value = rec.get(name)
    if value is None:
        raise ConfigError(f"workload.trace: {path.name} line {lineno}: missing field '{prefix}{name}'")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"workload.trace: {path.name} line {lineno}: field '{prefix}{name}' must be a positive integer")
    return value
