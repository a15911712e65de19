"""A pool's worker groups: accelerators of one type, split into workers of `tp` devices, in a cluster."""

from __future__ import annotations

from pydantic import Field, model_validator

from cadencerl.config.fields import SafeName, Strict


class WorkerGroup(Strict):
    """`devices` accelerators of one type, split into workers of `tp` devices each, in one cluster."""

    accelerator: str
    devices: int = Field(gt=0, le=65_536)
    tp: int = Field(default=1, gt=0, le=64)
    cluster: SafeName | None = None
    max_num_seqs: int = Field(default=256, gt=0, le=65_536)

    @model_validator(mode="after")
    def _whole_workers(self) -> "WorkerGroup":
        if self.devices % self.tp:
            raise ValueError(f"devices ({self.devices}) must be a multiple of tp ({self.tp})")
        return self

    @property
    def workers(self) -> int:
        return self.devices // self.tp

    @property
    def cluster_name(self) -> str:
        """Its cluster; unnamed, each accelerator type is a cluster of its own."""
        return self.cluster or self.accelerator
