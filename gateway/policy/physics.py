"""The physics of a pool: what its memory holds, and a prior of roofline timing and power.

Memory: one backend holds the weights of every model its pool serves (params × bytes per
parameter of the pool's precision), its KV cache, and headroom; `footprint` adds them up
for the policy's memory check (gateway/policy/consistency.py).

Prefill is compute-bound: 2·params FLOPs per prompt token at a fraction of peak compute. Decode is
bandwidth-bound: each step reads the weights once for the whole batch, plus each sequence's KV
cache. Power rises from idle toward the maximum sub-linearly with the sequences in flight. These
figures are what a vendor sheet gives; the learned residual corrects them to what is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.policy.definition import Policy, Pool

# Fraction of peak compute a prefill reaches (model FLOPs utilisation).
PREFILL_MFU = 0.5
# Launch and scheduling overhead of a prefill, independent of its length.
PREFILL_FIXED_S = 0.010
# Typical context a concurrent sequence holds, for the per-sequence cost of a decode step.
TYPICAL_CONTEXT_TOKENS = 1024
# Power exponent of the sub-linear curve P(n) = idle + (max - idle) · (n / slots)^POWER_EXPONENT.
POWER_EXPONENT = 0.5

# Share of a backend's memory that neither weights nor KV cache may use: the CUDA context and
# the engine's own buffers, activations of the largest batch, and allocator fragmentation. It is
# what vLLM leaves by default (gpu_memory_utilization 0.9), and grows with the device as
# activations and fragmentation do, where a fixed figure would be too much for an 8 GB part and
# too little for a backend of several GPUs.
HEADROOM = 0.10

BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def bytes_per_param(precision: str) -> float:
    """Return the weight size per parameter for a precision name such as 'bf16' or 'analog-int4'."""
    for name, size in BYTES_PER_PARAM.items():
        if precision.endswith(name):
            return size
    return 2.0


@dataclass(frozen=True, slots=True)
class Physics:
    """Timing and power coefficients of one model on one pool's backends."""

    prefill_fixed_s: float
    prefill_per_token_s: float
    step_fixed_s: float
    step_per_seq_s: float
    idle_w: float
    max_w: float
    slots: int

    def ttft_s(self, prompt_tokens: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * prompt_tokens

    def tpot_s(self, concurrent: int) -> float:
        return self.step_fixed_s + self.step_per_seq_s * (concurrent - 1 if concurrent > 1 else 0)

    def watts(self, concurrent: int) -> float:
        if concurrent <= 0:
            return self.idle_w
        share = min(concurrent / self.slots, 1.0)
        return self.idle_w + (self.max_w - self.idle_w) * share**POWER_EXPONENT


def physics(pool: Pool, params_b: float, kv_bytes_per_token: float) -> Physics:
    """Derive the prior for a model of `params_b` billion parameters on this pool."""
    params = params_b * 1e9
    flops_per_s = pool.compute_tflops * 1e12 * PREFILL_MFU
    bandwidth = pool.bandwidth_gbs * 1e9
    weights = params * bytes_per_param(pool.precision)
    kv_per_seq = kv_bytes_per_token * TYPICAL_CONTEXT_TOKENS
    return Physics(
        prefill_fixed_s=PREFILL_FIXED_S,
        prefill_per_token_s=2 * params / flops_per_s,
        step_fixed_s=weights / bandwidth,
        step_per_seq_s=kv_per_seq / bandwidth,
        idle_w=pool.power.idle_w,
        max_w=pool.power.max_w,
        slots=pool.slots_per_backend,
    )


@dataclass(frozen=True, slots=True)
class Footprint:
    """What one backend of a pool must hold, in bytes: each model's weights, KV cache, headroom."""

    weights: dict[str, float]  # by model, largest first
    kv_cache: float
    headroom: float
    memory: float

    @property
    def total(self) -> float:
        return sum(self.weights.values()) + self.kv_cache + self.headroom

    def fits(self) -> bool:
        # A relative tolerance, so that figures adding up to the memory exactly are not refused
        # for the rounding of their float sum.
        return self.total <= self.memory * (1 + 1e-9)


def footprint(pool: Pool, policy: Policy) -> Footprint:
    """Return the memory one backend of `pool` needs for its models, KV cache and headroom."""
    size = bytes_per_param(pool.precision)
    weights = {model: policy.params_b(model) * 1e9 * size for model in pool.models}
    ordered = dict(sorted(weights.items(), key=lambda item: -item[1]))
    memory = pool.memory_gb * 1e9
    return Footprint(ordered, pool.kv_capacity_bytes(), memory * HEADROOM, memory)
