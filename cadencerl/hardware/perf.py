"""Roofline step-time model: pure functions from (accelerator, model, TP) to seconds.

Decode is modeled per engine step as
    t(B, C) = t0 + t_comm(B) + max(bytes(B, C) / (eff_bw * BW), flops(B, C) / (eff_c * peak))
with C the total context of the batch. For a fixed batch both terms are linear in C, and C grows
by B every step, so the time of n steps is a sum of the max of two lines: closed form, which is
what lets the simulator jump from event to event instead of stepping token by token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from cadencerl.hardware.catalog import GB, LINKS, Accelerator, Model


class DoesNotFitError(ValueError):
    """The model's weights leave no room for KV on this worker."""


class DecodeLine:
    """Step time of a fixed batch as a function of the step index k (context C0 + B*k).

    time(k) = base + max(p0 + p1*k, q0 + q1*k): p is the memory term, q the compute term. The max
    of two lines is one line up to the crossing `split` and another after it, so sums over steps
    are two arithmetic series. (A plain slotted class: this is the simulator's hot path.)
    """

    __slots__ = ("base", "p0", "p1", "q0", "q1", "split", "a0", "a1", "b0", "b1")

    def __init__(self, base: float, p0: float, p1: float, q0: float, q1: float) -> None:
        self.base, self.p0, self.p1, self.q0, self.q1 = base, p0, p1, q0, q1
        m0, m1, c0, c1 = base + p0, p1, base + q0, q1
        if m1 == c1:
            self.split, self.a0, self.a1, self.b0, self.b1 = 0, 0.0, 0.0, max(m0, c0), m1
            return
        cross = (c0 - m0) / (m1 - c1)
        # (a0, a1) holds before `split`, (b0, b1) from it on
        first, second = ((c0, c1), (m0, m1)) if m1 > c1 else ((m0, m1), (c0, c1))
        self.split = math.ceil(cross) if 0.0 < cross < 1e15 else (0 if cross <= 0.0 else 10**15)
        (self.a0, self.a1), (self.b0, self.b1) = first, second

    def step(self, k: int) -> float:
        return self.base + max(self.p0 + self.p1 * k, self.q0 + self.q1 * k)

    def time(self, n: int) -> float:
        """Seconds for steps 0..n-1."""
        split = self.split if self.split < n else n
        total = 0.0
        if split > 0:
            total = split * self.a0 + self.a1 * (split - 1) * split / 2.0
        if split < n:
            m = n - split
            total += m * self.b0 + self.b1 * (split + n - 1) * m / 2.0
        return total

    def steps_within(self, budget: float, limit: int) -> int:
        """The most whole steps (at most `limit`) that finish within `budget` seconds."""
        if budget <= 0.0 or limit <= 0:
            return 0
        split = self.split if self.split < limit else limit
        if split > 0:
            first = split * self.a0 + self.a1 * (split - 1) * split / 2.0
            if first > budget:
                return _solve(self.a0, self.a1, 0, split, budget)
            budget -= first
        if split >= limit:
            return limit
        return split + _solve(self.b0, self.b1, split, limit - split, budget)

    def __repr__(self) -> str:
        return f"DecodeLine({self.base}, {self.p0}, {self.p1}, {self.q0}, {self.q1})"


def _solve(c0: float, c1: float, lo: int, m: int, left: float) -> int:
    """Largest j <= m with sum_{i<j} (c0 + c1*(lo+i)) <= left."""
    a = c0 + c1 * lo  # cost of the first step
    if c1 * m <= 1e-12 * a:  # flat enough: the linear estimate, corrected below
        j = int(min(left / a, m + 1.0))
    else:
        half = c1 / 2.0
        lin = a - half
        j = int((-lin + math.sqrt(lin * lin + 4.0 * half * left)) / (2.0 * half))
    j = max(0, min(j, m))
    while j < m and (j + 1) * a + c1 * j * (j + 1) / 2.0 <= left:
        j += 1
    while j > 0 and j * a + c1 * (j - 1) * j / 2.0 > left:
        j -= 1
    return j


@dataclass(frozen=True)
class WorkerPerf:
    """Step-time model of one worker: an accelerator type at a TP degree serving a model."""

    accel: Accelerator
    model: Model
    tp: int
    tp_link_gbs: float = 0.0
    _lines: dict = field(default_factory=dict, compare=False, repr=False)
    _mixed: dict = field(default_factory=dict, compare=False, repr=False)   # tokens -> (fixed time, weight bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def kv_capacity_tokens(self) -> int:
        """HBM x TP x memory utilization, minus weights and activation reserve, over KV bytes/token."""
        a, m = self.accel, self.model
        free = (a.hbm_gb * a.memory_utilization - a.activation_reserve_gb) * self.tp * GB - m.weight_bytes
        if free <= 0:
            raise DoesNotFitError(
                f"model {m.name} ({m.weight_bytes / GB:.1f} GB of weights) does not fit on "
                f"{a.name} x TP={self.tp} ({a.hbm_gb * self.tp:.0f} GB HBM): use a larger TP or another accelerator")
        return int(free // m.kv_bytes_per_token)

    # -- decode -------------------------------------------------------------------------------

    def weight_bytes_read(self, batch: int) -> float:
        """Weights streamed per step; for a MoE only the experts some token in the batch routes to."""
        m = self.model
        if not m.is_moe:
            return m.weight_bytes
        touched = 1.0 - (1.0 - m.experts_per_token / m.experts) ** batch
        dense = m.params_total - m.expert_params
        return (dense + m.expert_params * touched) * m.bytes_per_param

    def _comm(self, tokens: int) -> float:
        """Two ring all-reduces of the hidden state per layer under tensor parallelism."""
        if self.tp <= 1:
            return 0.0
        link = (self.accel.scaleup_link_gbs or self.tp_link_gbs or 25.0) * GB
        nbytes = tokens * self.model.hidden * self.model.bytes_per_param
        per = self.accel.allreduce_latency_s + 2.0 * (self.tp - 1) / self.tp * nbytes / link
        return 2 * self.model.layers * per

    def decode_line(self, batch: int, context0: int) -> DecodeLine:
        """Step-time line of `batch` sequences whose total context is `context0` at step 0."""
        coef = self._lines.get(batch)
        if coef is None:
            a, m = self.accel, self.model
            bw = a.bw_efficiency * a.mem_bw_gbs * GB * self.tp
            peak = a.compute_efficiency * a.bf16_tflops * 1e12 * self.tp
            attn_flops = 4.0 * m.layers * m.q_heads * m.head_dim
            coef = (a.step_overhead_s + self._comm(batch),
                    self.weight_bytes_read(batch) / bw, m.kv_bytes_per_token / bw,
                    2.0 * m.params_active * batch / peak, attn_flops / peak)
            self._lines[batch] = coef
        base, mem0, mem1, cmp0, cmp1 = coef
        return DecodeLine(base, mem0 + mem1 * context0, mem1 * batch, cmp0 + cmp1 * context0, cmp1 * batch)

    def decode_step_time(self, batch: int, context: int) -> float:
        """One step of `batch` sequences whose contexts sum to `context`."""
        return self.decode_line(batch, context).step(0)

    def decode_alone(self, turns: list[tuple[int, int]]) -> float:
        """Decode time of a trajectory alone at batch 1, given each turn's (starting context, tokens
        generated); the first token of each turn comes with its prefill and is not counted."""
        total = 0.0
        for context, n in turns:
            if n > 1:
                total += self.decode_line(1, context + 1).time(n - 1)
        return total

    # -- prefill and movement -------------------------------------------------------------------

    def prefill_time(self, new_tokens: list[int], cached: list[int] | None = None) -> float:
        """One prefill pass over several requests, with no decode in the same step."""
        return self.mixed_step_time(0, 0, list(zip(new_tokens, cached or [0] * len(new_tokens)))) if new_tokens else 0.0

    def mixed_step_time(self, batch: int, context: int, chunks: list[tuple[int, int]]) -> float:
        """One vLLM V1 step: `batch` decodes over total `context`, plus prefill chunks (new tokens,
        tokens already computed before them). The same roofline as decode: weights (and the KV read)
        against the FLOPs of every token; attention of a chunk is quadratic in its own length."""
        tokens = batch + sum(n for n, _c in chunks)
        per_token, attn, kv_bytes, bw, peak = self._mixed_terms
        fixed = self._mixed.get(tokens)
        if fixed is None:     # the terms of the token count alone: the same operations, done once
            fixed = self._mixed[tokens] = (self.accel.step_overhead_s + self._comm(tokens),
                                           self.weight_bytes_read(tokens))
        attended = 0.0          # tokens of context each new token attends to, summed over the chunks
        computed = 0            # tokens already computed before the chunks: their KV is read
        for n, c in chunks:
            attended += n * (c + n / 2.0)
            computed += c
        flops = per_token * tokens + attn * (context + attended)
        kv_read = kv_bytes * (context + computed)
        return fixed[0] + max((fixed[1] + kv_read) / bw, flops / peak)

    @cached_property
    def _mixed_terms(self) -> tuple[float, float, int, float, float]:
        """The constants of `mixed_step_time`: FLOPs per token, attention FLOPs per token of context,
        KV bytes per token, bandwidth and peak compute."""
        a, m = self.accel, self.model
        return (2.0 * m.params_active, 4.0 * m.layers * m.q_heads * m.head_dim, m.kv_bytes_per_token,
                a.bw_efficiency * a.mem_bw_gbs * GB * self.tp, a.compute_efficiency * a.bf16_tflops * 1e12 * self.tp)

    @property
    def token_budget(self) -> int:
        """vLLM's max_num_batched_tokens: decodes first, prefill chunks fill what is left."""
        return self.accel.max_num_batched_tokens


def make_perf(accel: Accelerator, model: Model, tp: int) -> WorkerPerf:
    perf = WorkerPerf(accel, model, tp, tp_link_gbs=LINKS["intra-cluster"].bandwidth_gbs)
    perf.kv_capacity_tokens()  # fail early, with the clear message, if it does not fit
    return perf
