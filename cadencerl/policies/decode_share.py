"""What a worker decodes at full load, by the pool's perf models: the weight of its fair share under
`spread.share_by: decode`. KV capacity stands in for speed only where the large-memory workers are
also the ones that decode more at once (the GPU pools); on a pool whose large-memory worker is the
slow one it runs against speed (docs/policies/cadence.md, the fair share)."""

from __future__ import annotations

from collections.abc import Mapping

from cadencerl.core.worker import Worker
from cadencerl.hardware.perf import WorkerPerf


class DecodeRate:
    """Tokens per second a worker decodes with as many residents of one context as its KV and its
    slots hold. The perf model is the catalog's for the worker's accelerator and TP; the KV capacity
    and slots are the worker's own (a live server reports its KV)."""

    def __init__(self, perfs: Mapping[tuple[str, int], WorkerPerf]) -> None:
        self.perfs = dict(perfs)

    def __call__(self, w: Worker, context: int) -> float | None:
        """None: no perf model for this worker's accelerator and TP."""
        perf = self.perfs.get((w.accelerator, w.tp))
        if perf is None:
            return None
        context = max(context, 1)
        batch = max(1, min(w.max_num_seqs, w.kv_capacity // context))
        return batch / perf.decode_step_time(batch, batch * context)   # the step reads every context
