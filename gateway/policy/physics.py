"""The physics prior: roofline timing and a power curve from a pool's nominal figures.

Prefill is compute-bound: 2·params FLOPs per prompt token at a fraction of peak compute. Decode is
bandwidth-bound: each step reads the weights once for the whole batch, plus each sequence's KV
cache. Power rises from idle toward the maximum sub-linearly with the sequences in flight. These
figures are what a vendor sheet gives; the learned residual corrects them to what is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.policy.model import Pool

# Fraction of peak compute a prefill reaches (model FLOPs utilisation).
PREFILL_MFU = 0.5
# Launch and scheduling overhead of a prefill, independent of its length.
PREFILL_FIXED_S = 0.010
# Typical context a concurrent sequence holds, for the per-sequence cost of a decode step.
TYPICAL_CONTEXT_TOKENS = 1024
# Power exponent of the sub-linear curve P(n) = idle + (max - idle) · (n / slots)^POWER_EXPONENT.
POWER_EXPONENT = 0.5

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
        return self.step_fixed_s + self.step_per_seq_s * max(concurrent - 1, 0)

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
