"""What the trainer submits: sessions of one shape, of several weighted classes, or a replayed trace."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from cadencerl.config.fields import MAX_TOKENS, Count, SafeName, Seconds, Sigma, Strict, Tokens


class LengthDist(Strict):
    """A log-normal body clipped at `cap` (the clipped mass is the point mass at the cap)."""

    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: Sigma = 1.0
    cap: Tokens
    minimum: Tokens = 1

    @model_validator(mode="after")
    def _ordered(self) -> "LengthDist":
        if self.median > self.cap:
            raise ValueError(f"median ({self.median:g}) must not exceed cap ({self.cap})")
        if self.minimum > self.cap:
            raise ValueError(f"minimum ({self.minimum}) must not exceed cap ({self.cap})")
        return self


class TurnSpec(Strict):
    """Multi-turn sessions: each turn appends observation tokens and waits on a tool first."""

    turns_min: int = Field(default=1, gt=0, le=1000)
    turns_max: int = Field(default=1, gt=0, le=1000)
    observation: LengthDist = LengthDist(median=200, sigma=0.5, cap=2000)
    tool_latency_median_s: Seconds = 2.0
    tool_latency_sigma: Sigma = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> "TurnSpec":
        if self.turns_min > self.turns_max:
            raise ValueError(f"turns_min ({self.turns_min}) must not exceed turns_max ({self.turns_max})")
        return self


class _Shape(Strict):
    """How the sessions of one workload look: groups, prompts, replies, turns."""

    group_size: int = Field(default=8, gt=0, le=4096)
    prompt: LengthDist = LengthDist(median=512, sigma=0.5, cap=4096)
    response: LengthDist | None = None
    prompt_difficulty_sigma: Sigma = 0.5
    turns: TurnSpec | None = None


class ClassSpec(_Shape):
    """One workload class of a mixed rollout (RLVR, RLHF, agentic...) and its target share.

    `response` may be left out only when a trace gives the lengths."""

    share: float = Field(gt=0, le=1e6)
    group_size: int = Field(default=1, gt=0, le=4096)


class WorkloadSpec(_Shape):
    trajectories: Count
    trace: str | None = Field(default=None, min_length=1)  # a JSONL file replacing the sampled lengths
    classes: dict[SafeName, ClassSpec] | None = None  # a mixed workload; shares are the trainer's target mix

    @model_validator(mode="after")
    def _one_shape(self) -> "WorkloadSpec":
        if self.classes is not None and not self.classes:
            raise ValueError("classes: give at least one class")
        if self.trace is not None:
            _unused_shape(self, "", "workload.trace gives the lengths")
            for name, cls in (self.classes or {}).items():
                _unused_shape(cls, f"classes.{name}.", "workload.trace gives the lengths")
            return self
        if self.classes is not None:
            _unused_shape(self, "", "each of workload.classes has its own; set it there")
        if self.classes is None and self.response is None:
            raise ValueError("response: required unless classes or a trace are given")
        for name, cls in (self.classes or {}).items():
            if cls.response is None:
                raise ValueError(f"classes.{name}.response: required unless a trace is given")
        return self

    def class_specs(self) -> dict[str, ClassSpec]:
        """Every workload as named classes (a plain workload is the single class 'rlvr')."""
        if self.classes is not None:
            return dict(self.classes)
        shape = {k: getattr(self, k) for k in _Shape.model_fields}
        return {"rlvr": ClassSpec(share=1.0, **shape)}

    def target_mix(self) -> dict[str, float]:
        """The trainer's target class mix; a workload without classes is all 'rlvr' (a trace too)."""
        if self.classes is None:
            return {"rlvr": 1.0}
        total = math.fsum(c.share for c in self.classes.values())
        return {name: c.share / total for name, c in self.classes.items()}


def _unused_shape(spec: _Shape, where: str, why: str) -> None:
    """A shape field given where nothing reads it is refused, not silently dropped (a value equal to
    its default says nothing and passes)."""
    for name in _Shape.model_fields:
        default = type(spec).model_fields[name].default
        if getattr(spec, name) != default:
            raise ValueError(f"{where}{name}: not used here ({why})")
