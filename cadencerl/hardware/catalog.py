"""Accelerators, models and links, each number with the source it came from.

Numbers live here and nowhere else; `perf.py` turns them into step times. A value marked
"est." is an engineering estimate, "2nd-hand" one known only from a digest of a paper; the
reasoning is in the source string so a reader can replace it with a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Accelerator:
    """One device type. Efficiencies and overheads are what turn a datasheet into step times."""

    name: str
    hbm_gb: float
    mem_bw_gbs: float
    bf16_tflops: float
    scaleup_link_gbs: float
    price_per_hour: float | None
    bw_efficiency: float = 0.7
    compute_efficiency: float = 0.5
    step_overhead_s: float = 0.005
    allreduce_latency_s: float = 10e-6
    memory_utilization: float = 0.9
    activation_reserve_gb: float = 2.0
    max_num_batched_tokens: int = 2048
    kv_block_tokens: int = 16
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer; for a MoE, `expert_params` is the routed part of `params_total`."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    params_total: float
    params_active: float
    experts: int = 0
    experts_per_token: int = 0
    bytes_per_param: int = 2
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head, BF16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def weight_bytes(self) -> float:
        return self.params_total * self.bytes_per_param

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_params(self) -> float:
        """Routed-expert parameters, derived from total and active counts (top-k of E experts)."""
        if not self.is_moe:
            return 0.0
        return (self.params_total - self.params_active) * self.experts / (self.experts - self.experts_per_token)


@dataclass(frozen=True)
class Link:
    """A path bytes (KV, weights, tokens) travel between machines; concurrent transfers share it."""

    name: str
    bandwidth_gbs: float
    latency_s: float
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


_VLLM_BUDGET = ("vLLM 0.32.0 EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py), OPENAI_API_SERVER context "
                "(rollout workers serve over HTTP): 16384 at >= 160 GiB per device, 8192 at >= 70 GiB unless "
                "the name holds 'a100', else 2048; on the CPU platform 2048 x world size. V1 always chunks prefill.")


def vllm_token_budget(name: str, hbm_gb: float, cpu: bool = False) -> int:
    """vLLM V1's default max_num_batched_tokens for an API server on this device (see _VLLM_BUDGET)."""
    gib = hbm_gb * GB / GIB
    if cpu:
        return 2048
    if gib >= 160:
        return 16384
    if gib >= 70 and "a100" not in name.lower():
        return 8192
    return 2048


_EFF = {
    "bw_efficiency": "est.: large-batch decode reaches 0.6-0.8 of peak HBM bandwidth (reference/hardware.md roofline notes)",
    "compute_efficiency": "est.: ~50% MFU for prefill (reference/hardware.md, re-prefill estimate)",
    "step_overhead_s": "est.: 3-10 ms per engine step of scheduling and launch overhead (reference/hardware.md)",
    "allreduce_latency_s": "est.: ~10 us per intra-node all-reduce launch on a scale-up link",
    "memory_utilization": "vLLM default gpu_memory_utilization=0.9 (vllm EngineArgs)",
    "activation_reserve_gb": "est.: activations, CUDA graphs and runtime buffers per device beyond weights and KV",
}


def _acc(name: str, hbm: float, bw: float, tflops: float, link: float, price: float | None,
         src: dict[str, str], **overrides: float) -> Accelerator:
    sources = dict(_EFF)
    sources["max_num_batched_tokens"] = _VLLM_BUDGET
    sources["kv_block_tokens"] = "vLLM CacheConfig default block_size 16 on GPUs (prefix-cache hits are whole blocks)"
    sources.update(src)
    overrides.setdefault("max_num_batched_tokens", vllm_token_budget(name, hbm))
    return Accelerator(name=name, hbm_gb=hbm, mem_bw_gbs=bw, bf16_tflops=tflops, scaleup_link_gbs=link,
                       price_per_hour=price, sources=sources, **overrides)


_NV = "NVIDIA datasheet"
_NO_PRICE = "not listed in the CadenceRL paper; no price assumed"

ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in [
        _acc("H800", 80, 3350, 989, 400, 2.00, {
            "hbm_gb": f"{_NV} (H100 SXM class)", "mem_bw_gbs": "CadenceRL Table 1 (2nd-hand); H100 SXM datasheet",
            "bf16_tflops": f"{_NV} (H100 SXM class, dense)", "scaleup_link_gbs": "NVLink 400 GB/s (2nd-hand)",
            "price_per_hour": "CadenceRL Table 1 (2nd-hand)"}),
        _acc("H100", 80, 3350, 989, 900, None, {
            "hbm_gb": _NV, "mem_bw_gbs": _NV, "bf16_tflops": f"{_NV} (dense)", "scaleup_link_gbs": _NV,
            "price_per_hour": _NO_PRICE}),
        _acc("H200", 141, 4800, 989, 900, None, {
            "hbm_gb": _NV, "mem_bw_gbs": _NV, "bf16_tflops": f"{_NV} (dense)", "scaleup_link_gbs": _NV,
            "price_per_hour": _NO_PRICE}),
        _acc("A100", 80, 2039, 312, 600, None, {
            "hbm_gb": f"{_NV} (A100 80GB SXM)", "mem_bw_gbs": _NV, "bf16_tflops": f"{_NV} (dense)",
            "scaleup_link_gbs": _NV, "price_per_hour": _NO_PRICE}),
        _acc("A800", 80, 2039, 312, 400, None, {
            "hbm_gb": "NVIDIA A800 80GB", "mem_bw_gbs": "NVIDIA A800 80GB", "bf16_tflops": "NVIDIA A800 (dense)",
            "scaleup_link_gbs": "NVIDIA A800 NVLink 400 GB/s", "price_per_hour": _NO_PRICE}),
        _acc("L40S", 48, 864, 362, 0, None, {
            "hbm_gb": _NV, "mem_bw_gbs": _NV, "bf16_tflops": f"{_NV} (dense)", "scaleup_link_gbs": "no NVLink",
            "price_per_hour": _NO_PRICE}),
        _acc("MI300X", 192, 5300, 1307, 896, None, {
            "hbm_gb": "AMD datasheet", "mem_bw_gbs": "AMD datasheet", "bf16_tflops": "AMD datasheet (dense)",
            "scaleup_link_gbs": "AMD Infinity Fabric 896 GB/s", "price_per_hour": _NO_PRICE}),
        _acc("A910X", 64, 1935, 354, 392, 0.67, {
            "hbm_gb": "Ascend 910B2; CadenceRL seed: 128 GB at TP=2",
            "mem_bw_gbs": "CadenceRL Table 1 (2nd-hand); 1.6 TB/s nominal per CANN platform files",
            "bf16_tflops": "est. ~354 from CANN platform files (gitcode cann/ops-cv #997)",
            "scaleup_link_gbs": "HCCS ~392 GB/s (est.)", "price_per_hour": "CadenceRL Table 1 (2nd-hand)"}),
        _acc("BI-V150", 32, 800, 128, 0, 0.22, {
            "hbm_gb": "FlagOS porting note: 32 GB per visible device; CadenceRL seed: 64 GB at TP=2",
            "mem_bw_gbs": "CadenceRL Table 1 (2nd-hand)",
            "bf16_tflops": "not published; est. 128 so FLOP/byte matches A100-class parts (affects prefill only)",
            "scaleup_link_gbs": "not found; TP all-reduce modeled over the cluster link",
            "price_per_hour": "CadenceRL Table 1 (2nd-hand)"}),
    ]
}

_QWEN = "Qwen3 config.json on the Hugging Face hub (reference/hardware.md)"

MODELS: dict[str, Model] = {
    m.name: m
    for m in [
        Model("Qwen3-8B", 36, 4096, 32, 8, 128, 8.2e9, 8.2e9, sources={"*": _QWEN}),
        Model("Qwen3-14B", 40, 5120, 40, 8, 128, 14.8e9, 14.8e9, sources={"*": _QWEN}),
        Model("Qwen3-32B", 64, 5120, 64, 8, 128, 32.8e9, 32.8e9, sources={"*": _QWEN}),
        Model("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 30.5e9, 3.3e9, experts=128, experts_per_token=8,
              sources={"*": _QWEN + "; 128 experts, top-8"}),
        # A large-active-parameter MoE of the MISA-T paper's Step3.7 / Qwen3.6-35B-A3B runs' class
        # (Step3: 321B total / 38B active): re-prefill and decode cost what 22B active params cost.
        Model("Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 235e9, 22e9, experts=128, experts_per_token=8,
              sources={"*": "Qwen/Qwen3-235B-A22B config.json on the Hugging Face hub (num_hidden_layers 94, "
                            "hidden_size 4096, num_attention_heads 64, num_key_value_heads 4, head_dim 128, "
                            "num_experts 128, num_experts_per_tok 8); the same in Ascend/MindSpeed-RL "
                            "configs/model/qwen3_235b_a22b.yaml; 235B total / 22B active from the model name "
                            "and card"}),
    ]
}

LINKS: dict[str, Link] = {
    "intra-cluster": Link("intra-cluster", 25.0, 20e-6, sources={
        "bandwidth_gbs": "one 200G RoCE NIC per device = 25 GB/s (CadenceRL setup: 8x200G RoCE per node, 2nd-hand)",
        "latency_s": "est.: RDMA setup latency ~20 us"}),
    "cross-cluster": Link("cross-cluster", 2.5, 1e-3, sources={
        "bandwidth_gbs": "CadenceRL setup: 20 Gbps between clusters (2nd-hand)",
        "latency_s": "est.: ~1 ms WAN round trip"}),
    "host": Link("host", 54.0, 10e-6, sources={
        "bandwidth_gbs": "host DRAM <-> GPU ~54 GB/s per device, community measurement (reference/hardware.md)",
        "latency_s": "est.: ~10 us to launch a device-host copy"}),
}

# Late-bound KV preparation (CadenceRL section 4.4): departed KV is staged on relay nodes of the source's
# cluster and fetched with fan-in from all of them. Each relay has one NIC of the intra-cluster link.
# Source: est.: the paper varies the relay count (Fig. 18: tails shrink as relays are added, with diminishing
# returns) and its digest gives no default; 4 per cluster assumed.
KV_RELAYS_PER_CLUSTER = 4
# Training runs on H800 (CadenceRL setup, 2nd-hand): the trainer sits in the H800 cluster when the pool
# has one, else in a cluster of its own reached over the cross-cluster link.
TRAINER_ACCELERATOR = "H800"


class CatalogError(ValueError):
    """An unknown catalog name; the message names the field and the known choices."""


def accelerator(name: str, field_name: str = "accelerator") -> Accelerator:
    return _lookup(ACCELERATORS, name, field_name)


def model(name: str, field_name: str = "model") -> Model:
    return _lookup(MODELS, name, field_name)


def _lookup(table: dict, name: str, field_name: str):
    if name not in table:
        raise CatalogError(f"{field_name}: unknown {field_name.split('.')[-1]} {name!r} (known: {', '.join(table)})")
    return table[name]


def numeric_fields(entry: Accelerator | Model | Link) -> list[str]:
    """The number-valued fields of an entry, which each need a source."""
    return [f.name for f in fields(entry) if isinstance(getattr(entry, f.name), (int, float))
            and not isinstance(getattr(entry, f.name), bool)]


# -- cpu-tiny: the local vLLM CPU servers of `cadencerl pool up` serving the tiny model (issue 4) ---
# The effective bandwidth, compute rate and step overhead are fitted to measured decode step times
# (efficiencies are then 1.0: the fitted numbers already are effective ones); HBM is sized so the
# KV capacity equals the pool's default 8,192 tokens (16 MiB at 2,048 B/token) plus the weights.
_CAL = ("fitted by `cadencerl calibrate` on 2026-11-29, this machine (2 vCPU AVX2, bf16; the two servers of "
        "`cadencerl pool up` loaded together, each pinned to its core; 8 points, rms error 4.6%)")
_TINY_PARAMS = 3_412_224  # cadencerl/devpool/tiny_model.py TINY_ARCH.num_params (= the safetensors count)

MODELS["tiny"] = Model("tiny", 4, 256, 4, 2, 64, _TINY_PARAMS, _TINY_PARAMS, sources={
    "*": "cadencerl/devpool/tiny_model.py TINY_ARCH (random-init Qwen2-style, bf16, served as 'tiny')"})


def _cpu_server(name: str, kv_tokens: int, bw: float, tflops: float, overhead: float, src: str,
                kv_note: str = "") -> Accelerator:
    """A local vLLM CPU server of the tiny model; the fitted numbers already are effective ones."""
    return _acc(
        name, (kv_tokens * 2048 + 2 * _TINY_PARAMS) / GB + 1e-9, bw, tflops, 0.0, None, {
            "hbm_gb": f"sized so KV = {kv_tokens:,} tokens{kv_note} (--kv-cache-memory-bytes) + weights",
            "mem_bw_gbs": src, "bf16_tflops": src, "step_overhead_s": src,
            "scaleup_link_gbs": "no scale-up link (one CPU core per server, tp=1)", "price_per_hour": "local machine",
            "bw_efficiency": "1.0: mem_bw_gbs is already the fitted effective bandwidth",
            "compute_efficiency": "1.0: bf16_tflops is already the fitted effective rate",
            "memory_utilization": "1.0: the KV size is set exactly by --kv-cache-memory-bytes",
            "activation_reserve_gb": "0: activations are outside the KV budget on vLLM CPU",
            "max_num_batched_tokens": "cadencerl/devpool/local_pool.py passes no --max-num-batched-tokens, so vLLM "
                                      "0.32.0's CPU API-server default applies: 2048 x world size 1 (" + _VLLM_BUDGET + ")",
            "kv_block_tokens": "cadencerl/devpool/local_pool.py PoolConfig.block_size = 32 (--block-size; vLLM CPU "
                               "needs a multiple of 32)"},
        bw_efficiency=1.0, compute_efficiency=1.0, step_overhead_s=overhead, memory_utilization=1.0,
        activation_reserve_gb=0.0, max_num_batched_tokens=vllm_token_budget(name, 0.0, cpu=True), kv_block_tokens=32)


ACCELERATORS["cpu-tiny"] = _cpu_server("cpu-tiny", 8192, 5.297, 0.005636, 0.006933, _CAL,
                                       ": PoolConfig default kv_tokens")

# -- cpu-fast / cpu-slow: a heterogeneous pair of local vLLM CPU servers (issue 15) -----------------
# Two servers of the tiny model made to differ like a fast small-memory and a slow large-memory
# accelerator: cpu-fast has its core and 4,096 KV tokens; cpu-slow has 16,384 KV tokens and a cgroup
# CPU quota of 20% of a core (docs/vllm-cpu-notes.md, "A heterogeneous real pair").
_PAIR_KV = {"cpu-fast": 4096, "cpu-slow": 16384}
_PAIR_CAL = ("fitted by `cadencerl calibrate --workers URL --accelerator {name}` on 2026-11-29, this machine "
             "(2 vCPU shared with other jobs, load average 6-12: noisy), the pair of `cadencerl pool up -s "
             "cpu-hetero` up, one server measured at a time; 8 points, rms error {rms}")


CPU_SHARES = {"cpu-slow": 0.2}
"""The share of one core a local server of that type may use (a cgroup CPU quota; others: 1.0).
Source: chosen for issue 15 so that the slow server decodes ~2-3x slower than the fast one even on a
loaded machine (at 0.4 the quota hardly bound while other jobs shared the cores)."""

ACCELERATORS["cpu-fast"] = _cpu_server("cpu-fast", _PAIR_KV["cpu-fast"], 1.514, 0.002655, 0.01704,
                                       _PAIR_CAL.format(name="cpu-fast", rms="11.2%"))
ACCELERATORS["cpu-slow"] = _cpu_server("cpu-slow", _PAIR_KV["cpu-slow"], 1.349, 0.001349, 0.04749,
                                       _PAIR_CAL.format(name="cpu-slow", rms="28.4%: the quota's 100 ms period "
                                                        "makes step times lumpy"))
