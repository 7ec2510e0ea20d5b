from __future__ import annotations

import pytest

from gateway.errors import ContextTooLong, ModelNotFound, NoCapacity, NoHealthyBackend, RouteDenied
from gateway.fleet.state import Fleet
from gateway.routing.classify import RequestProfile
from gateway.routing.router import decide, pick_backend
from policies import BIG, EMBED, MODEL, fleet_policy


def profile(model: str = MODEL, prompt: int = 100, **kw: object) -> RequestProfile:
    fields = {
        "endpoint": "chat",
        "model": model,
        "prompt_tokens": prompt,
        "max_tokens": 100,
        "slo_class": "interactive",
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "e2e_ms": None,
        "tenant": "anonymous",
        "stream": False,
    }
    fields.update(kw)
    return RequestProfile(**fields)  # type: ignore[arg-type]


def fill(fleet: Fleet, pool: str) -> None:
    for backend in fleet.pools[pool].backends:
        backend.in_flight = backend.slots


def test_short_interactive_chat_goes_to_the_asic() -> None:
    policy = fleet_policy()
    decision = decide(profile(prompt=100), policy, Fleet(policy))
    assert decision.route.name == "chat-8b-short"
    assert decision.backend is not None and decision.backend.pool == "asic"


def test_long_prompt_matches_the_gpu_first_route() -> None:
    policy = fleet_policy()
    decision = decide(profile(prompt=4000), policy, Fleet(policy))
    assert decision.route.name == "chat-8b"
    assert decision.backend is not None and decision.backend.pool == "gpu"


def test_batch_class_skips_the_interactive_route() -> None:
    policy = fleet_policy()
    decision = decide(profile(slo_class="batch", ttft_ms=None), policy, Fleet(policy))
    assert decision.route.name == "chat-8b"


def test_drops_pool_whose_context_is_too_short() -> None:
    routes = [{"name": "all", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"]}]
    policy = fleet_policy(routes=routes)
    decision = decide(profile(prompt=8000, max_tokens=500), policy, Fleet(policy))
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert ("asic", "context 8192 < 8500 tokens needed") in decision.trace


def test_assumes_policy_max_tokens_when_request_names_none() -> None:
    routes = [{"name": "all", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"]}]
    policy = fleet_policy(routes=routes, assumed_max_tokens=300)
    decision = decide(profile(prompt=7900, max_tokens=None), policy, Fleet(policy))
    assert decision.backend is not None and decision.backend.pool == "gpu"


def test_drops_pool_that_does_not_serve_the_model() -> None:
    routes = [{"name": "any", "match": {}, "pools": ["asic", "gpu"]}]
    policy = fleet_policy(routes=routes)
    decision = decide(profile(model=BIG), policy, Fleet(policy))
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert ("asic", f"does not serve {BIG}") in decision.trace


def test_skips_ejected_backends_and_unhealthy_pools() -> None:
    policy = fleet_policy(gpu=("http://127.0.0.1:1", "http://127.0.0.1:4"))
    fleet = Fleet(policy)
    fleet.pools["asic"].backends[0].ejected = True
    fleet.pools["gpu"].backends[0].ejected = True
    decision = decide(profile(), policy, fleet)
    assert decision.backend is fleet.pools["gpu"].backends[1]
    assert ("asic", "no healthy backend") in decision.trace


def test_falls_back_to_gpu_when_asic_slots_are_full() -> None:
    policy = fleet_policy()
    fleet = Fleet(policy)
    fill(fleet, "asic")
    decision = decide(profile(), policy, fleet)
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert ("asic", "no free slot") in decision.trace


def test_picks_the_backend_with_most_free_slots() -> None:
    policy = fleet_policy(gpu=("http://127.0.0.1:1", "http://127.0.0.1:4"))
    fleet = Fleet(policy)
    fleet.pools["gpu"].backends[0].in_flight = 5
    decision = decide(profile(model=BIG), policy, fleet)
    assert decision.backend is fleet.pools["gpu"].backends[1]


def test_queues_in_the_preferred_pool_when_every_pool_is_full() -> None:
    policy = fleet_policy()
    fleet = Fleet(policy)
    fill(fleet, "asic")
    fill(fleet, "gpu")
    decision = decide(profile(ttft_ms=120.0), policy, fleet)
    assert decision.backend is None
    assert decision.queue_pool is fleet.pools["asic"]
    assert decision.queue_budget_s == pytest.approx(0.12)  # min(max_queue_ms 200, ttft 120)


def test_queues_in_the_next_pool_when_the_first_queue_is_full() -> None:
    policy = fleet_policy(asic_extra={"queue_depth": 0})
    fleet = Fleet(policy)
    fill(fleet, "asic")
    fill(fleet, "gpu")
    decision = decide(profile(), policy, fleet)
    assert decision.queue_pool is fleet.pools["gpu"]


def test_uses_the_fallback_pool_when_route_pools_cannot_queue() -> None:
    routes = [{"name": "asic-only", "match": {}, "pools": ["asic"], "fallback": "gpu"}]
    policy = fleet_policy(routes=routes, asic_extra={"queue_depth": 0})
    fleet = Fleet(policy)
    fill(fleet, "asic")
    decision = decide(profile(), policy, fleet)
    assert decision.backend is not None and decision.backend.pool == "gpu"


def test_refuses_with_no_capacity_when_nothing_can_take_or_queue() -> None:
    policy = fleet_policy(asic_extra={"queue_depth": 0}, gpu_extra={"queue_depth": 0})
    fleet = Fleet(policy)
    fill(fleet, "asic")
    fill(fleet, "gpu")
    with pytest.raises(NoCapacity):
        decide(profile(), policy, fleet)


def test_never_queues_when_the_class_allows_no_wait() -> None:
    policy = fleet_policy(interactive={"max_queue_ms": 0})
    fleet = Fleet(policy)
    fill(fleet, "asic")
    fill(fleet, "gpu")
    with pytest.raises(NoCapacity):
        decide(profile(), policy, fleet)


def test_unknown_model_is_not_found() -> None:
    policy = fleet_policy()
    with pytest.raises(ModelNotFound, match="gpt-nope"):
        decide(profile(model="gpt-nope"), policy, Fleet(policy))


def test_model_served_only_by_shadow_pools_is_not_found() -> None:
    policy = fleet_policy()
    assert "cim" not in str(policy.served_models())
    with pytest.raises(ModelNotFound):
        decide(profile(model="cim-only"), policy, Fleet(policy))


def test_prompt_over_every_context_is_refused() -> None:
    policy = fleet_policy()
    with pytest.raises(ContextTooLong):
        decide(profile(prompt=200_000), policy, Fleet(policy))


def test_a_prompt_the_estimate_puts_just_over_every_context_is_left_to_the_engine() -> None:
    # The estimate may read a fifth high: 135,000 estimated tokens may be 108,000, which the
    # GPU's 131,072 hold, so the engine counts (and refuses, sending it on, if not); 170,000
    # overflow it even a fifth fewer.
    policy = fleet_policy()
    decision = decide(profile(prompt=135_000), policy, Fleet(policy))
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert pick_backend(profile(prompt=135_000), decision.route, policy, Fleet(policy))
    with pytest.raises(ContextTooLong, match="~170000 prompt tokens plus 100 output tokens"):
        decide(profile(prompt=170_000), policy, Fleet(policy))


def test_every_backend_ejected_is_unavailable() -> None:
    policy = fleet_policy()
    fleet = Fleet(policy)
    for backend in fleet.backends():
        backend.ejected = True
    with pytest.raises(NoHealthyBackend):
        decide(profile(model=EMBED, max_tokens=None), policy, fleet)


def test_tenant_routes_deny_other_tenants() -> None:
    routes = [{"name": "team-a", "match": {"tenants": ["a"]}, "pools": ["gpu"]}]
    policy = fleet_policy(routes=routes, tenants=[{"name": "a"}])
    assert decide(profile(tenant="a"), policy, Fleet(policy)).route.name == "team-a"
    with pytest.raises(RouteDenied):
        decide(profile(tenant="b"), policy, Fleet(policy))


def test_decision_is_a_pure_function_of_its_inputs() -> None:
    policy = fleet_policy()
    fleet = Fleet(policy)
    before = [(b.in_flight, b.ejected) for b in fleet.backends()]
    first = decide(profile(), policy, fleet)
    second = decide(profile(), policy, fleet)
    assert first.backend is second.backend and first.trace == second.trace
    assert [(b.in_flight, b.ejected) for b in fleet.backends()] == before


def test_retry_target_skips_the_failed_backend_and_reaches_the_fallback() -> None:
    routes = [{"name": "asic-only", "match": {}, "pools": ["asic"], "fallback": "gpu"}]
    policy = fleet_policy(routes=routes)
    fleet = Fleet(policy)
    route = policy.routes[0]
    assert pick_backend(profile(), route, policy, fleet).pool == "asic"  # type: ignore[union-attr]
    retry = pick_backend(profile(), route, policy, fleet, frozenset({"asic-0"}))
    assert retry is not None and retry.pool == "gpu"


def test_trace_explains_each_pool() -> None:
    policy = fleet_policy()
    fleet = Fleet(policy)
    fill(fleet, "asic")
    lines = decide(profile(), policy, fleet).explain()
    assert lines[0] == "asic: no free slot"
    assert lines[1].startswith("gpu: chosen: gpu-0 has 32 free slots")


def test_drops_pool_whose_kv_cache_cannot_hold_the_request() -> None:
    # 8B: 8 · 16 KiB of KV cache per token; 6,000 tokens need ~0.79 GB, over the ASIC's 0.5 GB.
    routes = [{"name": "all", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"]}]
    policy = fleet_policy(routes=routes, asic_extra={"kv_cache_gb": 0.5})
    decision = decide(profile(prompt=5900, max_tokens=100), policy, Fleet(policy))
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert any(p == "asic" and r.startswith("KV cache 0.8 GB > 0.5 GB") for p, r in decision.trace)
    assert decision.kv_bytes == 6000 * 8 * 16_384


def test_skips_backends_whose_kv_memory_is_taken() -> None:
    policy = fleet_policy(asic_extra={"kv_cache_gb": 1.0})
    fleet = Fleet(policy)
    fleet.pools["asic"].backends[0].kv_reserved = 0.99e9  # slots free, memory not
    decision = decide(profile(prompt=1000), policy, fleet)
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert ("asic", "no KV-cache memory free") in decision.trace


def test_request_too_big_for_every_pools_memory_is_refused() -> None:
    policy = fleet_policy(asic_extra={"kv_cache_gb": 0.1}, gpu_extra={"kv_cache_gb": 0.1})
    with pytest.raises(ContextTooLong, match="KV-cache memory"):
        decide(profile(prompt=2000, slo_class="batch", ttft_ms=None), policy, Fleet(policy))


def test_every_answer_a_request_asks_for_reserves_its_output() -> None:
    # n = 4 answers of up to 100 tokens share one 100-token prompt: 500 tokens of KV cache.
    policy = fleet_policy()
    decision = decide(profile(prompt=100, max_tokens=100, sequences=4), policy, Fleet(policy))
    assert decision.kv_bytes == 500 * policy.kv_bytes_per_token(MODEL)


def test_embeddings_reserve_no_output_tokens() -> None:
    policy = fleet_policy()
    decision = decide(
        profile(model=EMBED, endpoint="embeddings", prompt=100, max_tokens=None),
        policy,
        Fleet(policy),
    )
    assert decision.kv_bytes == 100 * policy.kv_bytes_per_token(EMBED)


def test_a_canary_serves_its_share_first_even_when_shadow_only() -> None:
    routes = [
        {
            "name": "chat",
            "match": {"models": [MODEL]},
            "pools": ["gpu"],
            "canary": {"pool": "cim", "weight": 0.25},
        }
    ]
    policy = fleet_policy(routes=routes)  # cim is live: false in the test fleet
    fleet = Fleet(policy)
    inside = decide(profile(prompt=100), policy, fleet, draw=0.1)
    outside = decide(profile(prompt=100), policy, fleet, draw=0.5)
    assert inside.backend is not None and inside.backend.pool == "cim"
    assert ("cim", "canary (25%): tried first") in inside.trace
    assert outside.backend is not None and outside.backend.pool == "gpu"


def test_a_full_canary_gives_way_to_the_routes_pools() -> None:
    routes = [
        {"name": "chat", "match": {}, "pools": ["gpu"], "canary": {"pool": "asic", "weight": 1.0}}
    ]
    policy = fleet_policy(routes=routes)
    fleet = Fleet(policy)
    fill(fleet, "asic")
    decision = decide(profile(), policy, fleet, draw=0.0)
    assert decision.backend is not None and decision.backend.pool == "gpu"


def test_a_route_that_explores_sends_its_share_to_the_runner_up() -> None:
    routes = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"],
               "fallback": "gpu", "explore": 0.1}]  # fmt: skip
    policy = fleet_policy(routes=routes)
    fleet = Fleet(policy)
    draws = [i / 1000 for i in range(1000)]
    pools = [decide(profile(), policy, fleet, draw=d).backend.pool for d in draws]  # type: ignore[union-attr]
    explored = pools.count("gpu") / len(pools)
    assert 0.08 < explored < 0.12  # a tenth, spread over the draws
    # The same draw always decides the same way, and the default draw never explores.
    assert [decide(profile(), policy, fleet, draw=d).backend.pool for d in draws] == pools  # type: ignore[union-attr]
    assert decide(profile(), policy, fleet).backend.pool == "asic"  # type: ignore[union-attr]
    still = fleet_policy(routes=[dict(routes[0], explore=0.0)])
    assert {decide(profile(), still, Fleet(still), draw=d).backend.pool for d in draws} == {"asic"}  # type: ignore[union-attr]


def test_a_named_session_never_outbids_a_canary() -> None:
    routes = [
        {"name": "chat", "match": {}, "pools": ["gpu"], "canary": {"pool": "asic", "weight": 1.0}}
    ]
    policy = fleet_policy(routes=routes)
    fleet = Fleet(policy)
    gpu = fleet.pools["gpu"].backends[0].name
    fleet.sessions.served("anonymous/agent", gpu)
    named = profile(blocks=(1, 2, 3), block_tokens=64.0, session="anonymous/agent")
    decision = decide(named, policy, fleet, draw=0.0)
    assert decision.backend is not None and decision.backend.pool == "asic"
