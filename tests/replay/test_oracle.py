"""The oracle: each request on its cheapest SLO-feasible pool under the true physics."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.policy.model import Policy
from gateway.replay.engine import request_profile
from gateway.replay.oracle import eligible_pools, place, true_physics
from gateway.replay.strategies import ROUTED
from gateway.replay.trace import TraceRequest


def test_the_oracle_costs_no_more_than_any_routed_strategy(
    results: dict[str, dict[str, Any]],
) -> None:
    bound = results["oracle"]["cost_usd_per_1k_tokens"]
    for name in ROUTED:
        assert bound <= results[name]["cost_usd_per_1k_tokens"], name
        assert results["oracle"]["energy_j_per_request"] <= results[name]["energy_j_per_request"]


def test_the_oracle_puts_a_request_only_where_the_true_physics_meet_its_slo(
    policy: Policy,
) -> None:
    physics = {name: true_physics(policy, name) for name in ("gpu", "asic")}
    floors = {name: phys.floors() for name, phys in physics.items()}
    request = TraceRequest(0.0, 1500, 50)
    profile = request_profile(policy, request)
    pools = eligible_pools(policy, profile, request.output_tokens)
    assert set(pools) == {"gpu", "asic"}
    cheapest = place(profile, request, physics, floors, pools)
    assert cheapest is not None
    # A TTFT target between the two pools' true prefill times leaves only the faster pool.
    prefill_ms = {
        name: phys.prefill_s(request.prompt_tokens) * 1e3 for name, phys in physics.items()
    }
    fast, slow = sorted(prefill_ms, key=prefill_ms.__getitem__)
    between = dataclasses.replace(profile, ttft_ms=(prefill_ms[fast] + prefill_ms[slow]) / 2)
    placed = place(between, request, physics, floors, pools)
    assert placed is not None and placed.pool == fast
    assert placed.cost_usd >= cheapest.cost_usd
    # No pool meets a target below every prefill: the request is not placed at all.
    impossible = dataclasses.replace(profile, ttft_ms=min(prefill_ms.values()) / 2)
    assert place(impossible, request, physics, floors, pools) is None


def test_a_prompt_past_a_pools_context_is_eligible_only_where_it_fits(policy: Policy) -> None:
    asic_context = policy.pools["asic"].max_context
    request = TraceRequest(0.0, asic_context, 50)
    profile = request_profile(policy, request)
    assert "asic" not in eligible_pools(policy, profile, request.output_tokens)
    assert "gpu" in eligible_pools(policy, profile, request.output_tokens)
