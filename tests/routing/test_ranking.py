from __future__ import annotations

from gateway.costmodel.predict import CostModel, OutputLengths
from gateway.fleet.state import Fleet
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import CostRanker
from gateway.routing.router import decide
from policies import MODEL, fleet_policy

ROUTES = [
    {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": ["gpu", "asic"],
        "fallback": "gpu",
        "objective": "min_energy",
    }
]


def profile(**kw: object) -> RequestProfile:
    fields = {
        "endpoint": "chat",
        "model": MODEL,
        "prompt_tokens": 200,
        "max_tokens": 100,
        "slo_class": "interactive",
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "e2e_ms": None,
        "tenant": "anonymous",
        "stream": True,
    }
    fields.update(kw)
    return RequestProfile(**fields)  # type: ignore[arg-type]


def world(objective: str = "min_energy", explore: float = 0.0, **policy_kw: object):
    routes = [dict(ROUTES[0], objective=objective, explore=explore)]
    policy = fleet_policy(
        routes=routes,
        asic_extra={
            "power": {"idle_w": 25, "max_w": 150},
            "compute_tflops": 400,
            "bandwidth_gbs": 1200,
            "precision": "int8",
        },
        **policy_kw,
    )
    fleet = Fleet(policy)
    ranker = CostRanker(lambda: CostModel(policy), OutputLengths())
    return policy, fleet, ranker


def test_min_energy_prefers_the_efficient_pool_over_the_listed_order() -> None:
    policy, fleet, ranker = world("min_energy")
    decision = decide(profile(), policy, fleet, ranker)
    assert decision.backend is not None and decision.backend.pool == "asic"
    asic, gpu = decision.predictions["asic"], decision.predictions["gpu"]
    assert asic.marginal_energy_j < gpu.marginal_energy_j


def test_preference_keeps_the_listed_order_but_still_predicts() -> None:
    policy, fleet, ranker = world("preference")
    decision = decide(profile(), policy, fleet, ranker)
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert set(decision.predictions) == {"gpu", "asic"}


def test_min_latency_prefers_the_faster_pool() -> None:
    policy, fleet, ranker = world("min_latency")
    decision = decide(profile(prompt_tokens=3000), policy, fleet, ranker)
    p = decision.predictions
    chosen = decision.backend.pool  # type: ignore[union-attr]
    assert p[chosen].e2e_s == min(x.e2e_s for x in p.values())


def test_pool_predicted_to_miss_the_slo_is_dropped() -> None:
    policy, fleet, ranker = world("min_energy")
    asic_ttft = decide(profile(), policy, fleet, ranker).predictions["asic"].ttft_upper_s
    gpu_ttft = decide(profile(), policy, fleet, ranker).predictions["gpu"].ttft_upper_s
    assert gpu_ttft < asic_ttft
    tight = (gpu_ttft + asic_ttft) / 2 * 1000
    decision = decide(profile(ttft_ms=tight), policy, fleet, ranker)
    assert decision.backend is not None and decision.backend.pool == "gpu"
    assert any("predicted to miss the SLO" in r for _, r in decision.trace)
    assert not decision.slo_unmeetable


def test_exploring_reaches_a_pool_predicted_to_miss_the_slo_when_it_is_the_only_other() -> None:
    """A pool dropped as slow is seen to recover only through what is sent to it: the route's
    explore share goes there, and the rest stays on the pool predicted to meet the SLO."""
    policy, fleet, ranker = world("min_energy")
    predicted = decide(profile(), policy, fleet, ranker).predictions
    tight = (predicted["gpu"].ttft_upper_s + predicted["asic"].ttft_upper_s) / 2 * 1000
    policy, fleet, ranker = world("min_energy", explore=0.1)
    draws = [i / 1000 for i in range(1000)]
    decisions = [decide(profile(ttft_ms=tight), policy, fleet, ranker, draw=d) for d in draws]
    pools = [d.backend.pool for d in decisions if d.backend is not None]
    assert len(pools) == len(draws)
    assert 0.08 < pools.count("asic") / len(pools) < 0.12  # a tenth, spread over the draws
    explored = next(d for d in decisions if d.backend is not None and d.backend.pool == "asic")
    assert ("asic", "explored: 10% of requests keep its figures fresh") in explored.trace
    assert any("predicted to miss the SLO" in r for p, r in explored.trace if p == "asic")


def test_when_no_pool_meets_the_slo_the_fastest_serves_and_it_is_flagged() -> None:
    policy, fleet, ranker = world("min_energy")
    decision = decide(profile(ttft_ms=0.5), policy, fleet, ranker)
    assert decision.slo_unmeetable
    p = decision.predictions
    assert decision.backend is not None
    assert p[decision.backend.pool].e2e_upper_s == min(x.e2e_upper_s for x in p.values())


def test_load_raises_the_prediction() -> None:
    policy, fleet, ranker = world("min_energy")
    idle = decide(profile(), policy, fleet, ranker).predictions["gpu"]
    for backend in fleet.pools["gpu"].backends:
        backend.in_flight = 24
    busy = decide(profile(), policy, fleet, ranker).predictions["gpu"]
    assert busy.tpot_s > idle.tpot_s
    # A warm, busy device is cheaper at the margin per request: idle draw is already paid.
    assert busy.marginal_energy_j / busy.energy_j > 0


def test_output_length_follows_the_routes_history() -> None:
    outputs = OutputLengths(default=256)
    assert outputs.expect("chat", None) == 256
    assert outputs.expect("chat", 50) == 50
    for n in (10, 20, 30):
        outputs.observe("chat", n)
    assert outputs.expect("chat", None) == 20
    assert outputs.expect("chat", 15) == 15


def test_output_length_window_forgets_old_lengths() -> None:
    outputs = OutputLengths(default=256, window=3)
    for n in (1000, 10, 20, 30):
        outputs.observe("chat", n)
    assert outputs.expect("chat", None) == 20


def test_other_clients_requests_on_a_backend_count_in_its_predicted_load() -> None:
    """A backend shared with other clients decodes in a larger batch than ours alone."""
    _, fleet, ranker = world("min_latency")
    gpu = fleet.pools["gpu"]
    alone = ranker.predict(profile(), "chat", gpu)
    gpu.backends[0].external = 20  # its engine reports 20 requests the gateway did not send
    shared = ranker.predict(profile(), "chat", gpu)
    assert (alone.concurrent, shared.concurrent) == (1, 21)
    assert shared.tpot_s > alone.tpot_s
    assert shared.marginal_energy_j < alone.marginal_energy_j  # a warm batch is cheap at the margin


def test_ranked_on_a_newer_versions_model_it_takes_a_backend_with_room_for_its_own_share() -> None:
    """A request that read the policy before a reload is ranked on the new version's cost
    model; it still goes to a backend with room for the KV cache its own version books."""
    routes = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}]
    urls = ("http://127.0.0.1:1", "http://127.0.0.1:4")
    policy = fleet_policy(gpu=urls, routes=routes)
    # The new version books a tenth of the KV cache per token of the 8B model.
    newer = fleet_policy(
        gpu=urls, routes=routes, models={MODEL: {"params_b": 8, "kv_bytes_per_token": 13_107}}
    )
    fleet = Fleet(policy)
    roomy, tight = fleet.pools["gpu"].backends
    roomy.in_flight = 4  # fewer free slots, but KV memory to spare
    request = profile(prompt_tokens=1000, max_tokens=100)
    share = 1100 * policy.kv_bytes_per_token(MODEL)
    tight.kv_reserved = tight.kv_capacity - share / 2  # room for the newer booking, not ours
    ranker = CostRanker(lambda: CostModel(newer), OutputLengths())
    decision = decide(request, policy, fleet, ranker)
    assert decision.backend is roomy
    assert decision.kv_bytes == share
