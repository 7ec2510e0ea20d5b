from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.policy.physics import bytes_per_param, physics

POLICY = load_policy(Path(__file__).resolve().parents[2] / "policies/default.yaml")


def test_gpu_prior_matches_the_roofline_of_an_8b_model() -> None:
    gpu = physics(POLICY.pools["gpu"], 8.0, 8 * 16_384)
    assert gpu.prefill_per_token_s == pytest.approx(32e-6, rel=0.05)  # 2·8e9 FLOPs at 50% of 989 TF
    assert gpu.step_fixed_s == pytest.approx(16e9 / 3350e9)  # bf16 weights over HBM bandwidth


def test_bigger_models_cost_proportionally_more() -> None:
    small, big = (
        physics(POLICY.pools["gpu"], 8.0, 8 * 16_384),
        physics(POLICY.pools["gpu"], 70.0, 70 * 16_384),
    )
    assert big.step_fixed_s / small.step_fixed_s == pytest.approx(70 / 8)
    assert big.ttft_s(1000) > small.ttft_s(1000)


def test_power_per_sequence_falls_as_the_batch_grows() -> None:
    gpu = physics(POLICY.pools["gpu"], 8.0, 8 * 16_384)
    per_seq = [gpu.watts(n) / n for n in (1, 2, 8, 32)]
    assert per_seq == sorted(per_seq, reverse=True)
    assert gpu.watts(0) == POLICY.pools["gpu"].power.idle_w
    assert gpu.watts(32) == pytest.approx(POLICY.pools["gpu"].power.max_w)


def test_precision_sets_weight_bytes() -> None:
    assert bytes_per_param("bf16") == 2.0
    assert bytes_per_param("int8") == 1.0
    assert bytes_per_param("analog-int4") == 0.5
