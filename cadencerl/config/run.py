"""How a run is paced: the trainer's batches and the controller's two knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadencerl.config.fields import Count, SafeName, Seconds, Strict


class TrainerSpec(Strict):
    """`mix`: "target" forms each batch toward the workload's target mix, waiting at most
    `mix_wait_s` for a short class (core/trainer.py); "completion" takes completion order.
    `cluster`: the pool's cluster the trainer sits in (new weights reach its workers over their
    own NICs alone); by default the H800 workers' cluster if the pool has one (the CadenceRL
    setup trains on H800), else a cluster of its own behind the cross-cluster link."""

    batch_size: Count
    train_time_s: Seconds = 10.0
    train_time_per_token_s: float = Field(default=0.0, ge=0, le=1.0)
    mix: Literal["target", "completion"] = "target"
    mix_wait_s: Seconds = 120.0
    cluster: SafeName | None = None


class ControllerSpec(Strict):
    """Every policy runs under these. `eta`: fresh work may run eta versions ahead of training (the
    admission budget, core/credits.py). `tick_s`: time between two decisions."""

    eta: int = Field(default=1, ge=0, le=1000)
    tick_s: float = Field(default=0.5, ge=0.01, le=3600)  # a control decision at most 100 times a virtual second
