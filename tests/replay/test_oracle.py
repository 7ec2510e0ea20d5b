"""The oracle: each request where its true marginal cost is least, on the replay's own engine."""

from __future__ import annotations

from typing import Any

from gateway.fleet.state import Fleet
from gateway.policy.model import Policy
from gateway.replay.oracle import marginal
from gateway.replay.world import SimulatedBackend, build_world
from simulator.hardware import SimulatedDevice, SimulatorHardware

MODEL = "llama-3.1-8b-instruct"


def test_the_oracle_costs_no_more_than_any_fixed_order(results: dict[str, dict[str, Any]]) -> None:
    oracle = results["oracle"]["cost_usd_per_1k_tokens"]
    for name in ("static", "best-static", "gpu-only", "round-robin", "least-loaded"):
        assert oracle <= results[name]["cost_usd_per_1k_tokens"] * 1.001, name
    assert results["oracle"]["slo_attainment"] >= results["static"]["slo_attainment"]


def asic(policy: Policy) -> SimulatedBackend:
    world = build_world(policy, Fleet(policy), [MODEL], SimulatorHardware())
    return next(sim for sim in world.values() if sim.state.pool == "asic")


def price(sim: SimulatedBackend, prompt: int, output: int, ttft_ms: float | None = None):
    return marginal(sim, MODEL, prompt, output, 0.12 / 3.6e6, 0.6 / 3600 / 16, ttft_ms, 50.0)


def test_a_request_pays_for_the_batch_it_slows(policy: Policy) -> None:
    alone = asic(policy)
    first = price(alone, 1000, 100)
    crowded = asic(policy)
    for _ in range(8):  # 8 others decoding with 1,500-token contexts: the chip's SRAM is full
        crowded.device.submit(MODEL, 1500, 10_000, 0.0, on_done=lambda: None)
    crowded.device.advance(1.0)
    assert isinstance(crowded.device, SimulatedDevice)
    device = crowded.device.device
    assert device.decoding == 8 and device.context_tokens() > 8192
    joined = price(crowded, 1000, 100)
    # Its context spills every step of the eight others to card DRAM: far dearer than alone.
    assert joined.cost_usd > 2 * first.cost_usd
    assert first.meets_slo and joined.meets_slo


def test_a_prefill_past_the_ttft_target_misses_the_slo(policy: Policy) -> None:
    sim = asic(policy)
    long_prompt = price(sim, 8000, 10, ttft_ms=100.0)
    assert not long_prompt.meets_slo
    assert price(sim, 100, 10, ttft_ms=100.0).meets_slo
