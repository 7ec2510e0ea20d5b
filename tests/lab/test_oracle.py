"""The oracle: each request where its true marginal cost is least, on the replay's own engine."""

from __future__ import annotations

from typing import Any

from gateway.fleet.state import Fleet
from gateway.policy.definition import Policy
from gateway.whatif.trace import TraceRequest
from gateway.whatif.world import SimulatedBackend, build_world
from lab.oracle import marginal
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


def price(
    sim: SimulatedBackend,
    prompt: int,
    output: int,
    ttft_ms: float | None = None,
    request: TraceRequest | None = None,
):
    usd_per_j, usd_per_slot_s = 0.12 / 3.6e6, 0.6 / 3600 / 16
    return marginal(sim, MODEL, prompt, output, usd_per_j, usd_per_slot_s, ttft_ms, 50.0, request)


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


def test_a_prefix_the_backend_holds_spares_the_prefill_the_oracle_prices(policy: Policy) -> None:
    sim = asic(policy)
    # Eight of Mooncake's 512-token blocks: a 4,000-token prompt.
    request = TraceRequest(0.0, 4000, 100, blocks=tuple(range(8)), block_tokens=512)
    cold = price(sim, 4000, 100, request=request)
    sim.device.submit(MODEL, 4000, 1, 0.0, lambda: None, request.blocks, request.block_tokens)
    sim.device.advance(10.0)
    warm = price(sim, 4000, 100, request=request)
    figures = sim.device.marginal(MODEL, 4000, 4050, request.blocks, request.block_tokens)
    # All 16-token blocks before the last token: 249 of them.
    assert figures.cached_tokens == 249 * 16
    assert warm.cost_usd < cold.cost_usd and warm.energy_j < cold.energy_j
    # Without its blocks, the same prompt is priced as a stranger's.
    assert price(sim, 4000, 100) == cold
