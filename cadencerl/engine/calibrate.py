"""Fit an accelerator profile (step overhead, effective bandwidth and compute rate) to real servers.

Why this shape: the simulator's step-time model (`hardware/perf.py`) is kept as is; calibration
only searches the catalog numbers that make it reproduce measured decode step times, so the fit
is evaluated by the very code the simulator runs. Step times are measured from the token stream
itself: with B requests decoding together, the window in which all of them are streaming holds
one token per request per step. By default every server is loaded at once, as in a pool run,
because servers sharing a machine slow each other down.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, replace

import numpy as np

from cadencerl.engine.client import VLLMClient
from cadencerl.hardware import catalog
from cadencerl.hardware.catalog import Accelerator, Model
from cadencerl.hardware.perf import make_perf


@dataclass(frozen=True)
class StepSample:
    batch: int          # requests decoding together on one server
    context: int        # their total context in the middle of the measured window
    step_s: float       # seconds per decode step (median over repeats and the servers measured together)
    servers: int        # servers loaded at the same time


@dataclass(frozen=True)
class Fit:
    step_overhead_s: float
    mem_bw_gbs: float       # effective (efficiency 1.0)
    bf16_tflops: float      # effective (efficiency 1.0)
    rms_rel_error: float
    predicted_s: list[float]

    def accelerator(self, base: Accelerator) -> Accelerator:
        return replace(base, mem_bw_gbs=self.mem_bw_gbs, bf16_tflops=self.bf16_tflops,
                       step_overhead_s=self.step_overhead_s, bw_efficiency=1.0, compute_efficiency=1.0)


async def _one_server(client: VLLMClient, batch: int, prompt_len: int, new_tokens: int,
                      vocab: int, rng: random.Random) -> tuple[float, int] | None:
    """Prefill the prompts first (one token each), then stream them again: the prefix cache makes the
    second admission instant, so all `batch` requests decode together from the start."""
    stamps: list[list[tuple[float, int]]] = [[] for _ in range(batch)]
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(batch)]
    tag = f"{batch}-{prompt_len}-{rng.getrandbits(32):08x}"

    async def one(i: int, n: int, record: bool) -> None:
        on = (lambda new: stamps[i].append((time.monotonic(), len(new)))) if record else None
        out = await client.generate(f"calib-{tag}-{i}-{n}", prompts[i], n, on)
        out.raise_for_error()

    await asyncio.gather(*(one(i, 1, False) for i in range(batch)))
    await asyncio.gather(*(one(i, new_tokens, True) for i in range(batch)))
    lo = max(s[0][0] for s in stamps)          # every request has its first token (prefill over)
    hi = min(s[-1][0] for s in stamps)         # none has finished yet
    if hi <= lo:
        return None
    inside = [sum(n for t, n in s if lo < t <= hi) for s in stamps]
    steps = float(np.mean(inside))
    if steps < 4:
        return None
    mid = (lo + hi) / 2
    context = sum(prompt_len + sum(n for t, n in s if t <= mid) for s in stamps)
    return (hi - lo) / steps, context


async def measure(urls: list[str], model: str, *, batches: list[int], prompts: list[int], new_tokens: int,
                  together: bool = True, repeat: int = 3, vocab: int = 4096, seed: int = 0,
                  point_timeout_s: float = 180.0, on_point=None) -> tuple[list[StepSample], int]:
    """Decode step time at every (batch, prompt length); all servers at once unless `together` is False.

    A prompt length is clipped so the batch fits in 85% of the smallest server's KV cache, whose
    size (tokens) is returned with the samples, and each request in its max_model_len."""
    rng = random.Random(seed)
    clients = [VLLMClient(u, model=model) for u in urls]
    out: list[StepSample] = []
    try:
        kv = min([await _kv_tokens(c) for c in clients])
        longest = min((c.max_model_len for c in clients if c.max_model_len), default=None)
        await asyncio.wait_for(asyncio.gather(*(_one_server(c, 1, 16, 8, vocab, rng) for c in clients)), 60)
        groups = [clients] if together else [[c] for c in clients]
        for b in batches:
            fit_kv = int(0.85 * kv / b) - new_tokens
            for p in sorted({min(p, fit_kv, longest - new_tokens if longest else fit_kv) for p in prompts}):
                if p < 1:
                    continue  # the batch alone would overflow the KV cache: vLLM would preempt
                for group in groups:
                    got = []
                    for _ in range(repeat):   # the median of repeats damps other load on the machine
                        got += await asyncio.wait_for(asyncio.gather(
                            *(_one_server(c, b, p, new_tokens, vocab, rng) for c in group)), point_timeout_s)
                    got = [g for g in got if g is not None]
                    if not got:
                        continue
                    sample = StepSample(b, int(np.median([g[1] for g in got])), float(np.median([g[0] for g in got])),
                                        len(group))
                    out.append(sample)
                    if on_point:
                        on_point(sample)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
    return out, kv


async def _kv_tokens(client: VLLMClient) -> int:
    await client.check_model()
    return await client.kv_capacity()


def fit(samples: list[StepSample], model: Model, base: Accelerator) -> Fit:
    """Least relative squared error over (bandwidth, compute rate) on a log grid, refined twice;
    the step overhead has a closed form for each pair."""
    if len(samples) < 3:
        raise ValueError("calibrate: need at least 3 measured points to fit 3 parameters")
    t = np.array([s.step_s for s in samples])
    w = 1.0 / t**2

    def evaluate(bw: float, tf: float) -> tuple[float, float, np.ndarray]:
        perf = make_perf(replace(base, mem_bw_gbs=bw, bf16_tflops=tf, step_overhead_s=0.0, bw_efficiency=1.0,
                                 compute_efficiency=1.0), model, 1)
        pred = np.array([perf.decode_step_time(s.batch, s.context) for s in samples])
        t0 = max(0.0, float(np.sum(w * (t - pred)) / np.sum(w)))
        err = float(np.sum(w * (pred + t0 - t) ** 2))
        return err, t0, pred + t0

    bw_axis, tf_axis = np.logspace(-2, 4, 61), np.logspace(-6, 1, 71)
    best = None
    for _round in range(3):
        for bw in bw_axis:
            for tf in tf_axis:
                err, t0, pred = evaluate(float(bw), float(tf))
                if best is None or err < best[0]:
                    best = (err, float(bw), float(tf), t0, pred)
        _, bw, tf, _, _ = best
        span_bw, span_tf = bw_axis[1] / bw_axis[0], tf_axis[1] / tf_axis[0]
        bw_axis = np.geomspace(bw / span_bw, bw * span_bw, 21)
        tf_axis = np.geomspace(tf / span_tf, tf * span_tf, 21)
    err, bw, tf, t0, pred = best
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return Fit(t0, bw, tf, rms, pred.tolist())


def catalog_snippet(fit_: Fit, kv_tokens: int, model: Model, when: str) -> str:
    """The cpu-tiny numbers to paste into `hardware/catalog.py`."""
    hbm = (kv_tokens * model.kv_bytes_per_token + model.weight_bytes) / catalog.GB
    return (f"# fitted by `cadencerl calibrate` on {when}, this machine (rms relative error "
            f"{100 * fit_.rms_rel_error:.1f}%)\n"
            f"hbm_gb={hbm:.9f}  # {kv_tokens} KV tokens + weights\n"
            f"mem_bw_gbs={fit_.mem_bw_gbs:.4g}\nbf16_tflops={fit_.bf16_tflops:.4g}\n"
            f"step_overhead_s={fit_.step_overhead_s:.4g}\n")
