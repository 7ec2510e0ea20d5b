from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.policy.physics import bytes_per_param, footprint, physics

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


def test_a_backend_holds_every_models_weights_its_kv_cache_and_a_tenth_of_headroom() -> None:
    gpu, big = footprint(POLICY.pools["gpu"], POLICY), footprint(POLICY.pools["gpu-70b"], POLICY)
    assert gpu.weights == {
        "llama-3.1-8b-instruct": 16e9,
        "bge-large-en-v1.5": pytest.approx(0.67e9),
    }
    assert (gpu.kv_cache, gpu.headroom, gpu.memory) == (40e9, pytest.approx(8e9), 80e9)
    assert gpu.total == pytest.approx(64.67e9) and gpu.fits()
    # 140 GB of 70B weights in bf16 on four 80 GB GPUs: 140 + 140 GB of KV cache + 32 GB.
    assert big.weights == {"llama-3.1-70b-instruct": 140e9} and big.fits()
    int4 = footprint(POLICY.pools["cim"], POLICY)
    assert int4.weights == {"llama-3.1-8b-instruct": 4e9} and int4.total == pytest.approx(6.8e9)
